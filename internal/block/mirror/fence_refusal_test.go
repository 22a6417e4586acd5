package mirror

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// TestFenceRefusalFailsNoLeg: the write fence (Env.Fence) refuses every
// leg alike, and for a while only when the node's lease of the metadata
// cluster went unrenewed for a few seconds without expiring (a slow
// election): a renewal lets writes through again, on the same open stack.
// Taken for a leg's failure, the refusal failed a leg of every mirror
// written meanwhile — persisted at its next flush, degraded until
// repaired — though nothing was wrong with any leg. No leg may fail; the
// regions the refused write touched are resynchronised once writes go
// through again.
func TestFenceRefusalFailsNoLeg(t *testing.T) {
	f := &blocktest.SwitchFence{}
	l := openMirror(t, block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true, Fence: f}, mirrorSpec("", "a.img", "b.img"))
	t.Cleanup(func() { l.Close() })
	model := fillAll(t, l, 1)
	// A write now: its region's intent bit is durable, so the next write
	// there goes straight to the legs' fence.
	write(t, l, model, bytes.Repeat([]byte{0xab}, 4096), 0)

	f.Refuse.Store(true)
	if err := l.WriteAt(bytes.Repeat([]byte{0xcd}, 4096), 0, false); !errors.Is(err, block.ErrFenced) {
		t.Fatalf("write through a closed fence: %v, want ErrFenced", err)
	}
	f.Refuse.Store(false)
	if st := legStates(l); st[0] != legOK || st[1] != legOK {
		t.Fatalf("leg states after a fenced write: %v, want both ok: the fence is no leg's failure", st)
	}

	write(t, l, model, bytes.Repeat([]byte{0xef}, 4096), 0)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); l.Describe().State != block.StateOK; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the mirror stays %s (legs %v) once writes go through again", l.Describe().State, legStates(l))
		}
	}
	if st := legStates(l); st[0] != legOK || st[1] != legOK {
		t.Fatalf("leg states once writes go through again: %v, want both ok", st)
	}
	checkAll(t, l, model)
	checkCopies(t, l, model)
}
