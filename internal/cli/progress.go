package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/basalt-storage/basalt/internal/api"
)

// progressBar draws one self-overwriting line on a terminal (stderr).
type progressBar struct {
	w     io.Writer
	drawn bool
}

func newProgressBar(w io.Writer) *progressBar { return &progressBar{w: w} }

func (b *progressBar) draw(p *api.Progress) {
	if p == nil {
		return
	}
	const width = 30
	filled := int(p.Percent / 100 * width)
	filled = max(0, min(width, filled))
	fmt.Fprintf(b.w, "\r%s [%s%s] %5.1f%% ", jobName(p), strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.Percent)
	b.drawn = true
}

func (b *progressBar) done() {
	if b.drawn {
		fmt.Fprintln(b.w)
	}
}

// jobName is a job with its phase, if it has several: "export (copy)".
func jobName(p *api.Progress) string {
	if p.Phase == "" {
		return p.Job
	}
	return p.Job + " (" + p.Phase + ")"
}

// progressLine prints a running job in a show table.
func progressLine(w io.Writer, p *api.Progress) {
	if p == nil {
		return
	}
	fmt.Fprintf(w, "job:\t%s %.1f%%", jobName(p), p.Percent)
	if p.Object != "" {
		fmt.Fprintf(w, " (%s)", p.Object)
	}
	fmt.Fprintln(w)
}
