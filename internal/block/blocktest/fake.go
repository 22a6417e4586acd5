package blocktest

import (
	"sync"

	"github.com/basalt-storage/basalt/internal/block"
)

// Fake is a child for tests of layers over their children where size,
// failures and extents matter more than bytes: N bytes long (readable and
// writable only where Data covers them), every I/O fails with Err when it
// is set, Extents reports what ExtentsOf says (else all data), Resize
// grows it, and it counts its closes and resizes.
type Fake struct {
	N         int64
	Data      []byte
	Err       error
	ExtentsOf func(off, n int64) []block.Extent

	mu      sync.Mutex
	closes  int
	resizes int
}

func (f *Fake) Size() int64 { f.mu.Lock(); defer f.mu.Unlock(); return f.N }
func (f *Fake) Capabilities() block.Capabilities {
	return block.Capabilities{Flush: true, FUA: true, Trim: true, WriteZeroes: true, Extents: true}
}
func (f *Fake) ReadAt(p []byte, off int64) error {
	if f.Err != nil {
		return f.Err
	}
	copy(p, f.Data[off:])
	return nil
}
func (f *Fake) WriteAt(p []byte, off int64, _ bool) error {
	if f.Err != nil {
		return f.Err
	}
	copy(f.Data[off:], p)
	return nil
}
func (f *Fake) WriteZeroes(off, n int64, _ block.ZeroFlags) error { return f.Err }
func (f *Fake) Trim(off, n int64, _ bool) error                   { return f.Err }
func (f *Fake) Flush() error                                      { return f.Err }
func (f *Fake) Extents(off, n int64) ([]block.Extent, error) {
	if f.Err != nil {
		return nil, f.Err
	}
	if f.ExtentsOf != nil {
		return f.ExtentsOf(off, n), nil
	}
	return []block.Extent{{Length: n}}, nil
}
func (f *Fake) Close() error         { f.mu.Lock(); defer f.mu.Unlock(); f.closes++; return nil }
func (f *Fake) Describe() block.Node { return block.Node{Type: "fake", State: block.StateOK} }

// Resize implements block.Resizer: it grows (never shrinks) to n.
func (f *Fake) Resize(n int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resizes++
	f.N = max(f.N, n)
	return nil
}

// Closes is how often Close was called.
func (f *Fake) Closes() int { f.mu.Lock(); defer f.mu.Unlock(); return f.closes }

// Resizes is how often Resize was called.
func (f *Fake) Resizes() int { f.mu.Lock(); defer f.mu.Unlock(); return f.resizes }
