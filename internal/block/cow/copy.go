package cow

import (
	"fmt"
	"io"
	"os"

	"github.com/basalt-storage/basalt/internal/block"
)

// CopyToFile implements block.FileCopier: each run of chunks goes from the
// image that holds it (through that image's stack, so a file below moves
// it in the kernel); chunks no image holds are holes and are skipped.
func (l *Layer) CopyToFile(dst *os.File, off, n int64, r *block.CopyReport) error {
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	if err := l.inRange(off, n); err != nil {
		return err
	}
	for _, run := range l.runs(off, n, true) {
		if run.owner == 0 {
			continue
		}
		im := l.byDepth[run.owner]
		size := im.meta.Size
		if im == l.top {
			size = l.size
		}
		// Beyond a base's (pre-extend) size the chunk reads as zeroes.
		m := min(run.n, size-run.off)
		if m <= 0 {
			continue
		}
		if err := block.CopyRangeOut(im.dev, dst, run.off, m, r); err != nil {
			return fmt.Errorf("image %s: %w", im.meta.ID, err)
		}
	}
	return nil
}

// CopyFromFile implements block.FileCopier through the write path, so the
// chunks become the top's exactly as by WriteAt (ownership, allocation
// bits at the next Flush, copy-up of partial chunks a base holds); ranges
// that go straight to the top move file to file below it.
func (l *Layer) CopyFromFile(src *os.File, off, n int64, r *block.CopyReport) error {
	var readErr error
	err := l.write(off, n, false, func(run run, _ int64) error {
		return block.CopyRangeIn(l.top.dev, src, run.off, run.n, r)
	}, func(buf []byte, run run, _ int64) {
		piece := buf[run.off%l.chunk : run.off%l.chunk+run.n]
		k, err := src.ReadAt(piece, run.off)
		clear(piece[k:]) // beyond src's end: zeroes
		if err != nil && err != io.EOF && readErr == nil {
			readErr = fmt.Errorf("read %s at %d: %w", src.Name(), run.off, err)
		}
		r.DataBytes += run.n
		r.UserBytes += run.n
	})
	if err == nil {
		err = readErr
	}
	return err
}
