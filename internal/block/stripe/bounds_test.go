package stripe

import (
	"bytes"
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	_ "github.com/basalt-storage/basalt/internal/block/file"
	_ "github.com/basalt-storage/basalt/internal/block/linear"
)

// A stripe whose children together hold more than int64 can count is
// refused, not built with a wrapped (zero or negative) size; so is a
// child share that would not fit.
func TestStripeSizeOverflow(t *testing.T) {
	kids := make([]block.Layer, 4)
	for i := range kids {
		kids[i] = &blocktest.Fake{N: 1 << 62}
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
	good := &blocktest.Fake{N: 4 * 4096, Data: make([]byte, 4*4096)}
	bad := &blocktest.Fake{N: 4 * 4096, Data: make([]byte, 4*4096), Err: boom}
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
	kids := []*blocktest.Fake{{N: 6 * c}, {N: 6 * c}, {N: 6 * c}}
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
		if k.Resizes() != 0 {
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
	a, b := &blocktest.Fake{N: 4096}, &blocktest.Fake{N: 4096}
	l, err := New(block.Env{}, []byte(`{"chunk":4096}`), []block.Layer{a, b})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	l.Close()
	if a.Closes() != 1 || b.Closes() != 1 {
		t.Fatalf("children closed %d and %d times", a.Closes(), b.Closes())
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
