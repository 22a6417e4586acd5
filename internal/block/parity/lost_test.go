package parity

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

var errInjected = errors.New("injected failure")

// loseInCrash creates a layer on env (its metadata in fs), runs dirty
// (which leaves stripes with their intent bits set), crashes, deletes the
// leg lose picks and reopens: the chunks of the dirty stripes on that leg
// are lost. It returns the reopened layer, its env and the FaultFS it
// holds its metadata in now.
func loseInCrash(t *testing.T, fs *blocktest.FaultFS, env block.Env, spec string, dirty func(l *Layer), lose func(l *Layer) int) (*Layer, block.Env, *blocktest.FaultFS) {
	t.Helper()
	l, env, fs := crashAndLose(t, fs, env, spec, dirty, lose)
	if l.lost.Load() == 0 {
		t.Fatal("no chunk lost: the test does not set up what it means to")
	}
	return l, env, fs
}

// crashAndLose is loseInCrash without its check that a chunk was lost.
func crashAndLose(t *testing.T, fs *blocktest.FaultFS, env block.Env, spec string, dirty func(l *Layer), lose func(l *Layer) int) (*Layer, block.Env, *blocktest.FaultFS) {
	t.Helper()
	env.Create, env.MetaFS = true, fs.Open
	l := build(t, env, spec)
	l.cleanDelay = time.Hour
	dirty(l)
	leg := lose(l)
	fs.Crash()
	l.Close() // the crashed process's files: its metadata calls fail
	loseLeg(t, env, leg)
	fs = fs.Restart()
	env.Create, env.MetaFS = false, fs.Open
	return build(t, env, spec), env, fs
}

// flushFails is a leg whose Flush fails (writes succeed).
type flushFails struct{ block.Layer }

func (f flushFails) Flush() error { return errInjected }

// A write that covers a lost chunk whole makes it readable again even when
// another leg fails during that write (its writes, or the flush before the
// mark is cleared): the update landed on every other leg, the failed leg is
// marked failed, the write is acknowledged, and so the chunk must read back
// as written — now and after a reopen — not fail with EIO.
func TestLostChunkHealedDespiteLegFailure(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	const dsz = (n - 1) * chunk
	spec := specFor(n, chunk)
	nines := bytes.Repeat([]byte{9}, dsz)
	for _, tc := range []struct {
		name string
		// fail makes leg b fail; op writes stripe 1 whole and returns its
		// content as it must read back.
		fail func(l *Layer, b int)
		op   func(l *Layer) ([]byte, error)
	}{
		{"write, leg fails writes", closeLeg, writeNines(nines, true)},
		{"write, leg fails flush", failFlush, writeNines(nines, false)},
		{"zeroes, leg fails writes", closeLeg, zeroStripe1(false)},
		{"zeroes, leg fails flush", failFlush, zeroStripe1(false)},
		{"zeroes FUA, leg fails writes", closeLeg, zeroStripe1(true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := blocktest.NewFaultFS()
			fs.Keep = blocktest.KeepAll
			env := block.Env{Dir: t.TempDir(), Size: 16 * dsz}
			l, env, fs := loseInCrash(t, fs, env, spec,
				func(l *Layer) {
					if err := l.WriteAt(bytes.Repeat([]byte{7}, dsz), dsz, false); err != nil { // stripe 1 dirty
						t.Fatal(err)
					}
				},
				func(l *Layer) int { return l.dataLeg(1, 0) })
			if err := l.Repair(context.Background(), nil); err != nil {
				t.Fatal(err)
			}
			if err := l.ReadAt(make([]byte, chunk), dsz); !errors.Is(err, syscall.EIO) {
				t.Fatalf("lost chunk before the write: %v, want EIO", err)
			}
			b := l.dataLeg(1, 1)
			tc.fail(l, b)
			want, err := tc.op(l)
			if err != nil {
				t.Fatalf("acknowledged? %v", err)
			}
			if l.state[b] != legFailed {
				t.Fatalf("leg %d not marked failed", b)
			}
			got := make([]byte, dsz)
			if err := l.ReadAt(got, dsz); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("acknowledged stripe reads back: %v (equal %v)", err, bytes.Equal(got, want))
			}
			if l.lost.Load() != 0 {
				t.Fatalf("%d chunks still marked lost", l.lost.Load())
			}
			l.Close()
			l = build(t, env, spec)
			defer l.Close()
			if err := l.ReadAt(got, dsz); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("after reopen: %v (equal %v)", err, bytes.Equal(got, want))
			}
		})
	}
}

func closeLeg(l *Layer, b int) { l.Children()[b].Close() }

func failFlush(l *Layer, b int) { l.children[b] = flushFails{l.children[b]} }

func writeNines(nines []byte, fua bool) func(l *Layer) ([]byte, error) {
	return func(l *Layer) ([]byte, error) {
		return nines, l.WriteAt(nines, int64(len(nines)), fua)
	}
}

func zeroStripe1(fua bool) func(l *Layer) ([]byte, error) {
	return func(l *Layer) ([]byte, error) {
		return make([]byte, l.dsz), l.WriteZeroes(l.dsz, l.dsz, block.ZeroFlags{FUA: fua})
	}
}

// The same for write-zeroes stripe by stripe (not every leg ok: one is
// rebuilding), when the leg that fails is the rebuilding one, already
// rebuilt for that stripe.
func TestLostChunkHealedByZeroesDespiteRebuildingLegFailure(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	const dsz = (n - 1) * chunk
	spec := specFor(n, chunk)
	fs := blocktest.NewFaultFS()
	fs.Keep = blocktest.KeepAll
	env := block.Env{Dir: t.TempDir(), Size: 16 * dsz}
	l, env, fs := loseInCrash(t, fs, env, spec,
		func(l *Layer) {
			if err := l.WriteAt(bytes.Repeat([]byte{7}, dsz), dsz, false); err != nil {
				t.Fatal(err)
			}
		},
		func(l *Layer) int { return l.dataLeg(1, 0) })
	defer l.Close()
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	// Leg f fails, comes back as rebuilding, and stripes 0-1 are rebuilt.
	f := l.dataLeg(1, 1)
	if err := l.markFailed(&legError{leg: f, err: errInjected}); err != nil {
		t.Fatal(err)
	}
	if need, err := l.prepareRebuild(); err != nil || !need {
		t.Fatalf("prepare rebuild: %v %v", need, err)
	}
	l.batchStripes = 2
	var cursor int64
	if k, err := l.rebuildBatch(&cursor); err != nil || k != 2 {
		t.Fatalf("rebuild batch: %d %v", k, err)
	}
	l.Children()[f].Close()
	if err := l.WriteZeroes(dsz, dsz, block.ZeroFlags{}); err != nil {
		t.Fatal(err)
	}
	if l.state[f] != legFailed {
		t.Fatal("rebuilding leg not marked failed")
	}
	got := make([]byte, dsz)
	if err := l.ReadAt(got, dsz); err != nil || !bytes.Equal(got, make([]byte, dsz)) {
		t.Fatalf("zeroed stripe: %v", err)
	}
}

// A lost chunk of the last stripe, when the size is not a whole number of
// stripes, extends past the end of the device: a write up to the end
// covers all of it there is, and makes it readable again.
func TestLostChunkInPartialLastStripeHealed(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	const dsz = (n - 1) * chunk
	spec := specFor(n, chunk)
	fs := blocktest.NewFaultFS()
	fs.Keep = blocktest.KeepAll
	const end = 8 * dsz
	env := block.Env{Dir: t.TempDir(), Size: end + 100}
	l, env, fs := loseInCrash(t, fs, env, spec,
		func(l *Layer) {
			if err := l.WriteAt(bytes.Repeat([]byte{7}, 100), end, false); err != nil {
				t.Fatal(err)
			}
		},
		func(l *Layer) int { return l.dataLeg(8, 0) })
	if err := l.ReadAt(make([]byte, 100), end); !errors.Is(err, syscall.EIO) {
		t.Fatalf("lost chunk: %v, want EIO", err)
	}
	p := bytes.Repeat([]byte{5}, 100)
	if err := l.WriteAt(p, end, true); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 100)
	if err := l.ReadAt(got, end); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("rewritten to the end of the device: %v", err)
	}
	l.Close()
	l = build(t, env, spec)
	defer l.Close()
	if err := l.ReadAt(got, end); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("after reopen: %v", err)
	}
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if st := l.Describe().State; st != block.StateOK {
		t.Fatalf("state %s after repair", st)
	}
}

// A data chunk wholly past the device's end holds no data: when its leg
// vanishes in a crash that interrupted an update of that last stripe,
// recovery stands zeroes in for it (what every such tail holds) and marks
// nothing lost. A lost mark there could never be cleared — no write
// reaches the chunk — and would keep the layer degraded after every
// repair.
func TestChunkPastEndNotLost(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	const dsz = (n - 1) * chunk
	spec := specFor(n, chunk)
	fs := blocktest.NewFaultFS()
	fs.Keep = blocktest.KeepAll
	const end = 8 * dsz
	p := bytes.Repeat([]byte{7}, 100)
	l, _, _ := crashAndLose(t, fs, block.Env{Dir: t.TempDir(), Size: end + 100}, spec,
		func(l *Layer) {
			if err := l.WriteAt(p, end, true); err != nil {
				t.Fatal(err)
			}
		},
		func(l *Layer) int { return l.dataLeg(8, 1) }) // stripe 8's second data chunk: all past the end
	defer l.Close()
	if got := l.lost.Load(); got != 0 {
		t.Fatalf("%d chunks marked lost; the one past the end holds no data", got)
	}
	got := make([]byte, 100)
	if err := l.ReadAt(got, end); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("last bytes: %v", err)
	}
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if st := l.Describe().State; st != block.StateOK {
		t.Fatalf("state %s after repair", st)
	}
	if err := l.ReadAt(got, end); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("last bytes after repair: %v", err)
	}
}

// flakyMeta fails every metadata write while failing is set; the first
// Sync after armed is set sets it.
type flakyMeta struct {
	block.MetaFile
	armed, failing *atomic.Bool
}

func (f flakyMeta) WriteAt(p []byte, off int64) (int, error) {
	if f.failing.Load() {
		return 0, errInjected
	}
	return f.MetaFile.WriteAt(p, off)
}

func (f flakyMeta) Sync() error {
	err := f.MetaFile.Sync()
	if f.armed.CompareAndSwap(true, false) {
		f.failing.Store(true)
	}
	return err
}

// A request whose first stripes fail (here: the metadata cannot be
// written for a while) is abandoned before its later stripes are
// written. Their intent bits, set up front, must still be cleared by the
// next Flush: else a crash in which a leg vanishes marks those stripes,
// never modified, lost.
func TestAbandonedStripesKeepNoIntentBit(t *testing.T) {
	t.Parallel()
	const n, chunk = 5, 4096
	const dsz = (n - 1) * chunk
	spec := specFor(n, chunk)
	fs := blocktest.NewFaultFS()
	fs.Keep = blocktest.KeepAll
	env := block.Env{Dir: t.TempDir(), Size: 8 * dsz}
	// Chunks on leg 0 of stripes 0-3 lost (leg 0 holds data in each): a
	// write covering them clears their marks, which needs a metadata
	// write, so with the metadata failing each of those stripes fails.
	l, env, fs := loseInCrash(t, fs, env, spec,
		func(l *Layer) {
			if err := l.WriteAt(make([]byte, 4*dsz), 0, false); err != nil {
				t.Fatal(err)
			}
		},
		func(*Layer) int { return 0 })
	if l.lost.Load() != 4 {
		t.Fatalf("%d chunks lost, want 4", l.lost.Load())
	}
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	l.Close()
	var armed, failing atomic.Bool
	base := env.MetaFS
	env.MetaFS = func(path string) (block.MetaFile, error) {
		f, err := base(path)
		return flakyMeta{f, &armed, &failing}, err
	}
	l = build(t, env, spec)
	l.cleanDelay = 0
	// Stripes 0-5: the bits of all six are set and synced up front, then
	// the metadata fails. Stripes 0-3 (the first stripeWorkers) each fail;
	// the request stops before stripes 4 and 5.
	armed.Store(true)
	if err := l.WriteAt(bytes.Repeat([]byte{3}, 6*dsz), 0, false); !errors.Is(err, errInjected) {
		t.Fatalf("write with the metadata failing: %v", err)
	}
	failing.Store(false)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	for s := range int64(6) {
		if l.bm.Get(l.intentBit(s, l.epoch)) {
			t.Errorf("stripe %d keeps its intent bit after a Flush", s)
		}
	}
	// Crash, and a data leg of stripes 4 and 5 vanishes.
	fs.Crash()
	l.Close()
	if l.dataLeg(4, 0) != 1 || l.dataLeg(5, 1) != 1 {
		t.Fatal("leg 1 holds no data of stripes 4 and 5")
	}
	loseLeg(t, env, 1)
	env.MetaFS = fs.Restart().Open
	l = build(t, env, spec)
	defer l.Close()
	got := make([]byte, 2*dsz)
	if err := l.ReadAt(got, 4*dsz); err != nil || !bytes.Equal(got, make([]byte, 2*dsz)) {
		t.Fatalf("stripes 4-5, never written: %v", err)
	}
}
