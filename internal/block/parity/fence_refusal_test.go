package parity

import (
	"bytes"
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// TestFenceRefusalFailsNoLeg: the write fence (Env.Fence) refuses every
// leg alike, and for a while only when the node's lease of the metadata
// cluster went unrenewed for a few seconds without expiring (a slow
// election): a renewal lets writes through again, on the same open stack.
// Taken for legs' failures, one refused write failed two legs — the
// volume unwritable, and its data on them unreadable, until reopened —
// though nothing was wrong with any leg. No leg may fail, and writes
// succeed once the fence lets them through again.
func TestFenceRefusalFailsNoLeg(t *testing.T) {
	const chunk = 4096
	f := &blocktest.SwitchFence{}
	env := block.Env{Dir: t.TempDir(), Size: 64 * chunk, Create: true, Fence: f}
	l := build(t, env, specFor(3, chunk))
	t.Cleanup(func() { l.Close() })
	model := make([]byte, l.Size())
	put := func(v byte, off int64) error {
		p := bytes.Repeat([]byte{v}, chunk)
		if err := l.WriteAt(p, off, false); err != nil {
			return err
		}
		copy(model[off:], p)
		return nil
	}
	if err := put(1, 0); err != nil {
		t.Fatal(err)
	}
	f.Refuse.Store(true)
	for _, off := range []int64{0, 8 * chunk} {
		if err := l.WriteAt(bytes.Repeat([]byte{2}, chunk), off, false); !errors.Is(err, block.ErrFenced) {
			t.Fatalf("write at %d through a closed fence: %v, want ErrFenced", off, err)
		}
	}
	f.Refuse.Store(false)
	wantAllOK(t, l, "after writes through a closed fence")
	// The refused writes left their ranges undefined: written again.
	for _, off := range []int64{0, 8 * chunk, 16 * chunk} {
		if err := put(3, off); err != nil {
			t.Fatalf("write at %d once the fence lets writes through again: %v", off, err)
		}
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	wantAllOK(t, l, "once the fence lets writes through again")
	mustRead(t, l, model, "once the fence lets writes through again")
}
