package stripe

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// countingFile counts the Extents calls made to a file.
type countingFile struct {
	*block.File
	calls *atomic.Int64
}

func (f countingFile) Extents(off, n int64) ([]block.Extent, error) {
	f.calls.Add(1)
	return f.File.Extents(off, n)
}

func (f countingFile) Describe() block.Node { return block.Node{Type: "file", State: block.StateOK} }

// sparseStripe is a stripe of 4 sparse files of each bytes, 64 KiB units,
// whose children count their Extents calls.
func sparseStripe(t *testing.T, each int64) (block.Layer, *atomic.Int64) {
	t.Helper()
	calls := new(atomic.Int64)
	var kids []block.Layer
	for range 4 {
		p := filepath.Join(t.TempDir(), "leg")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(each); err != nil {
			t.Fatal(err)
		}
		f.Close()
		bf, err := block.OpenFile(p, false)
		if err != nil {
			t.Fatal(err)
		}
		kids = append(kids, countingFile{File: bf, calls: calls})
	}
	l, err := New(block.Env{}, []byte(`{"chunk":65536}`), kids)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, calls
}

// walk collects the extents of the whole device the way callers do: ask,
// take what was answered, ask again from there.
func walk(t *testing.T, d block.Device) []block.Extent {
	t.Helper()
	var out []block.Extent
	for off := int64(0); off < d.Size(); {
		ex, err := d.Extents(off, d.Size()-off)
		if err != nil {
			t.Fatal(err)
		}
		if len(ex) == 0 {
			t.Fatalf("no extents at %d", off)
		}
		for _, e := range ex {
			if e.Length <= 0 || off+e.Length > d.Size() {
				t.Fatalf("extent %+v at %d of a device of %d bytes", e, off, d.Size())
			}
			out = block.AppendExtent(out, e)
			off += e.Length
		}
	}
	return out
}

// The extents of a large, mostly sparse stripe (a new volume's: the
// copy-on-write layer above walks them at every open) cost a number of
// child calls that grows with the data, not with the size: asking each
// child about one stripe unit at a time took hours for 8 TiB.
func TestExtentsOfALargeSparseStripe(t *testing.T) {
	const each = 1 << 40 // 4 TiB in all
	l, calls := sparseStripe(t, each)
	ex := walk(t, l)
	if len(ex) != 1 || !ex[0].Zero || !ex[0].Hole || ex[0].Length != l.Size() {
		t.Fatalf("an empty stripe's extents: %+v", ex)
	}
	if n := calls.Load(); n > 64 {
		t.Fatalf("%d child Extents calls for an empty stripe", n)
	}

	// Data in units 0 (child 0), 5 (child 1) and one near the end
	// (child 3): three data extents, zeroes between.
	unit := int64(65536)
	last := l.Size()/unit - 1 // on child 3
	for _, u := range []int64{0, 5, last} {
		if err := l.WriteAt(make([]byte, 4096), u*unit, false); err != nil {
			t.Fatal(err)
		}
		// WriteAt of zeroes still allocates: mark it so it reads as data.
		if err := l.WriteAt([]byte{1}, u*unit, false); err != nil {
			t.Fatal(err)
		}
	}
	calls.Store(0)
	ex = walk(t, l)
	var data []int64
	off := int64(0)
	for _, e := range ex {
		if !e.Zero {
			if e.Length%4096 != 0 || off%unit != 0 {
				t.Fatalf("data extent %+v at %d", e, off)
			}
			data = append(data, off/unit)
		}
		off += e.Length
	}
	if len(data) != 3 || data[0] != 0 || data[1] != 5 || data[2] != last {
		t.Fatalf("data in units %v, want [0 5 %d]; extents %+v", data, last, ex)
	}
	if n := calls.Load(); n > 256 {
		t.Fatalf("%d child Extents calls for three data units", n)
	}
}
