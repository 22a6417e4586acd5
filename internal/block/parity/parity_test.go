package parity

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	_ "github.com/basalt-storage/basalt/internal/block/file"
)

// specFor is a parity stack over n file legs leg0.img … leg{n-1}.img.
func specFor(n int, chunk int64) string {
	var kids []string
	for i := range n {
		kids = append(kids, fmt.Sprintf(`{"type":"file","params":{"path":"leg%d.img"}}`, i))
	}
	params := ""
	if chunk > 0 {
		params = fmt.Sprintf(`"params":{"chunk":%d},`, chunk)
	}
	return fmt.Sprintf(`{"type":"parity",%s"children":[%s]}`, params, strings.Join(kids, ","))
}

func build(t *testing.T, env block.Env, spec string) *Layer {
	t.Helper()
	l, err := block.Build(env, blocktest.Spec(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	return l.(*Layer)
}

func legPath(env block.Env, i int) string { return filepath.Join(env.Dir, fmt.Sprintf("leg%d.img", i)) }

func randBytes(rng *rand.Rand, n int64) []byte {
	p := make([]byte, n+7)
	for i := 0; i < len(p)-7; i += 8 {
		binary.LittleEndian.PutUint64(p[i:], rng.Uint64())
	}
	return p[:n]
}

func mustRead(t *testing.T, l block.Device, model []byte, what string) {
	t.Helper()
	got := make([]byte, len(model))
	if err := l.ReadAt(got, 0); err != nil {
		t.Fatalf("%s: read: %v", what, err)
	}
	if !bytes.Equal(got, model) {
		for i := range got {
			if got[i] != model[i] {
				t.Fatalf("%s: content differs from the model, first at byte %d", what, i)
			}
		}
	}
}

// tryReads tries every chunk of l without waiting: what is answered must
// match the model, and something must be answered (mustRead has just
// brought the healthy legs into the page cache).
func tryReads(t *testing.T, l block.Device, model []byte, chunk int, what string) {
	t.Helper()
	answered := 0
	for off := 0; off < len(model); off += chunk {
		p := make([]byte, chunk)
		if !block.TryReadAt(l, p, int64(off)) {
			continue
		}
		answered++
		if !bytes.Equal(p, model[off:off+chunk]) {
			t.Fatalf("%s: TryReadAt at %d differs from the model", what, off)
		}
	}
	if answered == 0 {
		t.Fatalf("%s: no chunk answered without waiting", what)
	}
}

// randomOps applies ops random writes (aligned and not, some FUA),
// write-zeroes and trims to l and model.
func randomOps(t *testing.T, l block.Device, model []byte, rng *rand.Rand, ops int) {
	t.Helper()
	size := int64(len(model))
	for range ops {
		off := rng.Int64N(size)
		n := min(rng.Int64N(64<<10)+1, size-off)
		switch rng.IntN(5) {
		case 0, 1, 2:
			p := randBytes(rng, n)
			if err := l.WriteAt(p, off, rng.IntN(4) == 0); err != nil {
				t.Fatalf("write %d+%d: %v", off, n, err)
			}
			copy(model[off:], p)
		case 3:
			if err := l.WriteZeroes(off, n, block.ZeroFlags{NoHole: rng.IntN(2) == 0}); err != nil {
				t.Fatalf("zero %d+%d: %v", off, n, err)
			}
			clear(model[off : off+n])
		case 4:
			if err := l.Trim(off, n, false); err != nil {
				t.Fatalf("trim %d+%d: %v", off, n, err)
			}
			if err := l.ReadAt(model[off:off+n], off); err != nil {
				t.Fatalf("read after trim: %v", err)
			}
		}
	}
}

// checkParity reads the leg files directly and checks that every stripe's
// chunks XOR to zero (the parity is the XOR of the data): an independent
// check of the layer's parity math and of its crash recovery.
func checkParity(t *testing.T, env block.Env, n int, chunk int64) {
	t.Helper()
	if err := parityError(env, n, chunk); err != nil {
		t.Fatal(err)
	}
}

func parityError(env block.Env, n int, chunk int64) error {
	var legs [][]byte
	for i := range n {
		b, err := os.ReadFile(legPath(env, i))
		if err != nil {
			return err
		}
		legs = append(legs, b)
	}
	for c := 0; c+8 <= len(legs[0]); c += 8 {
		x := uint64(0)
		for _, leg := range legs {
			x ^= binary.LittleEndian.Uint64(leg[c:])
		}
		if x != 0 {
			return fmt.Errorf("stripe %d: parity does not match its data (column %d)", int64(c)/chunk, int64(c)%chunk)
		}
	}
	return nil
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for name, spec := range map[string]string{
		"3legs-4k":  specFor(3, 4096),
		"4legs-64k": specFor(4, 0), // 8 MiB is not a whole number of 192 KiB stripes
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			blocktest.Conformance(t, block.Env{Dir: t.TempDir(), Size: 8 << 20, Create: true}, spec, 400)
		})
	}
}

func TestLayoutAndSize(t *testing.T) {
	t.Parallel()
	env := block.Env{Dir: t.TempDir(), Size: 1<<20 + 5000, Create: true}
	l := build(t, env, specFor(4, 4096))
	defer l.Close()
	if l.Size() != env.Size {
		t.Fatalf("size %d, want %d", l.Size(), env.Size)
	}
	// ceil((1 MiB + 5000) / 12 KiB) stripes of 4 KiB per leg
	if want := int64((1<<20+5000+12287)/12288) * 4096; l.Children()[0].Size() != want {
		t.Fatalf("leg size %d, want %d", l.Children()[0].Size(), want)
	}
	// Left-symmetric: parity on leg 3, 2, 1, 0, 3, …; data chunk d right after it.
	for s, p := range []int{3, 2, 1, 0, 3} {
		if got := l.parityLeg(int64(s)); got != p {
			t.Fatalf("stripe %d parity on leg %d, want %d", s, got, p)
		}
		for d := range 3 {
			if got := l.dataLeg(int64(s), d); got != (p+1+d)%4 || l.dataIndex(int64(s), got) != d {
				t.Fatalf("stripe %d chunk %d on leg %d", s, d, got)
			}
		}
	}
	// Logical chunk 4 (stripe 1, chunk 1) is on leg (2+1+1)%4 = 0 at 4096.
	p := bytes.Repeat([]byte{0xab}, 4096)
	if err := l.WriteAt(p, 4*4096, true); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(legPath(env, 0))
	if err != nil || !bytes.Equal(raw[4096:8192], p) {
		t.Fatalf("chunk 4 not on leg 0 at 4096 (%v)", err)
	}
}

// loseLeg deletes leg i's file: the next open finds it gone.
func loseLeg(t testing.TB, env block.Env, i int) {
	t.Helper()
	if err := os.Remove(legPath(env, i)); err != nil {
		t.Fatal(err)
	}
}

func TestLoseEachLegReadWriteRepair(t *testing.T) {
	t.Parallel()
	const n, chunk = 4, 4096
	spec := specFor(n, chunk)
	for lose := range n {
		t.Run(fmt.Sprint("leg", lose), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(lose), 7))
			env := block.Env{Dir: t.TempDir(), Size: 512 << 10, Create: true}
			l := build(t, env, spec)
			model := make([]byte, l.Size())
			randomOps(t, l, model, rng, 30)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			checkParity(t, env, n, chunk)

			loseLeg(t, env, lose)
			env.Create = false
			l = build(t, env, spec)
			if st := l.Describe().State; st != block.StateDegraded {
				t.Fatalf("state %s after losing a leg", st)
			}
			mustRead(t, l, model, "degraded")
			randomOps(t, l, model, rng, 30)
			mustRead(t, l, model, "degraded after writes")
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}

			// Still degraded after a restart, and the failure is persisted.
			l = build(t, env, spec)
			mustRead(t, l, model, "degraded after reopen")
			var calls int
			if err := l.Repair(context.Background(), func(done, total int64) { calls++ }); err != nil {
				t.Fatal(err)
			}
			if d := l.Describe(); d.State != block.StateOK || calls == 0 {
				t.Fatalf("after repair: %s (%d progress calls)", d.State, calls)
			}
			mustRead(t, l, model, "repaired")
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			checkParity(t, env, n, chunk)

			// The rebuilt leg and the parity are right: lose another leg.
			loseLeg(t, env, (lose+1)%n)
			l = build(t, env, spec)
			defer l.Close()
			mustRead(t, l, model, "rebuilt, another leg lost")
		})
	}
}

// A leg that fails at runtime (here: its file layer is closed under the
// parity layer, so every I/O to it fails) is marked failed durably while
// the writes go on; Repair reopens the same file from its spec and
// rebuilds it.
func TestRuntimeFailureAndRepairInPlace(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	spec := specFor(n, chunk)
	rng := rand.New(rand.NewPCG(3, 3))
	env := block.Env{Dir: t.TempDir(), Size: 512 << 10, Create: true}
	l := build(t, env, spec)
	model := make([]byte, l.Size())
	randomOps(t, l, model, rng, 30)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	l.Children()[1].Close()
	randomOps(t, l, model, rng, 40)
	if st := l.Describe().State; st != block.StateDegraded {
		t.Fatalf("state %s after a leg's I/O failed", st)
	}
	mustRead(t, l, model, "after runtime failure")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// The file still exists but is stale: it must stay failed.
	env.Create = false
	l = build(t, env, spec)
	if d := l.Describe(); d.State != block.StateDegraded || d.Children[1].State != block.StateFailed {
		t.Fatalf("failure not persisted: %+v", d)
	}
	mustRead(t, l, model, "reopened degraded")
	tryReads(t, l, model, chunk, "reopened degraded") // never from the stale leg
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	mustRead(t, l, model, "repaired in place")
	l.Close()
	checkParity(t, env, n, chunk)
	loseLeg(t, env, 0)
	l = build(t, env, spec)
	defer l.Close()
	mustRead(t, l, model, "repaired, leg 0 lost")
}

// A leg whose backing file vanishes while open is noticed at Flush.
func TestVanishedLegNoticedAtFlush(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	spec := specFor(n, chunk)
	env := block.Env{Dir: t.TempDir(), Size: 256 << 10, Create: true}
	l := build(t, env, spec)
	model := make([]byte, l.Size())
	randomOps(t, l, model, rand.New(rand.NewPCG(4, 4)), 20)
	loseLeg(t, env, 2)
	if st := l.Describe().State; st != block.StateDegraded {
		t.Fatalf("describe before flush: %s", st)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if l.state[2] != legFailed {
		t.Fatal("vanished leg not marked failed at flush")
	}
	randomOps(t, l, model, rand.New(rand.NewPCG(5, 5)), 20)
	l.Close()
	env.Create = false
	l = build(t, env, spec)
	defer l.Close()
	mustRead(t, l, model, "after vanish")
}

func TestInterruptedRebuildResumes(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	spec := specFor(n, chunk)
	rng := rand.New(rand.NewPCG(6, 6))
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := build(t, env, spec)
	model := make([]byte, l.Size())
	randomOps(t, l, model, rng, 50)
	l.Close()
	loseLeg(t, env, 0)
	env.Create = false
	l = build(t, env, spec)
	l.batchStripes = 16 // 128 stripes: 8 batches
	ctx, cancel := context.WithCancel(context.Background())
	var last int64
	err := l.Repair(ctx, func(done, total int64) {
		last = done
		if done > 0 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("repair: %v, want canceled", err)
	}
	d := l.Describe()
	if d.State != block.StateRebuilding || d.Progress == nil || *d.Progress <= 0 || *d.Progress >= 100 {
		t.Fatalf("after interrupting: %s %v (last %d)", d.State, d.Progress, last)
	}
	first := l.TakeResynced()
	if first <= 0 || first >= l.Size() || l.TakeResynced() != 0 {
		t.Fatalf("TakeResynced after an interrupted rebuild: %d of %d", first, l.Size())
	}
	// Writes during a rebuild: done and undone stripes alike.
	randomOps(t, l, model, rng, 40)
	mustRead(t, l, model, "mid-rebuild")
	l.Close()

	// The next open resumes in the background.
	l = build(t, env, spec)
	deadline := time.Now().Add(10 * time.Second)
	for l.Describe().State != block.StateOK {
		if time.Now().After(deadline) {
			t.Fatalf("rebuild did not resume: %+v", l.Describe())
		}
		time.Sleep(5 * time.Millisecond)
	}
	mustRead(t, l, model, "resumed rebuild")
	// The resumed rebuild did only what the interrupted one left: every
	// stripe was rebuilt exactly once over the two runs.
	if second := l.TakeResynced(); first+second != l.Size() {
		t.Fatalf("rebuilt %d bytes before the interruption and %d after, want %d in all", first, second, l.Size())
	}
	l.Close()
	checkParity(t, env, n, chunk)
	loseLeg(t, env, 2)
	l = build(t, env, spec)
	defer l.Close()
	mustRead(t, l, model, "rebuilt, leg 2 lost")
}

// Writes and reads race with a rebuild; every byte must be right at the
// end and with another leg lost after it.
func TestWritesDuringRebuild(t *testing.T) {
	t.Parallel()
	const n, chunk = 4, 4096
	spec := specFor(n, chunk)
	env := block.Env{Dir: t.TempDir(), Size: 4 << 20, Create: true}
	l := build(t, env, spec)
	model := make([]byte, l.Size())
	randomOps(t, l, model, rand.New(rand.NewPCG(8, 8)), 40)
	l.Close()
	loseLeg(t, env, 3)
	env.Create = false
	l = build(t, env, spec)
	var wg sync.WaitGroup
	var rerr error
	wg.Go(func() { rerr = l.Repair(context.Background(), nil) })
	// Each writer owns an interleaved set of 3 KiB slots (unaligned,
	// sharing stripes with the others).
	const slot = 3072
	workers := 4
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for range 60 {
				k := rng.Int64N(int64(len(model))/slot/int64(workers))*int64(workers) + int64(w)
				p := randBytes(rng, slot)
				if err := l.WriteAt(p, k*slot, false); err != nil {
					t.Error(err)
					return
				}
				copy(model[k*slot:], p)
				got := make([]byte, slot)
				if err := l.ReadAt(got, k*slot); err != nil || !bytes.Equal(got, p) {
					t.Errorf("read back %d: %v", k, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if rerr != nil {
		t.Fatal(rerr)
	}
	mustRead(t, l, model, "after rebuild with writes")
	l.Close()
	checkParity(t, env, n, chunk)
	loseLeg(t, env, 1)
	l = build(t, env, spec)
	defer l.Close()
	mustRead(t, l, model, "leg 1 lost after rebuild")
}

// Concurrent unaligned writers sharing stripes, healthy and degraded.
func TestConcurrentSharedStripes(t *testing.T) {
	t.Parallel()
	for _, degraded := range []bool{false, true} {
		t.Run(fmt.Sprint("degraded=", degraded), func(t *testing.T) {
			t.Parallel()
			const n, chunk = 3, 4096
			spec := specFor(n, chunk)
			env := block.Env{Dir: t.TempDir(), Size: 256 << 10, Create: true}
			l := build(t, env, spec)
			if degraded {
				l.Close()
				loseLeg(t, env, 1)
				env.Create = false
				l = build(t, env, spec)
			}
			model := make([]byte, l.Size())
			const slot = 1000
			workers := 6
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 11))
					for range 60 {
						k := rng.Int64N(int64(len(model))/slot/int64(workers))*int64(workers) + int64(w)
						p := randBytes(rng, slot)
						if err := l.WriteAt(p, k*slot, rng.IntN(8) == 0); err != nil {
							t.Error(err)
							return
						}
						copy(model[k*slot:], p) // each worker owns its slots
						if rng.IntN(10) == 0 {
							if err := l.Flush(); err != nil {
								t.Error(err)
								return
							}
						}
					}
				})
			}
			wg.Wait()
			mustRead(t, l, model, "after concurrent writes")
			l.Close()
			env.Create = false
			if !degraded {
				checkParity(t, env, n, chunk)
				loseLeg(t, env, 0)
			}
			l = build(t, env, spec)
			defer l.Close()
			mustRead(t, l, model, "one leg lost")
		})
	}
}

// The write hole: a crash after a stripe's data chunk landed but before
// its parity did. Simulated by writing the data chunk straight into the
// leg file while the layer has the stripe's intent bit set, then
// abandoning the layer (no Close: a crash). The next open must recompute
// the parity, so losing another leg of the stripe reconstructs it right.
func TestWriteHoleRecomputedOnOpen(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	spec := specFor(n, chunk)
	env := block.Env{Dir: t.TempDir(), Size: 256 << 10, Create: true}
	l := build(t, env, spec)
	rng := rand.New(rand.NewPCG(12, 12))
	model := randBytes(rng, l.Size())
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	const s = 5
	// An update of stripe 5 through the layer (its intent bit is now set
	// and durable) ...
	p := randBytes(rng, 100)
	if err := l.WriteAt(p, s*2*chunk+10, false); err != nil {
		t.Fatal(err)
	}
	copy(model[s*2*chunk+10:], p)
	// ... and another one whose data chunk lands but whose parity does not.
	d := 1
	leg := l.dataLeg(s, d)
	newChunk := randBytes(rng, chunk)
	f, err := os.OpenFile(legPath(env, leg), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(newChunk, s*chunk); err != nil {
		t.Fatal(err)
	}
	f.Close()
	copy(model[s*2*chunk+int64(d)*chunk:], newChunk)
	// Crash: the layer is abandoned, its files stay as they are.
	other := l.dataLeg(s, 0)
	if parityError(env, n, chunk) == nil {
		t.Fatal("the simulated write hole is not there")
	}
	env.Create = false
	l = build(t, env, spec)
	mustRead(t, l, model, "after recovery")
	l.Close()
	checkParity(t, env, n, chunk)
	loseLeg(t, env, other)
	l = build(t, env, spec)
	defer l.Close()
	mustRead(t, l, model, "after recovery, another leg lost")
}

// The write hole while degraded: stripe s has its chunk on the missing
// leg m; an update of s crashes with part of it landed. Recomputing parity
// from the present data would change what the missing chunk reconstructs
// to; the journal keeps it right.
func TestWriteHoleWhileDegraded(t *testing.T) {
	t.Parallel()
	const n, chunk = 4, 4096
	spec := specFor(n, chunk)
	dsz := int64(n-1) * chunk
	for _, touchMissing := range []bool{false, true} {
		t.Run(fmt.Sprint("touch-missing=", touchMissing), func(t *testing.T) {
			t.Parallel()
			env := block.Env{Dir: t.TempDir(), Size: 256 << 10, Create: true}
			l := build(t, env, spec)
			rng := rand.New(rand.NewPCG(13, 13))
			model := randBytes(rng, l.Size())
			if err := l.WriteAt(model, 0, false); err != nil {
				t.Fatal(err)
			}
			l.Close()
			const s = 6
			m := l.dataLeg(s, 2) // the missing leg holds data chunk 2 of stripe 6
			loseLeg(t, env, m)
			env.Create = false
			l = build(t, env, spec)
			mustRead(t, l, model, "degraded")
			if touchMissing {
				// Write into the missing chunk: its new content exists only
				// in the parity and the journal. Then the crash "undoes" the
				// parity write.
				par := l.parityLeg(s)
				old, err := os.ReadFile(legPath(env, par))
				if err != nil {
					t.Fatal(err)
				}
				p := randBytes(rng, 1000)
				if err := l.WriteAt(p, s*dsz+2*chunk+50, false); err != nil {
					t.Fatal(err)
				}
				copy(model[s*dsz+2*chunk+50:], p)
				f, _ := os.OpenFile(legPath(env, par), os.O_WRONLY, 0)
				f.WriteAt(old[s*chunk:(s+1)*chunk], s*chunk)
				f.Close()
			} else {
				// Write chunk 0 (journals chunk 2), then a second update of
				// chunk 1 lands its data but not its parity.
				p := randBytes(rng, 500)
				if err := l.WriteAt(p, s*dsz+20, false); err != nil {
					t.Fatal(err)
				}
				copy(model[s*dsz+20:], p)
				leg := l.dataLeg(s, 1)
				q := randBytes(rng, chunk)
				f, _ := os.OpenFile(legPath(env, leg), os.O_WRONLY, 0)
				f.WriteAt(q, s*chunk)
				f.Close()
				copy(model[s*dsz+chunk:], q)
			}
			// crash (abandon), reopen still degraded
			l = build(t, env, spec)
			if l.lost.Load() != 0 {
				t.Fatal("journaled stripe marked lost")
			}
			mustRead(t, l, model, "recovered while degraded")
			if err := l.Repair(context.Background(), nil); err != nil {
				t.Fatal(err)
			}
			l.Close()
			checkParity(t, env, n, chunk)
			loseLeg(t, env, l.dataLeg(s, 0))
			l = build(t, env, spec)
			defer l.Close()
			mustRead(t, l, model, "repaired, another leg lost")
		})
	}
}

// A crash interrupts a healthy update and the restart finds a leg holding
// a data chunk of that stripe gone: that chunk cannot be recovered. It
// must read as EIO (persistently), never as reconstructed garbage, while
// everything else reads right; overwriting it whole heals it.
func TestLostChunkAfterCrashWithLegLoss(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	spec := specFor(n, chunk)
	dsz := int64(n-1) * chunk
	env := block.Env{Dir: t.TempDir(), Size: 256 << 10, Create: true}
	l := build(t, env, spec)
	rng := rand.New(rand.NewPCG(14, 14))
	model := randBytes(rng, l.Size())
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	l.Close() // a clean shutdown: nothing dirty
	env.Create = false
	l = build(t, env, spec)
	const s = 9
	p := randBytes(rng, 64)
	if err := l.WriteAt(p, s*dsz, false); err != nil { // chunk 0 of stripe 9: intent set
		t.Fatal(err)
	}
	copy(model[s*dsz:], p)
	// crash mid-update: chunk 0's data changed, parity not
	q := randBytes(rng, 64)
	f, _ := os.OpenFile(legPath(env, l.dataLeg(s, 0)), os.O_WRONLY, 0)
	f.WriteAt(q, s*chunk+100)
	f.Close()
	copy(model[s*dsz+100:], q)
	m := l.dataLeg(s, 1)
	loseLeg(t, env, m)
	for range 2 { // lost is persisted
		l = build(t, env, spec)
		got := make([]byte, chunk)
		if err := l.ReadAt(got, s*dsz+chunk); !errors.Is(err, syscall.EIO) {
			t.Fatalf("read of the lost chunk: %v, want EIO", err)
		}
		if l.Describe().State != block.StateDegraded {
			t.Fatal("not degraded")
		}
		mustRead(t, l, model[:s*dsz+chunk], "before the lost chunk")
		rest := make([]byte, l.Size()-(s+1)*dsz)
		if err := l.ReadAt(rest, (s+1)*dsz); err != nil || !bytes.Equal(rest, model[(s+1)*dsz:]) {
			t.Fatalf("after the lost chunk: %v", err)
		}
		l.Close()
	}
	l = build(t, env, spec)
	// A partial write leaves it lost; a whole-chunk write heals it.
	if err := l.WriteAt(make([]byte, 10), s*dsz+chunk, false); err != nil {
		t.Fatal(err)
	}
	if err := l.ReadAt(make([]byte, 1), s*dsz+chunk); !errors.Is(err, syscall.EIO) {
		t.Fatalf("partially overwritten lost chunk: %v", err)
	}
	heal := randBytes(rng, chunk)
	if err := l.WriteAt(heal, s*dsz+chunk, false); err != nil {
		t.Fatal(err)
	}
	copy(model[s*dsz+chunk:], heal)
	mustRead(t, l, model, "healed")
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if st := l.Describe().State; st != block.StateOK {
		t.Fatalf("state %s", st)
	}
	l.Close()
	checkParity(t, env, n, chunk)
	loseLeg(t, env, l.parityLeg(s))
	l = build(t, env, spec)
	defer l.Close()
	mustRead(t, l, model, "healed, repaired, parity leg lost")
}

func TestResize(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	spec := specFor(n, chunk)
	env := block.Env{Dir: t.TempDir(), Size: 100 << 10, Create: true}
	l := build(t, env, spec)
	rng := rand.New(rand.NewPCG(15, 15))
	model := randBytes(rng, l.Size())
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Resize(50 << 10); err == nil {
		t.Fatal("shrink accepted")
	}
	if err := l.Resize(300<<10 + 1); err != nil {
		t.Fatal(err)
	}
	if l.Size() != 300<<10+1 {
		t.Fatalf("size %d", l.Size())
	}
	model = append(model, make([]byte, l.Size()-int64(len(model)))...)
	mustRead(t, l, model, "grown")
	randomOps(t, l, model, rng, 30)
	l.Close()
	checkParity(t, env, n, chunk)
	env.Create = false
	l = build(t, env, spec)
	if l.Size() != 300<<10+1 {
		t.Fatalf("size after reopen %d", l.Size())
	}
	mustRead(t, l, model, "grown, reopened")
	l.Close()
	// Grown while degraded; the replacement is created at the new size.
	loseLeg(t, env, 0)
	l = build(t, env, spec)
	if err := l.Resize(400 << 10); err != nil {
		t.Fatal(err)
	}
	model = append(model, make([]byte, l.Size()-int64(len(model)))...)
	randomOps(t, l, model, rng, 30)
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	l.Close()
	checkParity(t, env, n, chunk)
	loseLeg(t, env, 1)
	l = build(t, env, spec)
	defer l.Close()
	mustRead(t, l, model, "grown degraded, repaired, leg 1 lost")
}

func TestExtentsAndZeroes(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	spec := specFor(n, chunk)
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := build(t, env, spec)
	ex, err := l.Extents(0, l.Size())
	if err != nil || len(ex) != 1 || !ex[0].Hole || !ex[0].Zero {
		t.Fatalf("fresh device: %+v %v", ex, err)
	}
	if err := l.WriteAt(bytes.Repeat([]byte{1}, 100), 3*chunk+5, false); err != nil {
		t.Fatal(err)
	}
	// Stripe 1 = [8K, 16K): chunk 1 (12K..16K) has data; chunk 0 is a
	// hole on its leg but not on the parity leg: zero, not a hole.
	ex, _ = l.Extents(2*chunk, chunk)
	if len(ex) != 1 || !ex[0].Zero || ex[0].Hole {
		t.Fatalf("chunk beside written data: %+v", ex)
	}
	ex, _ = l.Extents(3*chunk, chunk)
	if ex[0].Zero {
		t.Fatalf("written chunk reported zero: %+v", ex)
	}
	// Fast zeroing of whole stripes punches holes everywhere.
	if err := l.WriteZeroes(2*chunk, 2*chunk, block.ZeroFlags{Fast: true}); err != nil {
		t.Fatal(err)
	}
	ex, _ = l.Extents(0, l.Size())
	if len(ex) != 1 || !ex[0].Hole {
		t.Fatalf("after zeroing: %+v", ex)
	}
	if err := l.WriteZeroes(chunk, 100, block.ZeroFlags{Fast: true}); !errors.Is(err, block.ErrNotSupported) {
		t.Fatalf("fast zero of a partial stripe: %v", err)
	}
	l.Close()
	// Degraded: a missing chunk is zero where all the others are.
	loseLeg(t, env, l.dataLeg(0, 0))
	env.Create = false
	l = build(t, env, spec)
	defer l.Close()
	ex, _ = l.Extents(0, chunk)
	if len(ex) != 1 || !ex[0].Zero {
		t.Fatalf("missing zero chunk: %+v", ex)
	}
}

func TestParamsAndMetadataErrors(t *testing.T) {
	t.Parallel()
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	for _, js := range []string{
		`{"type":"parity","params":{"chunk":1000},"children":[{"type":"file","params":{"path":"a"}},{"type":"file","params":{"path":"b"}},{"type":"file","params":{"path":"c"}}]}`,
		`{"type":"parity","params":{"colour":"red"},"children":[{"type":"file","params":{"path":"d"}},{"type":"file","params":{"path":"e"}},{"type":"file","params":{"path":"f"}}]}`,
		`{"type":"parity","children":[{"type":"file","params":{"path":"g"}},{"type":"file","params":{"path":"h"}}]}`,
	} {
		if l, err := block.Build(env, blocktest.Spec(t, js)); err == nil {
			l.Close()
			t.Errorf("Build(%s) accepted it", js)
		}
	}
	spec := specFor(3, 4096)
	l := build(t, env, spec)
	l.Close()
	// Creating again over the same metadata is refused.
	for i := range 3 {
		os.Remove(legPath(env, i))
	}
	if l, err := block.Build(env, blocktest.Spec(t, spec)); err == nil {
		l.Close()
		t.Fatal("created over existing metadata")
	}
	// A different chunk than the one it was made with.
	env2 := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	build(t, env2, spec).Close()
	env2.Create = false
	if l, err := block.Build(env2, blocktest.Spec(t, specFor(3, 8192))); err == nil {
		l.Close()
		t.Fatal("opened with another chunk")
	}
	// Empty metadata on open means corruption.
	if err := os.Truncate(filepath.Join(env2.Dir, DefaultMeta), 0); err != nil {
		t.Fatal(err)
	}
	if l, err := block.Build(env2, blocktest.Spec(t, spec)); err == nil {
		l.Close()
		t.Fatal("opened with empty metadata")
	}
}

// Two legs lost: the layer opens failed; what is on the remaining legs
// reads, the rest is EIO, and nothing is written.
func TestTwoLegsLost(t *testing.T) {
	t.Parallel()
	const n, chunk = 4, 4096
	spec := specFor(n, chunk)
	env := block.Env{Dir: t.TempDir(), Size: 256 << 10, Create: true}
	l := build(t, env, spec)
	model := randBytes(rand.New(rand.NewPCG(16, 16)), l.Size())
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	l.Close()
	loseLeg(t, env, 0)
	loseLeg(t, env, 1)
	env.Create = false
	l = build(t, env, spec)
	defer l.Close()
	if st := l.Describe().State; st != block.StateFailed {
		t.Fatalf("state %s", st)
	}
	// Stripe 0: parity on leg 3, chunk 0 on leg 0 (lost), chunk 2 on leg 2.
	got := make([]byte, chunk)
	if err := l.ReadAt(got, 2*chunk); err != nil || !bytes.Equal(got, model[2*chunk:3*chunk]) {
		t.Fatalf("chunk on a present leg: %v", err)
	}
	if err := l.ReadAt(got, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("chunk on a lost leg: %v", err)
	}
	if err := l.WriteAt(got, 0, false); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write: %v", err)
	}
	if err := l.Repair(context.Background(), nil); err == nil {
		t.Fatal("repair with two legs lost succeeded")
	}
}

// A second leg failing at runtime freezes the layer without persisting
// anything: once that leg is back, the next open is merely degraded and
// every acknowledged write is there. Two legs gone at open likewise leave
// the metadata alone.
func TestSecondFailureIsNotPersisted(t *testing.T) {
	t.Parallel()
	const n, chunk = 4, 4096
	spec := specFor(n, chunk)
	env := block.Env{Dir: t.TempDir(), Size: 256 << 10, Create: true}
	l := build(t, env, spec)
	rng := rand.New(rand.NewPCG(17, 17))
	model := randBytes(rng, l.Size())
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	l.Close()
	loseLeg(t, env, 0)
	env.Create = false
	l = build(t, env, spec)
	randomOps(t, l, model, rng, 20)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	l.Children()[2].Close() // leg 2 now fails every I/O
	p := randBytes(rng, 3*chunk)
	if err := l.WriteAt(p, 0, false); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write with two legs out: %v", err)
	}
	clear(model[:3*chunk]) // unacknowledged: old or new, not checked below
	if st := l.Describe().State; st != block.StateFailed {
		t.Fatalf("state %s", st)
	}
	if err := l.WriteAt(p, 40*chunk, false); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write while frozen: %v", err)
	}
	l.Close()
	l = build(t, env, spec) // leg 2's file is fine: only leg 0 is out
	if d := l.Describe(); d.State != block.StateDegraded || d.Children[2].State != block.StateOK {
		t.Fatalf("after reopen: %+v", d)
	}
	got := make([]byte, l.Size()-3*chunk)
	if err := l.ReadAt(got, 3*chunk); err != nil || !bytes.Equal(got, model[3*chunk:]) {
		t.Fatalf("acknowledged data after the freeze: %v", err)
	}
	l.Close()

	meta, err := os.ReadFile(filepath.Join(env.Dir, DefaultMeta))
	if err != nil {
		t.Fatal(err)
	}
	loseLeg(t, env, 3)
	l = build(t, env, spec)
	if st := l.Describe().State; st != block.StateFailed {
		t.Fatalf("two legs gone: %s", st)
	}
	l.Close()
	after, _ := os.ReadFile(filepath.Join(env.Dir, DefaultMeta))
	if !bytes.Equal(meta, after) {
		t.Fatal("metadata changed by an open with two legs gone")
	}
}

// A read-only open of a degraded layer left dirty by a crash recovers
// nothing (it may not write): it serves what it can, refuses to
// reconstruct from parity that may be stale, and leaves the metadata as
// it found it.
func TestReadOnlyOpen(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	spec := specFor(n, chunk)
	dsz := int64(n-1) * chunk
	env := block.Env{Dir: t.TempDir(), Size: 128 << 10, Create: true}
	l := build(t, env, spec)
	model := randBytes(rand.New(rand.NewPCG(18, 18)), l.Size())
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	l.Close()
	env.Create = false
	l = build(t, env, spec)
	if err := l.WriteAt(model[:10], 4*dsz, false); err != nil { // stripe 4 dirty
		t.Fatal(err)
	}
	copy(model[4*dsz:], model[:10])
	// crash (abandon l); leg holding stripe 4's chunk 1 is lost
	m := l.dataLeg(4, 1)
	loseLeg(t, env, m)
	meta, _ := os.ReadFile(filepath.Join(env.Dir, DefaultMeta))
	env.ReadOnly = true
	l = build(t, env, spec)
	defer l.Close()
	if !l.Capabilities().ReadOnly {
		t.Fatal("not read-only")
	}
	if err := l.WriteAt(model[:10], 0, false); !errors.Is(err, block.ErrReadOnly) {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, chunk)
	if err := l.ReadAt(got, 4*dsz+chunk); !errors.Is(err, syscall.EIO) {
		t.Fatalf("reconstruction from unrecovered parity: %v", err)
	}
	if err := l.ReadAt(got, 4*dsz); err != nil || !bytes.Equal(got, model[4*dsz:4*dsz+chunk]) {
		t.Fatalf("chunk on a present leg: %v", err)
	}
	for s := int64(0); s < l.stripes.Load(); s++ { // clean stripes reconstruct fine
		if s == 4 {
			continue
		}
		if err := l.ReadAt(got, s*dsz+int64(l.dataIndex(s, m))*chunk); err != nil && l.dataIndex(s, m) < n-1 {
			t.Fatalf("stripe %d: %v", s, err)
		}
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(env.Dir, DefaultMeta))
	if !bytes.Equal(meta, after) {
		t.Fatal("read-only open changed the metadata")
	}
}

// Concurrent writers on disjoint byte ranges that share stripes while a
// leg starts failing its writes part way (torn: half of each lands): every
// write is acknowledged (the leg is taken out), then every byte reads as
// written — degraded, after a reopen, after a repair — and the parity
// matches the data.
func TestConcurrentWritesWhileLegFails(t *testing.T) {
	t.Parallel()
	const n, chunk = 4, 4096
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			spec, faults := faultySpec(t, n, chunk)
			env := block.Env{Dir: t.TempDir(), Size: 1<<20 + 1000, Create: true}
			l := build(t, env, spec)
			model := make([]byte, l.Size())
			const workers = 6
			per := l.Size() / workers
			bad := int(seed % n)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(seed, uint64(w)))
					from, end := int64(w)*per, int64(w+1)*per
					if w == workers-1 {
						end = l.Size()
					}
					for i := range 150 {
						off := from + rng.Int64N(end-from-1)
						n := min(rng.Int64N(9000)+1, end-off)
						var p []byte
						var err error
						switch rng.IntN(6) {
						case 0:
							err = l.WriteZeroes(off, n, block.ZeroFlags{})
							p = make([]byte, n)
						case 1:
							err = l.Flush()
						case 2:
							got := make([]byte, n)
							if err = l.ReadAt(got, off); err == nil && !bytes.Equal(got, model[off:off+n]) {
								t.Errorf("worker %d: read %d+%d differs from the model", w, off, n)
								return
							}
						default:
							p = randBytes(rng, n)
							err = l.WriteAt(p, off, rng.IntN(4) == 0)
						}
						if err != nil {
							t.Errorf("worker %d op %d: %v", w, i, err)
							return
						}
						copy(model[off:], p) // each worker owns its range
						if w == 0 && i == 40 {
							faults[bad].torn.Store(true)
							faults[bad].write.Store(true)
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			faults[bad].off()
			if l.state[bad] != legFailed {
				t.Fatalf("leg %d, failing its writes, not failed: %q", bad, l.state)
			}
			mustRead(t, l, model, "degraded")
			if seed%2 == 0 {
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				env.Create = false
				l = build(t, env, spec)
				mustRead(t, l, model, "reopened")
			}
			defer l.Close()
			if err := l.Repair(context.Background(), nil); err != nil {
				t.Fatal(err)
			}
			mustRead(t, l, model, "repaired")
			if err := l.Flush(); err != nil {
				t.Fatal(err)
			}
			checkParity(t, env, n, chunk)
		})
	}
}
