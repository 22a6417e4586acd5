package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/errs"
)

// pollInterval is how often --wait asks how a job is doing.
const pollInterval = 200 * time.Millisecond

// waiting is the context of a --wait. Ctrl-C (or SIGTERM) ends it: that
// stops the waiting, not the job, which runs on the server; the command
// then says so (waitFailed) instead of dying with its bar half drawn.
func waiting() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(ctx(), os.Interrupt, syscall.SIGTERM)
}

// pause sleeps for a poll interval; false if the wait was interrupted.
func pause(ctx context.Context) bool {
	t := time.NewTimer(pollInterval)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitFailed is the error that ended a wait for job (err, or nil for an
// interruption). The job goes on on the server whatever happened to the
// waiting, so the message says how to follow it (a NotFound means it is
// gone).
func waitFailed(ctx context.Context, err error, job, follow string) error {
	if ctx.Err() != nil {
		return errs.New(errs.KindInternal, CodeInterrupted, "interrupted: stopped waiting for the %s, which goes on; follow it with `%s`", job, follow)
	}
	e, ok := errs.As(err)
	if !ok || e.Code == errs.CodeNotFound {
		return err
	}
	return &errs.Error{Kind: e.Kind, Code: e.Code,
		Message: fmt.Sprintf("waiting for the %s: %s (the job itself goes on; follow it with `%s`)", job, e.Message, follow)}
}

// progressBar shows a running job on stderr. On a terminal it is one line
// redrawn in place. Into a file or a pipe (a log, a CI job) a redrawn bar
// piles up a copy at every poll, so there it prints a line when the job
// enters a phase and at each further tenth of it.
type progressBar struct {
	w    io.Writer
	tty  bool
	last *api.Progress // the progress shown last (printed, off a terminal)
}

func newProgressBar(w io.Writer) *progressBar { return &progressBar{w: w, tty: isTerminal(w)} }

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (b *progressBar) draw(p *api.Progress) {
	if p == nil {
		return
	}
	if !b.tty && b.last != nil && jobName(b.last) == jobName(p) && int(p.Percent/10) <= int(b.last.Percent/10) {
		return
	}
	b.show(p)
}

func (b *progressBar) show(p *api.Progress) {
	const width = 30
	filled := int(p.Percent / 100 * width)
	filled = max(0, min(width, filled))
	line := fmt.Sprintf("%s [%s%s] %5.1f%%", jobName(p), strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.Percent)
	if b.tty {
		fmt.Fprintf(b.w, "\r%s ", line)
	} else {
		fmt.Fprintln(b.w, line)
	}
	b.last = p
}

// finish ends the bar: at 100 % if the job succeeded (the last poll saw
// it short of that), and on a terminal with a newline, so that what
// follows, an error say, starts a line of its own.
func (b *progressBar) finish(ok bool) {
	if b.last == nil {
		return
	}
	if ok && b.last.Percent < 100 {
		p := *b.last
		p.Percent = 100
		b.show(&p)
	}
	if b.tty {
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

// followHint tells, on stderr, that job goes on after the command
// returned and how to follow it: a command that exits 0 with its work
// still running must not read as done. waitable: the command has a
// --wait that would have waited for it.
func followHint(g *globals, job, follow string, waitable bool) {
	also := ""
	if waitable {
		also = ", or give --wait next time"
	}
	fmt.Fprintf(g.stderr, "the %s goes on in the background; follow it with `%s`%s\n", job, follow, also)
}
