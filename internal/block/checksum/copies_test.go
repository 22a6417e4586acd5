package checksum

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// twoCopies is a minimal mirror for these tests: writes go to both
// files, plain reads to the preferred one, and it exposes each copy
// through block.Copies.
type twoCopies struct {
	legs   [2]*block.File
	prefer atomic.Int32
}

func (m *twoCopies) Size() int64 { return m.legs[0].Size() }
func (m *twoCopies) Capabilities() block.Capabilities {
	return m.legs[0].Capabilities()
}
func (m *twoCopies) ReadAt(p []byte, off int64) error {
	return m.legs[m.prefer.Load()].ReadAt(p, off)
}
func (m *twoCopies) both(fn func(*block.File) error) error {
	return errors.Join(fn(m.legs[0]), fn(m.legs[1]))
}
func (m *twoCopies) WriteAt(p []byte, off int64, fua bool) error {
	return m.both(func(f *block.File) error { return f.WriteAt(p, off, fua) })
}
func (m *twoCopies) WriteZeroes(off, n int64, z block.ZeroFlags) error {
	return m.both(func(f *block.File) error { return f.WriteZeroes(off, n, z) })
}
func (m *twoCopies) Trim(off, n int64, fua bool) error {
	return m.both(func(f *block.File) error { return f.Trim(off, n, fua) })
}
func (m *twoCopies) Flush() error { return m.both((*block.File).Flush) }
func (m *twoCopies) Extents(off, n int64) ([]block.Extent, error) {
	return m.legs[0].Extents(off, n)
}
func (m *twoCopies) Close() error         { return m.both((*block.File).Close) }
func (m *twoCopies) Describe() block.Node { return block.Node{Type: "twocopies", State: block.StateOK} }
func (m *twoCopies) NumCopies() int       { return 2 }
func (m *twoCopies) ReadCopy(i int, p []byte, off int64) error {
	return m.legs[i].ReadAt(p, off)
}
func (m *twoCopies) WriteCopy(i int, p []byte, off int64) error {
	return m.legs[i].WriteAt(p, off, false)
}

type mirrored struct {
	dir  string
	legs [2]string
	size int64
}

func newMirrored(t *testing.T, size int64) *mirrored {
	dir := t.TempDir()
	m := &mirrored{dir: dir, legs: [2]string{filepath.Join(dir, "0.img"), filepath.Join(dir, "1.img")}, size: size}
	for _, p := range m.legs {
		f, err := os.Create(p)
		must(t, err)
		must(t, f.Truncate(ChildSize(size)))
		f.Close()
	}
	return m
}

func (m *mirrored) open(t *testing.T, create bool, prefer int32) (*Layer, *twoCopies) {
	t.Helper()
	tc := &twoCopies{}
	for i, p := range m.legs {
		f, err := block.OpenFile(p, false)
		must(t, err)
		tc.legs[i] = f
	}
	tc.prefer.Store(prefer)
	l, err := New(block.Env{Dir: m.dir, Size: m.size, Create: create}, nil, []block.Layer{tc})
	must(t, err)
	return l.(*Layer), tc
}

func (m *mirrored) legsEqual(t *testing.T) bool {
	a, err := os.ReadFile(m.legs[0])
	must(t, err)
	b, err := os.ReadFile(m.legs[1])
	must(t, err)
	return bytes.Equal(a, b)
}

func TestRepairOnReadFromCopy(t *testing.T) {
	size := int64(GroupData + 40000)
	m := newMirrored(t, size)
	l, _ := m.open(t, true, 1)
	data := random(20, size)
	must(t, l.WriteAt(data, 0, false))
	must(t, l.Flush())

	// Copy 1, the one plain reads use, has a flipped data byte.
	flip(t, m.legs[1], dataOff(3*BlockSize)+100)
	got := make([]byte, 10)
	must(t, l.ReadAt(got, 3*BlockSize+95)) // an unaligned read of it
	if !bytes.Equal(got, data[3*BlockSize+95:3*BlockSize+105]) {
		t.Fatal("read did not return the good copy's data")
	}
	if s := l.Stats(); s.Repaired != 1 {
		t.Fatalf("stats: %+v", s)
	}
	if !m.legsEqual(t) {
		t.Fatal("the bad copy was not rewritten")
	}

	// Copy 0's table entry of block 1030 and copy 1's data of it are
	// flipped: no copy verifies on its own, but copy 0's data matches
	// copy 1's entry. Reopen so that nothing is cached.
	must(t, l.Close())
	flip(t, m.legs[0], tableOff(1)+4*6+1)
	flip(t, m.legs[1], dataOff(1030*BlockSize)+4000)
	l, tc := m.open(t, false, 0)
	got = make([]byte, 3*BlockSize)
	must(t, l.ReadAt(got, 1029*BlockSize))
	if !bytes.Equal(got, data[1029*BlockSize:1032*BlockSize]) {
		t.Fatal("cross-copy read returned wrong data")
	}
	// The table was loaded from both copies and the entry copy 0's data
	// matches chosen, so that read needed no repair; scrub does it.
	rep, err := l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 1 || rep.Repaired != 1 {
		t.Fatalf("scrub: %+v %v", rep, err)
	}
	if !m.legsEqual(t) {
		t.Fatal("cross-copy repair left the copies different")
	}
	// A partial write into a block bad in one copy repairs it first.
	flip(t, m.legs[0], dataOff(5*BlockSize))
	must(t, l.WriteAt([]byte("abc"), 5*BlockSize+10, true))
	copy(data[5*BlockSize+10:], "abc")
	tc.prefer.Store(1)
	if g := readAll(t, l); !bytes.Equal(g, data) {
		t.Fatal("contents differ")
	}
	if !m.legsEqual(t) {
		t.Fatal("copies differ")
	}
	if s := l.Stats(); s.Repaired != 2 {
		t.Fatalf("stats: %+v", s)
	}

	// Both copies bad: corrupt, and the layer says so.
	flip(t, m.legs[0], dataOff(7*BlockSize)+1)
	flip(t, m.legs[1], dataOff(7*BlockSize)+2)
	if err := l.ReadAt(got[:BlockSize], 7*BlockSize); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("both copies bad: %v", err)
	}
	if l.Describe().State != block.StateDegraded {
		t.Fatal("not degraded")
	}
	must(t, l.Close())
}

func TestScrubRepairsCopies(t *testing.T) {
	size := int64(2 * GroupData)
	m := newMirrored(t, size)
	l, _ := m.open(t, true, 0)
	data := random(21, size)
	must(t, l.WriteAt(data, 0, false))
	must(t, l.Flush())
	flip(t, m.legs[0], dataOff(7*BlockSize)+9)            // data, copy 0
	flip(t, m.legs[1], dataOff(GroupData+9*BlockSize)+1)  // data, copy 1
	flip(t, m.legs[1], tableOff(0)+4*11)                  // table, copy 1
	flip(t, m.legs[0], dataOff(13*BlockSize)+5)           // both copies:
	flip(t, m.legs[1], dataOff(13*BlockSize)+6)           // unrepairable
	flip(t, m.legs[0], dataOff(GroupData-BlockSize)+4095) // last block of a group

	rep, err := l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 5 || rep.Repaired != 4 || rep.Checked != size {
		t.Fatalf("scrub: %+v %v", rep, err)
	}
	if l.Describe().State != block.StateDegraded {
		t.Fatal("unrepaired block but not degraded")
	}
	// The copies now differ only in block 13.
	a, _ := os.ReadFile(m.legs[0])
	b, _ := os.ReadFile(m.legs[1])
	for off := range int64(len(a)) {
		if a[off] != b[off] && off/BlockSize != dataOff(13*BlockSize)/BlockSize {
			t.Fatalf("copies differ at child offset %d", off)
		}
	}
	rep, err = l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 1 || rep.Repaired != 0 {
		t.Fatalf("second scrub: %+v %v", rep, err)
	}
	// Rewriting the block heals it, and the layer is ok again.
	must(t, l.WriteAt(data[13*BlockSize:14*BlockSize], 13*BlockSize, false))
	if got := readAll(t, l); !bytes.Equal(got, data) {
		t.Fatal("contents differ")
	}
	if l.Describe().State != block.StateOK {
		t.Fatal("still degraded")
	}
	rep, err = l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 0 {
		t.Fatalf("third scrub: %+v %v", rep, err)
	}
	must(t, l.Close())
	if !m.legsEqual(t) {
		t.Fatal("copies differ at the end")
	}
}

// TestReconcilePrefersAVerifiedCopy: after a crash with a group in flux,
// a block whose copies disagree (a write landed on one leg only) is
// settled on a copy that verifies, and the copies are made equal.
func TestReconcilePrefersAVerifiedCopy(t *testing.T) {
	size := int64(GroupData)
	m := newMirrored(t, size)
	l, _ := m.open(t, true, 1)
	data := random(22, size)
	must(t, l.WriteAt(data, 0, false))
	must(t, l.Flush())
	must(t, l.WriteAt(data[:BlockSize], 0, false)) // group 0 in flux
	crash(l)
	// A newer version of block 2 landed on leg 1 only, its entry nowhere.
	rawWrite(t, m.legs[1], random(23, BlockSize), dataOff(2*BlockSize))
	l, _ = m.open(t, false, 1)
	defer l.Close()
	if g := readAll(t, l); !bytes.Equal(g, data) {
		t.Fatal("contents differ")
	}
	if !m.legsEqual(t) {
		t.Fatal("copies differ after reconcile")
	}
}

// TestWriteDoesNotSpreadTableCorruption: a write rewrites its group's
// whole table on every copy; an entry corrupt in one copy's table must
// not be copied over the good one.
func TestWriteDoesNotSpreadTableCorruption(t *testing.T) {
	size := int64(GroupData)
	m := newMirrored(t, size)
	l, _ := m.open(t, true, 0)
	data := random(24, size)
	must(t, l.WriteAt(data, 0, false))
	must(t, l.Close())
	flip(t, m.legs[0], tableOff(0)+4*9) // copy 0 (plain reads) : entry 9
	l, _ = m.open(t, false, 0)
	defer l.Close()
	p := random(25, BlockSize)
	must(t, l.WriteAt(p, 3*BlockSize, false)) // same group, other block
	copy(data[3*BlockSize:], p)
	if got := readAll(t, l); !bytes.Equal(got, data) {
		t.Fatal("contents differ")
	}
	rep, err := l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 0 {
		t.Fatalf("scrub: %+v %v", rep, err)
	}
	if !m.legsEqual(t) {
		t.Fatal("copies differ")
	}
}
