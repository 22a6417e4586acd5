package crypt

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// TestResizeBeyondMaxSizeRefused: a size beyond block.MaxSize is refused
// before anything changes. Beyond it the header records a size open
// rejects as implausible (the volume would not open again), and near the
// top of int64 the child size it needs wraps negative, so the child was
// not even grown.
func TestResizeBeyondMaxSizeRefused(t *testing.T) {
	const size = 1 << 20
	keys := newKeys(t)
	child := &blocktest.Fake{N: DataOffset + size, Data: make([]byte, DataOffset+size)}
	l, err := New(block.Env{Size: size, Create: true, Keys: keys}, nil, []block.Layer{child})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{block.MaxSize + 1, 1<<63 - 1} {
		if err := l.(block.Resizer).Resize(n); err == nil {
			t.Errorf("resize to %d bytes accepted", n)
		}
		if got := l.Size(); got != size {
			t.Fatalf("size %d after a refused resize to %d, want %d", got, n, size)
		}
	}
	// The header still opens.
	if _, err := New(block.Env{Keys: keys}, nil, []block.Layer{child}); err != nil {
		t.Fatalf("reopen after the refused resizes: %v", err)
	}
	// Up to block.MaxSize is fine.
	if err := l.(block.Resizer).Resize(block.MaxSize); err != nil {
		t.Fatalf("resize to block.MaxSize: %v", err)
	}
	if _, err := New(block.Env{Keys: keys}, nil, []block.Layer{child}); err != nil {
		t.Fatalf("reopen at block.MaxSize: %v", err)
	}
}
