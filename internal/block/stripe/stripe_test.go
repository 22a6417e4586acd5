package stripe

import (
	"bytes"
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// A fast zero over a child that cannot zero fast fails at once: no other
// child has zeroed its part (block.ZeroFlags.Fast) — they would run
// concurrently.
func TestFastZeroFailsBeforeZeroing(t *testing.T) {
	fast, slow := blocktest.NewMem(8192, true), blocktest.NewMem(8192, false)
	l, err := New(block.Env{}, []byte(`{"chunk":4096}`), []block.Layer{fast, slow})
	if err != nil {
		t.Fatal(err)
	}
	// Chunks 0 and 2 are on the fast child, 1 and 3 on the slow one.
	if err := l.WriteZeroes(0, 3*4096, block.ZeroFlags{Fast: true}); !errors.Is(err, block.ErrNotSupported) {
		t.Fatalf("fast zero across a slow child: %v, want ErrNotSupported", err)
	}
	if fast.Zeroes != 0 || !bytes.Equal(fast.Data, bytes.Repeat([]byte{0xff}, 8192)) {
		t.Fatal("the fast child zeroed its part of a request that failed")
	}
	if err := l.WriteZeroes(2*4096, 4096, block.ZeroFlags{Fast: true}); err != nil || fast.Zeroes != 1 {
		t.Fatalf("fast zero within the fast child: %v (%d zeroes)", err, fast.Zeroes)
	}
	if err := l.WriteZeroes(0, 4*4096, block.ZeroFlags{}); err != nil || !bytes.Equal(slow.Data[:4096], make([]byte, 4096)) {
		t.Fatalf("zero across both: %v", err)
	}
}
