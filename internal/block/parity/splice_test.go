package parity

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// TestSpliceTo: bytes spliced from the legs, then the rest read with
// ReadAt, are the volume's bytes — healthy, with a leg lost (its chunks
// are never spliced: they exist only as parity), in the middle of a
// rebuild (nor are the chunks not rebuilt yet) and after it.
// A chunk under 64 KiB is never spliced.
func TestSpliceTo(t *testing.T) {
	t.Parallel()
	const n = 4
	spec := specFor(n, 64<<10)
	rng := rand.New(rand.NewPCG(3, 5))
	env := block.Env{Dir: t.TempDir(), Size: 6 << 20, Create: true}
	l := build(t, env, spec)
	model := make([]byte, l.Size())
	randomOps(t, l, model, rng, 60)
	if blocktest.SpliceReads(t, l, model, rng, 200, 1<<20, "healthy") == 0 {
		t.Fatal("healthy: nothing was spliced")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	loseLeg(t, env, 1)
	env.Create = false
	l = build(t, env, spec)
	defer func() { l.Close() }()
	randomOps(t, l, model, rng, 30)
	if blocktest.SpliceReads(t, l, model, rng, 200, 1<<20, "degraded") == 0 {
		t.Fatal("degraded: nothing was spliced")
	}
	// A range held by the lost leg alone: its first chunk is in stripe 0
	// on leg 1 (data chunk 1), which must not be spliced.
	fds := blocktest.Pipe(t)
	if k := l.SpliceTo(fds[1], 64<<10, 64<<10, false); k != 0 {
		t.Fatalf("spliced %d bytes of a chunk on the lost leg", k)
	}
	// Interrupted after its first batch, a rebuild leaves the new leg
	// valid for some stripes only: the others must not be spliced from it.
	l.batchStripes = 4 // 32 stripes: 8 batches
	ctx, cancel := context.WithCancel(context.Background())
	err := l.Repair(ctx, func(done, total int64) {
		if done > 0 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || l.Describe().State != block.StateRebuilding {
		t.Fatalf("repair: %v, state %s; want it interrupted", err, l.Describe().State)
	}
	blocktest.SpliceReads(t, l, model, rng, 200, 1<<20, "mid-rebuild")
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if blocktest.SpliceReads(t, l, model, rng, 200, 1<<20, "rebuilt") == 0 {
		t.Fatal("rebuilt: nothing was spliced")
	}

	small := build(t, block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}, specFor(3, 4096))
	defer small.Close()
	if k := small.SpliceTo(fds[1], 0, 64<<10, false); k != 0 {
		t.Fatalf("a 4 KiB chunk layout spliced %d bytes", k)
	}
}
