package checksum

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// counting is a file child that counts the writes landing in table blocks.
type counting struct {
	*block.File
	data, tables atomic.Int64
}

func (c *counting) WriteAt(p []byte, off int64, fua bool) error {
	if DataSize(off+1) == DataSize(off) { // off lies in a table area
		c.tables.Add(1)
	} else {
		c.data.Add(1)
	}
	return c.File.WriteAt(p, off, fua)
}

func (c *counting) Describe() block.Node { return block.Node{Type: "counting", State: block.StateOK} }

// openCounting opens a checksum layer of size bytes over a counting file
// child in dir (created when create).
func openCounting(t *testing.T, dir string, size int64, create bool) (*Layer, *counting) {
	t.Helper()
	return over(t, dir, size, create, func(f *block.File) *counting { return &counting{File: f} })
}

// TestTablesWrittenBack (I5): a write without FUA costs one child write —
// its table waits in memory until Flush — yet reads verify against it at
// once, scrub finds nothing wrong, a FUA write and a full dirty set write
// tables through, and a crash before the flush loses nothing written.
func TestTablesWrittenBack(t *testing.T) {
	dir := t.TempDir()
	const groups = dirtyMax + 4
	size := int64(groups * GroupData)
	l, c := openCounting(t, dir, size, true)
	img := filepath.Join(dir, "a.img")
	model := map[int64][]byte{}
	write := func(off int64, seed uint64, fua bool) {
		t.Helper()
		p := random(seed, BlockSize)
		must(t, l.WriteAt(p, off, fua))
		model[off] = p
	}
	check := func(l *Layer, what string) {
		t.Helper()
		for off, want := range model {
			got := make([]byte, len(want))
			if err := l.ReadAt(got, off); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s: block at %d: equal %v, err %v", what, off, bytes.Equal(got, want), err)
			}
		}
	}

	// Two writes into each of the first groups: data only.
	for g := range int64(8) {
		write(g*GroupData, uint64(g), false)
		write(g*GroupData+7*BlockSize, uint64(100+g), false)
	}
	if n, m := c.data.Load(), c.tables.Load(); n != 16 || m != 0 {
		t.Fatalf("16 writes made %d data and %d table writes in the child; want 16 and 0", n, m)
	}
	if raw := rawRead(t, img, BlockSize, tableOff(0)); !bytes.Equal(raw, zeroBlock[:]) {
		t.Fatal("group 0's table reached the child before a flush")
	}
	check(l, "before flush")

	// A FUA write stores its group's table at once (with the entries the
	// group already had in memory).
	write(3*GroupData+BlockSize, 7, true)
	if m := c.tables.Load(); m != 1 {
		t.Fatalf("a FUA write made %d table writes; want 1", m)
	}
	if e := decodeTable(rawRead(t, img, BlockSize, tableOff(3))); e[0] != entryOf(model[3*GroupData]) || e[1] != entryOf(model[3*GroupData+BlockSize]) {
		t.Fatal("the FUA write's table in the child lacks the group's entries")
	}

	// Scrub reads the child: it writes back what it covers first.
	rep, err := l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 0 {
		t.Fatalf("scrub with tables in memory: %+v, %v", rep, err)
	}
	if e := decodeTable(rawRead(t, img, BlockSize, tableOff(5))); e[7] != entryOf(model[5*GroupData+7*BlockSize]) {
		t.Fatal("scrub left group 5's table unwritten")
	}

	// Writes into more groups than the dirty set holds: those beyond it
	// write their tables through.
	before := c.tables.Load()
	for g := range int64(groups) {
		write(g*GroupData+2*BlockSize, uint64(1000+g), false)
	}
	if m := c.tables.Load() - before; m != groups-dirtyMax {
		t.Fatalf("%d writes into %d groups with room for %d dirty tables made %d table writes; want %d",
			groups, groups, dirtyMax, m, groups-dirtyMax)
	}
	check(l, "with a full dirty set")

	// Flush writes every dirty table; after a crash nothing is in flux.
	must(t, l.Flush())
	for g := range int64(groups) {
		e := decodeTable(rawRead(t, img, BlockSize, tableOff(g)))
		if e[2] != entryOf(model[g*GroupData+2*BlockSize]) {
			t.Fatalf("group %d's table not in the child after Flush", g)
		}
	}
	write(9*GroupData+5*BlockSize, 9, false)
	crash(l)
	l, _ = openCounting(t, dir, size, false)
	defer l.Close()
	if s := l.Stats(); s.Reconciled != 1 {
		t.Fatalf("groups reconciled after a crash: %d, want 1 (the one written since the flush)", s.Reconciled)
	}
	check(l, "after a crash")
	rep, err = l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 0 {
		t.Fatalf("scrub after the crash: %+v, %v", rep, err)
	}
}

// TestResizeWritesTablesBack: Resize flushes the child and takes the
// groups it changed out of flux, so the entries those groups held in
// memory must reach the child first: after a crash right after the
// resize, the write before it reads back.
func TestResizeWritesTablesBack(t *testing.T) {
	dir := t.TempDir()
	size := int64(GroupData + 5000) // a partial last group, which Resize changes
	l, _ := openCounting(t, dir, size, true)
	p := random(3, BlockSize)
	at := int64(GroupData)
	must(t, l.WriteAt(p, at, false))
	must(t, l.Resize(3*GroupData))
	got := make([]byte, BlockSize)
	must(t, l.ReadAt(got, at))
	if !bytes.Equal(got, p) {
		t.Fatal("a write before the resize reads back different")
	}
	crash(l)
	l, _ = openCounting(t, dir, 0, false)
	defer l.Close()
	if s := l.Stats(); s.Reconciled != 0 {
		t.Fatalf("in flux after the resize: %+v", s)
	}
	if err := l.ReadAt(got, at); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("a write before the resize, after a crash: equal %v, err %v", bytes.Equal(got, p), err)
	}
}

// lossy is a file child that acknowledges one write without storing it (a
// lost write: the fault the checksum layer exists to see).
type lossy struct {
	*block.File
	dropAt atomic.Int64 // child offset of the write to drop; -1: none
}

func (c *lossy) WriteAt(p []byte, off int64, fua bool) error {
	if c.dropAt.CompareAndSwap(off, -1) {
		return nil
	}
	return c.File.WriteAt(p, off, fua)
}

func (c *lossy) Describe() block.Node { return block.Node{Type: "lossy", State: block.StateOK} }

// TestLostWriteIsCorrupt: a write whose data the child lost reads back as
// corrupt — never as the block's previous contents — while its entry is
// only in memory (I5: the child's table still holds the previous entry,
// which must not be taken for a good version), whether the block was
// written and flushed before or never; a partial write into it refuses
// too; and a Flush does not make the previous contents valid.
func TestLostWriteIsCorrupt(t *testing.T) {
	for _, flushed := range []bool{false, true} {
		for _, fresh := range []bool{false, true} {
			t.Run(fmt.Sprintf("flushed=%v/fresh=%v", flushed, fresh), func(t *testing.T) {
				l, c := over(t, t.TempDir(), GroupData, true, func(f *block.File) *lossy {
					x := &lossy{File: f}
					x.dropAt.Store(-1)
					return x
				})
				defer l.Close()
				if !fresh {
					must(t, l.WriteAt(random(1, 2*BlockSize), 3*BlockSize, false))
				}
				if flushed {
					must(t, l.Flush()) // the previous entries are in the child's table
				}
				c.dropAt.Store(dataOff(3 * BlockSize))
				must(t, l.WriteAt(random(2, BlockSize), 3*BlockSize, false)) // lost
				c.dropAt.Store(dataOff(4 * BlockSize))
				must(t, l.WriteAt(random(3, BlockSize), 4*BlockSize, false)) // lost
				if err := l.WriteAt([]byte("x"), 4*BlockSize+5, false); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("partial write into a block whose last write was lost: %v", err)
				}
				got := make([]byte, BlockSize)
				if err := l.ReadAt(got, 3*BlockSize); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("read of a block whose last write was lost: %v", err)
				}
				must(t, l.Flush())
				if err := l.ReadAt(got, 3*BlockSize); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("after a flush, read of a block whose last write was lost: %v", err)
				}
			})
		}
	}
}

// TestFlushSettlesStaleGroups: a group a failed write left stale is
// reconciled by the next Flush, not only by its next use, so that after
// a Flush the child's tables match its data everywhere — what a snapshot
// of the child (cow below) and its clones, which open with nothing in
// flux, rely on.
func TestFlushSettlesStaleGroups(t *testing.T) {
	dir := t.TempDir()
	l, c := over(t, dir, 2*GroupData, true, func(f *block.File) *flaky { return &flaky{File: f} })
	defer l.Close()
	must(t, l.WriteAt(random(1, 64<<10), GroupData, false))
	must(t, l.Flush())
	c.fail.Store(true)
	if err := l.WriteAt(random(2, 64<<10), GroupData, false); err == nil {
		t.Fatal("injected failure not reported")
	}
	c.fail.Store(false)
	must(t, l.Flush())
	img := filepath.Join(dir, "a.img")
	tab := decodeTable(rawRead(t, img, BlockSize, tableOff(1)))
	for b := range int64(16) {
		data := rawRead(t, img, BlockSize, dataOff(GroupData+b*BlockSize))
		if tab[b] != entryOf(data) {
			t.Fatalf("after a flush, block %d of the group a failed write left stale does not match its entry in the child", b)
		}
	}
}
