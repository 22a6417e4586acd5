package stripe

import (
	"bytes"
	"errors"
	"math"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	_ "github.com/basalt-storage/basalt/internal/block/file"
	_ "github.com/basalt-storage/basalt/internal/block/linear"
)

// fake is a child for these tests: a size (its bytes only when data
// is set), an error every I/O operation returns when err is set, a Resize
// that grows it, and counters of closes and resizes.
type fake struct {
	mu      sync.Mutex
	size    int64
	data    []byte
	err     error
	closes  int
	resizes int
}

func (f *fake) Size() int64 { f.mu.Lock(); defer f.mu.Unlock(); return f.size }
func (f *fake) Capabilities() block.Capabilities {
	return block.Capabilities{Flush: true, FUA: true, Trim: true, WriteZeroes: true, Extents: true}
}
func (f *fake) ReadAt(p []byte, off int64) error {
	if f.err != nil {
		return f.err
	}
	copy(p, f.data[off:])
	return nil
}
func (f *fake) WriteAt(p []byte, off int64, _ bool) error {
	if f.err != nil {
		return f.err
	}
	copy(f.data[off:], p)
	return nil
}
func (f *fake) WriteZeroes(off, n int64, _ block.ZeroFlags) error { return f.err }
func (f *fake) Trim(off, n int64, _ bool) error                   { return f.err }
func (f *fake) Flush() error                                      { return f.err }
func (f *fake) Extents(_, n int64) ([]block.Extent, error) {
	if f.err != nil {
		return nil, f.err
	}
	return []block.Extent{{Length: n}}, nil
}
func (f *fake) Close() error         { f.mu.Lock(); defer f.mu.Unlock(); f.closes++; return nil }
func (f *fake) Describe() block.Node { return block.Node{Type: "fake", State: block.StateOK} }
func (f *fake) Resize(n int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resizes++
	f.size = max(f.size, n)
	return nil
}

// A stripe whose children together hold more than int64 can count is
// refused, not built with a wrapped (zero or negative) size; so is a
// child share that would not fit.
func TestStripeSizeOverflow(t *testing.T) {
	kids := make([]block.Layer, 4)
	for i := range kids {
		kids[i] = &fake{size: 1 << 62}
	}
	if l, err := New(block.Env{}, nil, kids); err == nil {
		t.Fatalf("stripe of 4 children of 2^62 bytes built with size %d", l.Size())
	}
	for _, c := range []struct {
		params string
		size   int64
		n      int
	}{
		{`{"chunk":4611686018427387904}`, 1 << 20, 2}, // 2 shares of 2^62
		{``, math.MaxInt64, 4},
		{``, block.MaxSize + 1, 2},
	} {
		if per, err := childSize([]byte(c.params), c.size, c.n); err == nil {
			t.Errorf("childSize(%s, %d, %d) = %d, want an error", c.params, c.size, c.n, per)
		}
	}
}

// A chunk New refuses is refused before any child is created: otherwise
// the create leaves the children's files behind (and a retry then fails
// on them).
func TestStripeBadChunkCreatesNothing(t *testing.T) {
	for _, chunk := range []string{"5000", "12288", "2048", "-4096", "0", `"65536"`, "65536.5"} {
		dir := t.TempDir()
		spec := `{"type":"stripe","params":{"chunk":` + chunk + `},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}`
		l, err := block.Build(block.Env{Dir: dir, Size: 1 << 20, Create: true}, blocktest.Spec(t, spec))
		if err == nil {
			l.Close()
			t.Errorf("chunk %s: built", chunk)
			continue
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("chunk %s: refused (%v) but left %d files behind", chunk, err, len(ents))
		}
	}
}

// Requests reaching beyond the end are refused with ErrOutOfRange, and
// nothing of them is written: the children hold more than the stripe's
// size (their tails are no whole chunk), so a write there would
// otherwise be acknowledged into space no read ever returns.
func TestStripeOutOfRange(t *testing.T) {
	a, b := blocktest.NewMem(3*4096+100, true), blocktest.NewMem(3*4096+100, true)
	l, err := New(block.Env{}, []byte(`{"chunk":4096}`), []block.Layer{a, b})
	if err != nil {
		t.Fatal(err)
	}
	size := l.Size()
	if size != 6*4096 {
		t.Fatalf("size %d", size)
	}
	buf := make([]byte, 8192)
	for _, off := range []int64{size - 4096, size, size + 4096, -4096} {
		if err := l.WriteAt(buf, off, false); !errors.Is(err, block.ErrOutOfRange) {
			t.Errorf("write %d+8192: %v, want ErrOutOfRange", off, err)
		}
		if err := l.ReadAt(buf, off); !errors.Is(err, block.ErrOutOfRange) {
			t.Errorf("read %d+8192: %v, want ErrOutOfRange", off, err)
		}
		if err := l.WriteZeroes(off, 8192, block.ZeroFlags{}); !errors.Is(err, block.ErrOutOfRange) {
			t.Errorf("zero %d+8192: %v, want ErrOutOfRange", off, err)
		}
		if err := l.Trim(off, 8192, false); !errors.Is(err, block.ErrOutOfRange) {
			t.Errorf("trim %d+8192: %v, want ErrOutOfRange", off, err)
		}
		if _, err := l.Extents(off, 8192); !errors.Is(err, block.ErrOutOfRange) {
			t.Errorf("extents %d+8192: %v, want ErrOutOfRange", off, err)
		}
		if l.(block.NoWaitReader).TryReadAt(buf, off) {
			t.Errorf("TryReadAt %d+8192 answered", off)
		}
	}
	ff := bytes.Repeat([]byte{0xff}, 3*4096+100)
	if !bytes.Equal(a.Data, ff) || !bytes.Equal(b.Data, ff) || a.Zeroes+b.Zeroes != 0 {
		t.Fatal("a refused request changed a child")
	}
	// Up to the end exactly is fine.
	if err := l.WriteAt(buf, size-8192, true); err != nil {
		t.Fatal(err)
	}
	if err := l.ReadAt(buf, size-8192); err != nil {
		t.Fatal(err)
	}
}

// An error from a child says which child, and keeps the child's error
// for errors.Is.
func TestStripeChildErrorsNamed(t *testing.T) {
	boom := errors.New("boom")
	good := &fake{size: 4 * 4096, data: make([]byte, 4*4096)}
	bad := &fake{size: 4 * 4096, data: make([]byte, 4*4096), err: boom}
	l, err := New(block.Env{}, []byte(`{"chunk":4096}`), []block.Layer{good, bad})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8192)
	for name, err := range map[string]error{
		"read across":  l.ReadAt(buf, 0),
		"read within":  l.ReadAt(buf[:100], 4096),
		"write across": l.WriteAt(buf, 0, true),
		"write within": l.WriteAt(buf[:100], 4096, false),
		"zero":         l.WriteZeroes(0, 8192, block.ZeroFlags{}),
		"trim":         l.Trim(0, 8192, false),
		"flush":        l.Flush(),
		"extents":      func() error { _, err := l.Extents(4096, 4096); return err }(),
	} {
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "stripe child 1") {
			t.Errorf("%s: %v, want the child's error naming stripe child 1", name, err)
		}
	}
}

// Resize never shrinks (block.Resizer), and leaves the size a reopen
// (New over the same children) computes.
func TestStripeResizeNeverShrinks(t *testing.T) {
	const c = 4096
	kids := []*fake{{size: 6 * c}, {size: 6 * c}, {size: 6 * c}}
	l, err := New(block.Env{}, []byte(`{"chunk":4096}`), []block.Layer{kids[0], kids[1], kids[2]})
	if err != nil {
		t.Fatal(err)
	}
	if l.Size() != 18*c {
		t.Fatalf("size %d", l.Size())
	}
	r := l.(block.Resizer)
	if err := r.Resize(13 * c); err != nil {
		t.Fatal(err)
	}
	if l.Size() != 18*c {
		t.Fatalf("Resize(13 chunks) of an 18-chunk stripe left %d bytes", l.Size())
	}
	for i, k := range kids {
		if k.resizes != 0 {
			t.Errorf("child %d resized", i)
		}
	}
	if err := r.Resize(19 * c); err != nil {
		t.Fatal(err)
	}
	if l.Size() != 21*c {
		t.Fatalf("Resize(19 chunks): %d bytes, want 21 chunks", l.Size())
	}
	again, err := New(block.Env{}, []byte(`{"chunk":4096}`), []block.Layer{kids[0], kids[1], kids[2]})
	if err != nil || again.Size() != l.Size() {
		t.Fatalf("reopened: %v, %d bytes; resized to %d", err, again.Size(), l.Size())
	}
	if err := r.Resize(block.MaxSize + 1); err == nil {
		t.Fatal("Resize beyond block.MaxSize accepted")
	}
}

// Close closes each child once, however often it is called.
func TestStripeCloseOnce(t *testing.T) {
	a, b := &fake{size: 4096}, &fake{size: 4096}
	l, err := New(block.Env{}, []byte(`{"chunk":4096}`), []block.Layer{a, b})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	l.Close()
	if a.closes != 1 || b.closes != 1 {
		t.Fatalf("children closed %d and %d times", a.closes, b.closes)
	}
}

// The conformance driver over children that end inside a chunk, and
// unevenly (a partition of each file, of odd lengths): the stripe ends at
// the last whole chunk of the smallest, and random requests cross chunks
// and children up to that end.
func TestStripeConformanceUnevenChildren(t *testing.T) {
	spec := `{"type":"stripe","params":{"chunk":65536},"children":[
		{"type":"linear","params":{"offset":4096,"length":4190000},"children":[{"type":"file","params":{"path":"a.img"}}]},
		{"type":"linear","params":{"offset":512,"length":3000000},"children":[{"type":"file","params":{"path":"b.img"}}]},
		{"type":"file","params":{"path":"c.img"}}]}`
	model := blocktest.Conformance(t, block.Env{Dir: t.TempDir(), Size: 12 << 20, Create: true}, spec, 400)
	if want := 3000000 / 65536 * 65536 * 3; len(model) != want {
		t.Fatalf("size %d, want %d", len(model), want)
	}
}
