package checksum

import (
	"bytes"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// filling is a child on a file system that fills up: while full is set,
// a write lands half its bytes (the space there was) and fails with
// ENOSPC, and a flush fails too — ext4 reports a delayed allocation's
// ENOSPC at fsync.
type filling struct {
	*block.File
	full atomic.Bool
}

func (f *filling) WriteAt(p []byte, off int64, fua bool) error {
	if f.full.Load() {
		f.File.WriteAt(p[:len(p)/2], off, false)
		return syscall.ENOSPC
	}
	return f.File.WriteAt(p, off, fua)
}

func (f *filling) Flush() error {
	if f.full.Load() {
		return syscall.ENOSPC
	}
	return f.File.Flush()
}

func (f *filling) Describe() block.Node { return block.Node{Type: "filling", State: block.StateOK} }

// TestOpenOverAFullChild: a volume whose store filled up while a group was
// in flux must open again while the store is still full — every byte
// readable, writes refused with the file system's error — rather than be
// unavailable until someone frees space: reconciling the group needs a
// table write the child refuses, so the reconciled table stays in memory
// and the group in flux until a Flush can write it. Once space is back,
// a Flush settles it, and the next open finds nothing in flux.
func TestOpenOverAFullChild(t *testing.T) {
	dir := t.TempDir()
	open := func(create, full bool) (*Layer, *filling) {
		return over(t, dir, GroupData, create, func(f *block.File) *filling {
			c := &filling{File: f}
			c.full.Store(full)
			return c
		})
	}
	l, c := open(true, false)
	old := random(61, 64<<10)
	must(t, l.WriteAt(old, 0, false))
	must(t, l.Flush())
	c.full.Store(true)
	if err := l.WriteAt(random(62, 64<<10), 0, false); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write into a full child: %v", err)
	}
	if err := l.Close(); err == nil {
		t.Fatal("close over a full child flushed nothing, and said nothing")
	}

	l, c = open(false, true)
	got := make([]byte, 64<<10)
	if err := l.ReadAt(got, 0); err != nil {
		t.Fatalf("read over a full child: %v", err)
	}
	if !bytes.Equal(got[32<<10:], old[32<<10:]) {
		t.Fatal("bytes the failed write never reached changed")
	}
	if err := l.WriteAt(random(63, BlockSize), 128<<10, false); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write into a full child after reopening: %v", err)
	}
	if err := l.Flush(); err == nil {
		t.Fatal("flush over a full child succeeded")
	}

	c.full.Store(false)
	must(t, l.Flush())
	after := make([]byte, 64<<10)
	must(t, l.ReadAt(after, 0))
	must(t, l.Close())
	l, _ = open(false, false)
	defer l.Close()
	if s := l.Stats(); s.Reconciled != 0 {
		t.Fatalf("in flux after a flush with space back: %+v", s)
	}
	again := make([]byte, 64<<10)
	must(t, l.ReadAt(again, 0))
	if !bytes.Equal(again, after) {
		t.Fatal("contents changed across reopen")
	}
}
