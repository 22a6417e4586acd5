package checksum

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// TestFailedWriteKeepsOtherCorruption: a write that fails leaves its group
// stale, and reconciling it (at the next use of the group, or the next
// Flush) accepts what that write may have landed — but only that: a block
// of the same group that was already corrupt, and reported so, must stay
// corrupt, not be laundered into one that verifies.
func TestFailedWriteKeepsOtherCorruption(t *testing.T) {
	for _, settle := range []string{"read", "flush", "write"} {
		t.Run(settle, func(t *testing.T) {
			dir := t.TempDir()
			l, c := over(t, dir, GroupData, true, func(f *block.File) *flaky { return &flaky{File: f} })
			defer l.Close()
			data := random(40, 64<<10)
			must(t, l.WriteAt(data, 0, false))
			must(t, l.Flush())
			flip(t, filepath.Join(dir, "a.img"), dataOff(5*BlockSize)+7)
			got := make([]byte, BlockSize)
			if err := l.ReadAt(got, 5*BlockSize); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("read of a flipped block: %v", err)
			}
			c.fail.Store(true)
			if err := l.WriteAt(random(41, 2*BlockSize), 9*BlockSize, false); err == nil {
				t.Fatal("injected failure not reported")
			}
			c.fail.Store(false)
			switch settle {
			case "read": // the failed write's blocks read as whatever landed
				must(t, l.ReadAt(make([]byte, 2*BlockSize), 9*BlockSize))
			case "flush":
				must(t, l.Flush())
			case "write":
				must(t, l.WriteAt(random(42, 100), 20*BlockSize+10, false))
			}
			err := l.ReadAt(got, 5*BlockSize)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("a corrupt block read after a failed write into its group: err %v, equal to the data written %v",
					err, bytes.Equal(got, data[5*BlockSize:6*BlockSize]))
			}
			must(t, l.Flush())
			if err := l.ReadAt(got, 5*BlockSize); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("after a flush, a corrupt block read after a failed write into its group: %v", err)
			}
		})
	}
}

// TestResizeKeepsOldCorruption: growing a volume whose last group is
// partial, over a child that cannot zero (so the new range is reconciled
// instead), must not launder a corrupt block of that group's old part.
func TestResizeKeepsOldCorruption(t *testing.T) {
	dir := t.TempDir()
	size := int64(GroupData/2 + 1000)
	l, _ := over(t, dir, size, true, func(f *block.File) *lacking { return &lacking{File: f, noZero: true} })
	defer l.Close()
	data := random(43, size)
	must(t, l.WriteAt(data, 0, false))
	must(t, l.Flush())
	flip(t, filepath.Join(dir, "a.img"), dataOff(5*BlockSize)+7)
	got := make([]byte, BlockSize)
	if err := l.ReadAt(got, 5*BlockSize); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a flipped block: %v", err)
	}
	must(t, l.Resize(2*GroupData))
	if err := l.ReadAt(got, 5*BlockSize); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a corrupt block read after a resize: %v", err)
	}
	// The rest, old and new, reads as before.
	want := append(append([]byte(nil), data...), make([]byte, 2*GroupData-size)...)
	clear(want[5*BlockSize : 6*BlockSize])
	for b := int64(0); b < 2*GroupData/BlockSize; b++ {
		if b == 5 {
			continue
		}
		must(t, l.ReadAt(got, b*BlockSize))
		if !bytes.Equal(got, want[b*BlockSize:(b+1)*BlockSize]) {
			t.Fatalf("block %d differs after a resize", b)
		}
	}
}

// lacking is a file child that declares no FUA (noFUA), no Flush
// (noFlush) or no write-zeroes (noZero) and, as the block.Device contract
// says, refuses what it does not declare with block.ErrNotSupported.
type lacking struct {
	*block.File
	noFUA, noFlush, noZero bool
}

func (c *lacking) Capabilities() block.Capabilities {
	cc := c.File.Capabilities()
	cc.FUA = cc.FUA && !c.noFUA
	cc.Flush = cc.Flush && !c.noFlush
	cc.WriteZeroes = cc.WriteZeroes && !c.noZero
	cc.FastZero = cc.FastZero && !c.noZero
	return cc
}

func (c *lacking) WriteAt(p []byte, off int64, fua bool) error {
	if fua && c.noFUA {
		return block.ErrNotSupported
	}
	return c.File.WriteAt(p, off, fua)
}

func (c *lacking) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if f.FUA && c.noFUA || c.noZero {
		return block.ErrNotSupported
	}
	return c.File.WriteZeroes(off, n, f)
}

func (c *lacking) Trim(off, n int64, fua bool) error {
	if fua && c.noFUA {
		return block.ErrNotSupported
	}
	return c.File.Trim(off, n, fua)
}

func (c *lacking) Flush() error {
	if c.noFlush {
		return block.ErrNotSupported
	}
	return c.File.Flush()
}

func (c *lacking) Describe() block.Node { return block.Node{Type: "lacking", State: block.StateOK} }

// TestFUAOverAChildWithoutFUA: over a child with Flush but no FUA the
// layer offers FUA by flushing; that holds for write-zeroes and trims
// with FUA too, not only for writes.
func TestFUAOverAChildWithoutFUA(t *testing.T) {
	dir := t.TempDir()
	l, _ := over(t, dir, GroupData, true, func(f *block.File) *lacking { return &lacking{File: f, noFUA: true} })
	defer l.Close()
	if !l.Capabilities().FUA {
		t.Fatal("no FUA over a child that can flush")
	}
	model := random(50, 64<<10)
	must(t, l.WriteAt(model, 0, true))
	if err := l.WriteZeroes(4096+100, 3*BlockSize, block.ZeroFlags{FUA: true}); err != nil {
		t.Fatalf("write-zeroes with FUA: %v", err)
	}
	clear(model[4096+100 : 4096+100+3*BlockSize])
	if err := l.Trim(8*BlockSize, 2*BlockSize, true); err != nil {
		t.Fatalf("trim with FUA: %v", err)
	}
	clear(model[8*BlockSize : 10*BlockSize])
	got := make([]byte, len(model))
	must(t, l.ReadAt(got, 0))
	if !bytes.Equal(got, model) {
		t.Fatal("contents differ")
	}
}

// TestReopenOverAChildWithoutFlush: over a child that cannot flush,
// groups stay in flux (nothing is known durable but FUA writes), and the
// layer must still open again: reconciling them must not need a flush.
func TestReopenOverAChildWithoutFlush(t *testing.T) {
	dir := t.TempDir()
	open := func(create bool) (*Layer, error) {
		path := filepath.Join(dir, "a.img")
		if create {
			f, err := os.Create(path)
			must(t, err)
			must(t, f.Truncate(ChildSize(GroupData)))
			f.Close()
		}
		bf, err := block.OpenFile(path, false)
		must(t, err)
		l, err := New(block.Env{Dir: dir, Size: GroupData, Create: create}, nil, []block.Layer{&lacking{File: bf, noFlush: true}})
		if err != nil {
			bf.Close()
			return nil, err
		}
		return l.(*Layer), nil
	}
	l, err := open(true)
	must(t, err)
	data := random(51, 64<<10)
	must(t, l.WriteAt(data, 0, true))
	must(t, l.Close())
	for i := range 2 {
		l, err = open(false)
		if err != nil {
			t.Fatalf("reopen %d over a child without flush: %v", i, err)
		}
		got := make([]byte, len(data))
		must(t, l.ReadAt(got, 0))
		if !bytes.Equal(got, data) {
			t.Fatal("contents differ after reopen")
		}
		must(t, l.Close())
	}
}
