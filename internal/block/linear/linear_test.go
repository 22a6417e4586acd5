package linear

import (
	"bytes"
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// A fast zero over a child that cannot zero fast fails at once: no other
// child has zeroed its part (block.ZeroFlags.Fast).
func TestFastZeroFailsBeforeZeroing(t *testing.T) {
	fast, slow := blocktest.NewMem(8192, true), blocktest.NewMem(8192, false)
	l, err := New(block.Env{}, nil, []block.Layer{fast, slow})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteZeroes(4096, 8192, block.ZeroFlags{Fast: true}); !errors.Is(err, block.ErrNotSupported) {
		t.Fatalf("fast zero across a slow child: %v, want ErrNotSupported", err)
	}
	if fast.Zeroes != 0 || !bytes.Equal(fast.Data, bytes.Repeat([]byte{0xff}, 8192)) {
		t.Fatal("the fast child zeroed its part of a request that failed")
	}
	if err := l.WriteZeroes(0, 8192, block.ZeroFlags{Fast: true}); err != nil || fast.Zeroes != 1 {
		t.Fatalf("fast zero within the fast child: %v (%d zeroes)", err, fast.Zeroes)
	}
	if err := l.WriteZeroes(4096, 8192, block.ZeroFlags{}); err != nil || !bytes.Equal(slow.Data[:4096], make([]byte, 4096)) {
		t.Fatalf("zero across both: %v", err)
	}
}
