package crypt

import (
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// TestRequestsBeyondTheSizeRefused: the child holds whole sectors, so past
// a size that is not a whole number of them it has room the device does
// not. Every request that reaches past the size — or starts before 0 —
// is refused with ErrOutOfRange and changes nothing, as below any other
// layer; before, the child's bounds were the only ones, and a read or
// write of the last sector's tail went through.
func TestRequestsBeyondTheSizeRefused(t *testing.T) {
	const size = 3*SectorSize + 1000
	keys := newKeys(t)
	child := &blocktest.Fake{N: DataOffset + 4*SectorSize, Data: make([]byte, DataOffset+4*SectorSize)}
	dev, err := New(block.Env{Size: size, Create: true, Keys: keys}, nil, []block.Layer{child})
	if err != nil {
		t.Fatal(err)
	}
	l := dev.(*Layer)
	before := append([]byte(nil), child.Data...)
	for _, r := range [][2]int64{{size - 10, 20}, {size, 1}, {3 * SectorSize, SectorSize}, {-1, 10}, {1 << 62, 1 << 62}} {
		off, n := r[0], r[1]
		want := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, block.ErrOutOfRange) {
				t.Errorf("%s %d+%d: %v, want ErrOutOfRange", what, off, n, err)
			}
		}
		if n < 1<<20 {
			want("read", l.ReadAt(make([]byte, n), off))
			want("write", l.WriteAt(make([]byte, n), off, false))
			if l.TryReadAt(make([]byte, n), off) {
				t.Errorf("TryReadAt %d+%d took it", off, n)
			}
		}
		want("zero", l.WriteZeroes(off, n, block.ZeroFlags{}))
		want("trim", l.Trim(off, n, false))
		_, err := l.Extents(off, n)
		want("extents", err)
	}
	if string(child.Data) != string(before) {
		t.Fatal("a refused request changed the child")
	}
	// Up to the size is fine.
	if err := l.WriteAt(make([]byte, 1000), 3*SectorSize, false); err != nil {
		t.Fatalf("write of the last bytes: %v", err)
	}
	if err := l.ReadAt(make([]byte, size), 0); err != nil {
		t.Fatalf("read of everything: %v", err)
	}
}
