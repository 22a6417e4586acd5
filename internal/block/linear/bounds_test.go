package linear

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	_ "github.com/basalt-storage/basalt/internal/block/file"
)

// A request reaching beyond the end of a partition is refused, and
// nothing of it reaches the child: before, the part inside the window was
// written, the rest dropped, and the write acknowledged whole (a read
// likewise returned with part of its buffer never filled).
func TestLinearOutOfRange(t *testing.T) {
	child := blocktest.NewMem(16384, true)
	l, err := New(block.Env{}, []byte(`{"offset":4096,"length":8192}`), []block.Layer{child})
	if err != nil {
		t.Fatal(err)
	}
	a, b := blocktest.NewMem(4096, true), blocktest.NewMem(4096, true)
	cat, err := New(block.Env{}, nil, []block.Layer{a, b})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8192)
	for name, l := range map[string]block.Layer{"partition": l, "concatenation": cat} {
		size := l.Size()
		for _, off := range []int64{size - 4096, size, size + 4096, -4096} {
			if err := l.WriteAt(buf, off, false); !errors.Is(err, block.ErrOutOfRange) {
				t.Errorf("%s: write %d+8192: %v, want ErrOutOfRange", name, off, err)
			}
			if err := l.ReadAt(buf, off); !errors.Is(err, block.ErrOutOfRange) {
				t.Errorf("%s: read %d+8192: %v, want ErrOutOfRange", name, off, err)
			}
			if err := l.WriteZeroes(off, 8192, block.ZeroFlags{}); !errors.Is(err, block.ErrOutOfRange) {
				t.Errorf("%s: zero %d+8192: %v, want ErrOutOfRange", name, off, err)
			}
			if err := l.Trim(off, 8192, false); !errors.Is(err, block.ErrOutOfRange) {
				t.Errorf("%s: trim %d+8192: %v, want ErrOutOfRange", name, off, err)
			}
			if _, err := l.Extents(off, 8192); !errors.Is(err, block.ErrOutOfRange) {
				t.Errorf("%s: extents %d+8192: %v, want ErrOutOfRange", name, off, err)
			}
			if l.(block.NoWaitReader).TryReadAt(buf, off) {
				t.Errorf("%s: TryReadAt %d+8192 answered", name, off)
			}
		}
		if err := l.WriteAt(buf, size-8192, true); err != nil {
			t.Fatalf("%s: write up to the end: %v", name, err)
		}
	}
	if !bytes.Equal(child.Data[:4096], bytes.Repeat([]byte{0xff}, 4096)) ||
		!bytes.Equal(child.Data[12288:], bytes.Repeat([]byte{0xff}, 4096)) || child.Zeroes != 0 {
		t.Fatal("a request to the partition changed the child outside its window")
	}
}

// A concatenation whose size int64 cannot count is refused, not built
// with a wrapped size.
func TestLinearSizeOverflow(t *testing.T) {
	kids := []block.Layer{&blocktest.Fake{N: 1 << 62}, &blocktest.Fake{N: 1 << 62}, &blocktest.Fake{N: 1 << 62}}
	if l, err := New(block.Env{}, nil, kids); err == nil {
		t.Fatalf("linear of 3 children of 2^62 bytes built with size %d", l.Size())
	}
}

// An error from a child says which child, and keeps the child's error
// for errors.Is.
func TestLinearChildErrorsNamed(t *testing.T) {
	boom := errors.New("boom")
	good := &blocktest.Fake{N: 4096, Data: make([]byte, 4096)}
	bad := &blocktest.Fake{N: 4096, Data: make([]byte, 4096), Err: boom}
	l, err := New(block.Env{}, nil, []block.Layer{good, bad})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8192)
	for name, err := range map[string]error{
		"read":    l.ReadAt(buf, 0),
		"write":   l.WriteAt(buf, 0, true),
		"zero":    l.WriteZeroes(0, 8192, block.ZeroFlags{}),
		"trim":    l.Trim(0, 8192, false),
		"flush":   l.Flush(),
		"extents": func() error { _, err := l.Extents(0, 8192); return err }(),
	} {
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "linear child 1") {
			t.Errorf("%s: %v, want the child's error naming linear child 1", name, err)
		}
	}
}

// Extents are merged across children within each child's piece: an
// extent a child reports past its piece (beyond what was asked) is cut at
// the piece's end, and an empty child adds no zero-length extent —
// otherwise the next child's extents land at the wrong offsets.
func TestLinearExtentsClipped(t *testing.T) {
	hole := &blocktest.Fake{N: 8192, ExtentsOf: func(_, n int64) []block.Extent {
		return []block.Extent{{Length: n + 4096, Hole: true, Zero: true}} // says too much
	}}
	empty := &blocktest.Fake{N: 0, ExtentsOf: func(_, n int64) []block.Extent {
		return []block.Extent{{Length: n, Zero: true}}
	}}
	data := &blocktest.Fake{N: 8192}
	l, err := New(block.Env{}, nil, []block.Layer{hole, empty, data})
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.Extents(4096, 8192)
	if err != nil {
		t.Fatal(err)
	}
	want := []block.Extent{{Length: 4096, Hole: true, Zero: true}, {Length: 4096}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("extents %+v, want %+v", got, want)
	}
}

// Close closes each child once, however often it is called.
func TestLinearCloseOnce(t *testing.T) {
	a, b := &blocktest.Fake{N: 4096}, &blocktest.Fake{N: 4096}
	l, err := New(block.Env{}, nil, []block.Layer{a, b})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	l.Close()
	if a.Closes() != 1 || b.Closes() != 1 {
		t.Fatalf("children closed %d and %d times", a.Closes(), b.Closes())
	}
}

// The conformance driver over children whose boundaries fall off any
// sector (partitions of odd offsets and lengths between whole files):
// random requests cross them, and end at the device's end.
func TestLinearConformanceOddBoundaries(t *testing.T) {
	spec := `{"type":"linear","children":[
		{"type":"linear","params":{"offset":512,"length":1000000},"children":[{"type":"file","params":{"path":"a.img"}}]},
		{"type":"file","params":{"path":"b.img"}},
		{"type":"linear","params":{"offset":4096,"length":12345},"children":[{"type":"file","params":{"path":"c.img"}}]}]}`
	model := blocktest.Conformance(t, block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}, spec, 400)
	if want := 1000000 + 1<<20 + 12345; len(model) != want {
		t.Fatalf("size %d, want %d", len(model), want)
	}
}

// Parameters New would refuse are refused before the children are
// created: otherwise the create leaves their files behind (and a retry
// then fails on them).
func TestLinearBadParamsCreateNothing(t *testing.T) {
	one := `[{"type":"file","params":{"path":"a.img"}}]`
	two := `[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]`
	for _, c := range []struct{ params, children string }{
		{`{"ofset":4096}`, one},
		{`{"offset":"4096","length":4096}`, one},
		{`{"offset":-1,"length":4096}`, one},
		{`{"offset":4096}`, one},
		{`{"length":-4096}`, one},
		{`{"offset":0,"length":4096}`, two},
	} {
		dir := t.TempDir()
		spec := `{"type":"linear","params":` + c.params + `,"children":` + c.children + `}`
		l, err := block.Build(block.Env{Dir: dir, Size: 1 << 20, Create: true}, blocktest.Spec(t, spec))
		if err == nil {
			l.Close()
			t.Errorf("%s: built", c.params)
			continue
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%s: refused (%v) but left %d files behind", c.params, err, len(ents))
		}
	}
}
