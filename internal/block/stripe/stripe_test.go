package stripe

import (
	"bytes"
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// memChild is an in-memory child; fast is its FastZero.
type memChild struct {
	data   []byte
	fast   bool
	zeroes int // WriteZeroes calls that zeroed
}

func newMem(n int, fast bool) *memChild {
	return &memChild{data: bytes.Repeat([]byte{0xff}, n), fast: fast}
}

func (m *memChild) Size() int64 { return int64(len(m.data)) }
func (m *memChild) Capabilities() block.Capabilities {
	return block.Capabilities{Flush: true, Trim: true, WriteZeroes: true, FastZero: m.fast}
}
func (m *memChild) ReadAt(p []byte, off int64) error          { copy(p, m.data[off:]); return nil }
func (m *memChild) WriteAt(p []byte, off int64, _ bool) error { copy(m.data[off:], p); return nil }
func (m *memChild) Trim(int64, int64, bool) error             { return nil }
func (m *memChild) Flush() error                              { return nil }
func (m *memChild) Extents(_, n int64) ([]block.Extent, error) {
	return []block.Extent{{Length: n}}, nil
}
func (m *memChild) Close() error         { return nil }
func (m *memChild) Describe() block.Node { return block.Node{Type: "mem", State: block.StateOK} }
func (m *memChild) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if f.Fast && !m.fast {
		return block.ErrNotSupported
	}
	m.zeroes++
	clear(m.data[off : off+n])
	return nil
}

// A fast zero over a child that cannot zero fast fails at once: no other
// child has zeroed its part (block.ZeroFlags.Fast) — they would run
// concurrently.
func TestFastZeroFailsBeforeZeroing(t *testing.T) {
	fast, slow := newMem(8192, true), newMem(8192, false)
	l, err := New(block.Env{}, []byte(`{"chunk":4096}`), []block.Layer{fast, slow})
	if err != nil {
		t.Fatal(err)
	}
	// Chunks 0 and 2 are on the fast child, 1 and 3 on the slow one.
	if err := l.WriteZeroes(0, 3*4096, block.ZeroFlags{Fast: true}); !errors.Is(err, block.ErrNotSupported) {
		t.Fatalf("fast zero across a slow child: %v, want ErrNotSupported", err)
	}
	if fast.zeroes != 0 || !bytes.Equal(fast.data, bytes.Repeat([]byte{0xff}, 8192)) {
		t.Fatal("the fast child zeroed its part of a request that failed")
	}
	if err := l.WriteZeroes(2*4096, 4096, block.ZeroFlags{Fast: true}); err != nil || fast.zeroes != 1 {
		t.Fatalf("fast zero within the fast child: %v (%d zeroes)", err, fast.zeroes)
	}
	if err := l.WriteZeroes(0, 4*4096, block.ZeroFlags{}); err != nil || !bytes.Equal(slow.data[:4096], make([]byte, 4096)) {
		t.Fatalf("zero across both: %v", err)
	}
}
