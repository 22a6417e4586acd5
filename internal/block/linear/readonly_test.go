package linear

import (
	"bytes"
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// roMem is a Mem opened read-only: it says so and refuses every change.
type roMem struct{ *blocktest.Mem }

func (m roMem) Capabilities() block.Capabilities {
	c := m.Mem.Capabilities()
	c.ReadOnly = true
	return c
}
func (m roMem) WriteAt([]byte, int64, bool) error               { return block.ErrReadOnly }
func (m roMem) WriteZeroes(int64, int64, block.ZeroFlags) error { return block.ErrReadOnly }
func (m roMem) Trim(int64, int64, bool) error                   { return block.ErrReadOnly }

// A concatenation with a read-only child declares itself read-only
// (block.Combine), and then refuses every change, also one that falls on
// a writable child only: before, that child took it.
func TestLinearReadOnlyRefusesWrites(t *testing.T) {
	rw, ro := blocktest.NewMem(8192, true), roMem{blocktest.NewMem(8192, true)}
	l, err := New(block.Env{}, nil, []block.Layer{rw, ro})
	if err != nil {
		t.Fatal(err)
	}
	if !l.Capabilities().ReadOnly {
		t.Fatal("a concatenation with a read-only child does not declare itself read-only")
	}
	for name, err := range map[string]error{
		"write": l.WriteAt(make([]byte, 4096), 0, false),
		"zero":  l.WriteZeroes(0, 4096, block.ZeroFlags{}),
		"trim":  l.Trim(0, 4096, false),
	} {
		if !errors.Is(err, block.ErrReadOnly) {
			t.Errorf("%s on a read-only concatenation: %v, want ErrReadOnly", name, err)
		}
	}
	if !bytes.Equal(rw.Data, bytes.Repeat([]byte{0xff}, 8192)) || rw.Zeroes != 0 {
		t.Fatal("a device that declares itself read-only changed")
	}
}
