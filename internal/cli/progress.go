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
	fmt.Fprintf(b.w, "\r%s [%s%s] %5.1f%% ", p.Job, strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.Percent)
	b.drawn = true
}

func (b *progressBar) done() {
	if b.drawn {
		fmt.Fprintln(b.w)
	}
}
