package blocktest

import (
	"bytes"

	"github.com/basalt-storage/basalt/internal/block"
)

// Mem is an in-memory device for tests of layers over their children: it
// starts filled with 0xff, declares FastZero as Fast says, refuses a fast
// zero otherwise, and counts the zeroes it did.
type Mem struct {
	Data   []byte
	Fast   bool
	Zeroes int // WriteZeroes calls that zeroed
}

// NewMem returns a Mem of n bytes.
func NewMem(n int, fast bool) *Mem {
	return &Mem{Data: bytes.Repeat([]byte{0xff}, n), Fast: fast}
}

func (m *Mem) Size() int64 { return int64(len(m.Data)) }
func (m *Mem) Capabilities() block.Capabilities {
	return block.Capabilities{Flush: true, Trim: true, WriteZeroes: true, FastZero: m.Fast}
}
func (m *Mem) ReadAt(p []byte, off int64) error          { copy(p, m.Data[off:]); return nil }
func (m *Mem) WriteAt(p []byte, off int64, _ bool) error { copy(m.Data[off:], p); return nil }
func (m *Mem) Trim(int64, int64, bool) error             { return nil }
func (m *Mem) Flush() error                              { return nil }
func (m *Mem) Extents(_, n int64) ([]block.Extent, error) {
	return []block.Extent{{Length: n}}, nil
}
func (m *Mem) Close() error         { return nil }
func (m *Mem) Describe() block.Node { return block.Node{Type: "mem", State: block.StateOK} }
func (m *Mem) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if f.Fast && !m.Fast {
		return block.ErrNotSupported
	}
	m.Zeroes++
	clear(m.Data[off : off+n])
	return nil
}
