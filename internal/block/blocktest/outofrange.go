package blocktest

import (
	"errors"
	"math"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/block"
)

// outOfRange asks l for ranges that reach beyond its end (straddling it,
// just past it, far past it, negative, and one whose end overflows
// int64): every operation refuses each with block.ErrOutOfRange and moves
// no byte — no read, no write of the part inside, no growth. Callers
// check the contents against their model afterwards; this checks the size.
//
// The NBD server checks ranges before a layer sees them, but a layer's
// own callers (copies, jobs, the layers above it) are code too: one bad
// offset must come back as an error, not panic the whole server or
// write past the end into space no read returns.
func outOfRange(t *testing.T, l block.Device, caps block.Capabilities) {
	t.Helper()
	size := l.Size()
	splicer, splices := l.(block.Splicer)
	spliceW, splicesW := l.(block.SpliceWriter)
	nowait, tryable := l.(block.NoWaitReader)
	copier, copies := l.(block.FileCopier)
	var scratch *os.File
	if copies {
		var err error
		if scratch, err = os.CreateTemp(t.TempDir(), "copy"); err != nil {
			t.Fatal(err)
		}
		defer scratch.Close()
	}
	var pipe [2]int
	if splices || splicesW {
		pipe = Pipe(t)
	}
	for _, r := range [][2]int64{
		{size - 4096, 8192},
		{size, 4096},
		{size + 1<<20, 4096},
		{-4096, 4096},
		{math.MaxInt64 - 4095, 4096},
	} {
		off, n := r[0], r[1]
		p := make([]byte, n)
		for i := range p {
			p[i] = 0xa5
		}
		refused := func(op string, err error) {
			t.Helper()
			if !errors.Is(err, block.ErrOutOfRange) {
				t.Errorf("%s %d+%d beyond %d: %v, want ErrOutOfRange", op, off, n, size, err)
			}
		}
		refused("read", l.ReadAt(p, off))
		if tryable && nowait.TryReadAt(p, off) {
			t.Errorf("TryReadAt %d+%d beyond %d answered", off, n, size)
		}
		if splices {
			if k := splicer.SpliceTo(pipe[1], off, int(n), false); k != 0 {
				t.Errorf("SpliceTo %d+%d beyond %d moved %d bytes", off, n, size, k)
				drainPipe(t, pipe[0])
			}
		}
		_, err := l.Extents(off, n)
		refused("extents", err)
		if copies {
			refused("copy out", copier.CopyToFile(scratch, off, n, &block.CopyReport{}))
		}
		if caps.ReadOnly {
			continue
		}
		refused("write", l.WriteAt(p, off, false))
		refused("FUA write", l.WriteAt(p, off, true))
		if caps.WriteZeroes {
			refused("zero", l.WriteZeroes(off, n, block.ZeroFlags{}))
			refused("zero (no hole)", l.WriteZeroes(off, n, block.ZeroFlags{NoHole: true}))
		}
		if caps.Trim {
			refused("trim", l.Trim(off, n, false))
		}
		if copies {
			refused("copy in", copier.CopyFromFile(scratch, off, n, &block.CopyReport{}))
		}
		if splicesW {
			if _, err := unix.Write(pipe[1], p); err != nil {
				t.Fatal(err)
			}
			if k := spliceW.SpliceFrom(pipe[0], off, int(n)); k != 0 {
				t.Errorf("SpliceFrom %d+%d beyond %d took %d bytes", off, n, size, k)
			}
			drainPipe(t, pipe[0])
		}
		if got := l.Size(); got != size {
			t.Fatalf("after requests at %d+%d the size is %d, was %d", off, n, got, size)
		}
	}
}

// drainPipe reads whatever the non-blocking pipe holds.
func drainPipe(t *testing.T, fd int) {
	t.Helper()
	buf := make([]byte, 64<<10)
	for {
		_, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
