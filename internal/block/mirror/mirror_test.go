package mirror

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/superblock"
)

func TestConformance(t *testing.T) {
	t.Parallel() // touches no package state
	for name, spec := range map[string]string{
		"two legs, 4 KiB regions": mirrorSpec(`{"region":4096,"meta":"m.meta"}`, "a.img", "b.img"),
		"three legs, default":     mirrorSpec("", "a.img", "b.img", "c.img"),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := block.Env{Dir: t.TempDir(), Size: 8 << 20, Create: true}
			model := blocktest.Conformance(t, env, spec, 400)
			// Every leg alone holds the same bytes, and a clean close
			// left nothing to resynchronise.
			env.Create = false
			l := openMirror(t, env, spec)
			defer l.Close()
			if len(l.dirty) != 0 || l.needsResync() {
				t.Fatalf("clean close left %d dirty regions", len(l.dirty))
			}
			checkCopies(t, l, model)
		})
	}
}

func TestParamsAndMetadata(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := block.Env{Dir: dir, Size: 1 << 20, Create: true}
	for _, p := range []string{`{"region":1000}`, `{"region":2048}`, `{"regoin":65536}`, `{"meta":""}`} {
		if l, err := block.Build(env, blocktest.Spec(t, mirrorSpec(p, "x.img", "y.img"))); err == nil {
			l.Close()
			t.Errorf("params %s accepted", p)
		}
		os.Remove(filepath.Join(dir, "x.img"))
		os.Remove(filepath.Join(dir, "y.img"))
	}
	spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img")
	mustClose(t, openMirror(t, env, spec))

	// A second mirror in the same directory must not reuse the metadata.
	if l, err := block.Build(env, blocktest.Spec(t, mirrorSpec(`{"region":65536}`, "c.img", "d.img"))); err == nil {
		l.Close()
		t.Fatal("second mirror overwrote the first one's metadata")
	} else if !strings.Contains(err.Error(), "already holds data") {
		t.Fatalf("unexpected error %v", err)
	}
	mustClose(t, openMirror(t, env, mirrorSpec(`{"region":65536,"meta":"second.meta"}`, "e.img", "f.img")))

	env.Create = false
	for name, s := range map[string]string{
		"other region":   mirrorSpec(`{"region":131072}`, "a.img", "b.img"),
		"default region": mirrorSpec("", "a.img", "b.img"),
		"more legs":      mirrorSpec(`{"region":65536}`, "a.img", "b.img", "e.img"),
	} {
		if l, err := block.Build(env, blocktest.Spec(t, s)); err == nil {
			l.Close()
			t.Errorf("%s: opened against the recorded metadata", name)
		}
	}
	// An empty (lost) metadata file is corruption, not a new mirror.
	if err := os.Truncate(filepath.Join(dir, DefaultMeta), 0); err != nil {
		t.Fatal(err)
	}
	if l, err := block.Build(env, blocktest.Spec(t, spec)); err == nil {
		l.Close()
		t.Fatal("opened with empty metadata")
	}
}

// A leg whose file is deleted: the volume comes up degraded, keeps
// serving, and Repair creates a replacement and copies everything.
func TestDegradedThenRepairRecreates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := block.Env{Dir: dir, Size: 4 << 20, Create: true}
	spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img")
	l := openMirror(t, env, spec)
	model := fillAll(t, l, 1)
	mustClose(t, l)

	os.Remove(filepath.Join(dir, "b.img"))
	env.Create = false
	l = openMirror(t, env, spec)
	d := l.Describe()
	if d.State != block.StateDegraded || d.Children[1].State != block.StateFailed || d.Children[0].State != block.StateOK {
		t.Fatalf("describe after losing a leg: %+v", d)
	}
	// The leg that failed to open still says which file it is.
	if want := filepath.Join(dir, "b.img"); d.Children[1].Path != want {
		t.Fatalf("failed leg's path %q, want %q", d.Children[1].Path, want)
	}
	rng := rand.New(rand.NewPCG(2, 2))
	for range 20 {
		off := rng.Int64N(l.Size() - 70000)
		write(t, l, model, randBytes(rng, rng.Int64N(70000)+1), off)
	}
	checkAll(t, l, model)
	if err := l.ReadCopy(1, make([]byte, 10), 0); err == nil {
		t.Fatal("ReadCopy of a failed leg succeeded")
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	mustClose(t, l)

	l = openMirror(t, env, spec)
	if got := legStates(l); got[1] != legFailed {
		t.Fatalf("leg states after reopen: %v", got)
	}
	write(t, l, model, []byte("more degraded data"), 12345)
	var last, total int64
	if err := l.Repair(context.Background(), func(d, t int64) { last, total = d, t }); err != nil {
		t.Fatal(err)
	}
	if d := l.Describe(); d.State != block.StateOK || d.Children[1].State != block.StateOK {
		t.Fatalf("describe after repair: %+v", d)
	}
	if total != l.Size() || last != total || l.copied.Load() != l.Size() {
		t.Fatalf("a fresh leg copies everything: progress %d/%d, copied %d", last, total, l.copied.Load())
	}
	checkCopies(t, l, model)
	mustClose(t, l)

	l = openMirror(t, env, spec)
	defer l.Close()
	if l.needsResync() || l.Describe().State != block.StateOK {
		t.Fatalf("after repair and reopen: %v", legStates(l))
	}
	checkCopies(t, l, model)
}

// A leg that comes back after an outage costs only what changed meanwhile.
func TestLegReturnCopiesOnlyChangedRegions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const region = 65536
	env := block.Env{Dir: dir, Size: 4 << 20, Create: true}
	spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img")
	l := openMirror(t, env, spec)
	model := fillAll(t, l, 3)
	mustClose(t, l)

	away := filepath.Join(dir, "b.away")
	if err := os.Rename(filepath.Join(dir, "b.img"), away); err != nil {
		t.Fatal(err)
	}
	env.Create = false
	l = openMirror(t, env, spec)
	rng := rand.New(rand.NewPCG(4, 4))
	write(t, l, model, randBytes(rng, 100), 5*region+7)                        // region 5
	write(t, l, model, randBytes(rng, 4096), 17*region)                        // region 17
	write(t, l, model, randBytes(rng, 10), 17*region+60000)                    // region 17 again
	write(t, l, model, randBytes(rng, 8192), 31*region-4096)                   // regions 30 and 31
	write(t, l, model, randBytes(rng, 4096), l.Size()-4096)                    // the last region
	if err := l.WriteZeroes(40*region+1, 300, block.ZeroFlags{}); err != nil { // region 40
		t.Fatal(err)
	}
	clear(model[40*region+1 : 40*region+301])
	mustClose(t, l)
	if err := os.Rename(away, filepath.Join(dir, "b.img")); err != nil {
		t.Fatal(err)
	}

	// The leg opens again but stays failed until Repair: its data is old,
	// and no read may come from it.
	l = openMirror(t, env, spec)
	defer l.Close()
	if got := legStates(l); got[1] != legFailed {
		t.Fatalf("returned leg is %v", got)
	}
	if d := l.Describe(); d.State != block.StateDegraded || d.Children[1].State != block.StateFailed {
		t.Fatalf("describe: %+v", d)
	}
	for range 4 { // round-robin would reach leg 1
		checkAll(t, l, model)
	}
	var total int64
	if err := l.Repair(context.Background(), func(_, t int64) { total = t }); err != nil {
		t.Fatal(err)
	}
	const changed = 6 * region // regions 5, 17, 30, 31, 40 and the last
	if total != changed || l.copied.Load() != changed {
		t.Fatalf("repair copied %d bytes (progress total %d), want %d", l.copied.Load(), total, changed)
	}
	if got, again := l.TakeResynced(), l.TakeResynced(); got != changed || again != 0 {
		t.Fatalf("TakeResynced: %d then %d, want %d then 0", got, again, changed)
	}
	checkCopies(t, l, model)
}

// A rebuild stopped part-way (cancelled, or the layer closed) resumes on
// the next open from its last checkpoint, not from the start.
func TestInterruptedRebuildResumes(t *testing.T) {
	t.Parallel()
	const checkpoint = 4
	const region = 65536
	for _, how := range []string{"cancel", "close"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			env := block.Env{Dir: dir, Size: 4 << 20, Create: true}
			spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img")
			l := openMirror(t, env, spec)
			model := fillAll(t, l, 5)
			mustClose(t, l)
			os.Remove(filepath.Join(dir, "b.img"))
			env.Create = false
			l = openMirror(t, env, spec)
			l.checkpointEvery.Store(checkpoint)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			half := make(chan struct{})
			var once sync.Once
			var seen block.Node
			progress := func(done, total int64) {
				if done >= total/2 {
					once.Do(func() {
						seen = l.Describe()
						close(half)
						switch how {
						case "cancel":
							cancel()
						case "close":
							// Hold the repair here until Close has begun,
							// or it may finish the second half first.
							for !l.closed.Load() {
								time.Sleep(time.Millisecond)
							}
						}
					})
				}
			}
			errc := make(chan error, 1)
			go func() { errc <- l.Repair(ctx, progress) }()
			<-half
			if how == "close" {
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
			}
			err := <-errc
			if err == nil {
				t.Fatal("interrupted repair reported success")
			}
			if seen.State != block.StateRebuilding || seen.Progress == nil || *seen.Progress < 49 || *seen.Progress > 100 ||
				seen.Children[1].State != block.StateRebuilding {
				t.Fatalf("describe mid-rebuild: %+v", seen)
			}
			first := l.copied.Load()
			if how == "cancel" {
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("repair: %v", err)
				}
				if d := l.Describe(); d.State != block.StateDegraded {
					t.Fatalf("describe after cancel: %+v", d)
				}
				mustClose(t, l)
			}

			l = openMirror(t, env, spec)
			defer l.Close()
			if got := legStates(l); got[1] != legRebuilding {
				t.Fatalf("after reopen: %v", got)
			}
			l.bg.Wait()
			if got := legStates(l); got[1] != legOK {
				t.Fatalf("background rebuild did not finish: %v", got)
			}
			second := l.copied.Load()
			if second >= l.Size() || first+second > l.Size()+(checkpoint+1)*region {
				t.Fatalf("rebuild restarted: copied %d then %d of %d", first, second, l.Size())
			}
			checkCopies(t, l, model)
		})
	}
}

// Writes racing a rebuild land on every leg and are not overwritten by it.
func TestWritesDuringRebuild(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := block.Env{Dir: dir, Size: 4 << 20, Create: true}
	spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img", "c.img")
	l := openMirror(t, env, spec)
	model := fillAll(t, l, 7)
	mustClose(t, l)
	os.Remove(filepath.Join(dir, "b.img"))
	os.Remove(filepath.Join(dir, "c.img"))
	env.Create = false
	l = openMirror(t, env, spec)
	defer l.Close()
	l.checkpointEvery.Store(8)

	// Writer g owns the 4 KiB blocks b with b%4 == g, so the model is
	// exact, while every region sees all of them.
	const writers = 4
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for n := 0; ; n++ {
				select {
				case <-done:
					if n > 50 {
						return
					}
				default:
				}
				blk := rng.Int64N(l.Size()/4096/writers)*writers + int64(g)
				off := blk*4096 + rng.Int64N(4000)
				p := randBytes(rng, rng.Int64N(4096-off%4096)+1)
				if err := l.WriteAt(p, off, rng.IntN(8) == 0); err != nil {
					errs <- err
					return
				}
				copy(model[off:], p) // disjoint per writer
				got := make([]byte, len(p))
				if err := l.ReadAt(got, off); err != nil || string(got) != string(p) {
					errs <- fmt.Errorf("read back %d+%d: %v", off, len(p), err)
					return
				}
			}
		})
	}
	err := l.Repair(context.Background(), nil)
	close(done)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	if err != nil {
		t.Fatal(err)
	}
	checkCopies(t, l, model)
}

// A leg whose backing file is deleted while open is reported failed, and
// Repair replaces it — also when it was the last healthy copy, by first
// rebuilding the other leg from its still-open file.
func TestBackingDeletedWhileOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := block.Env{Dir: dir, Size: 2 << 20, Create: true}
	spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img")
	l := openMirror(t, env, spec)
	model := fillAll(t, l, 11)
	os.Remove(filepath.Join(dir, "b.img"))
	if d := l.Describe(); d.State != block.StateDegraded || d.Children[1].State != block.StateFailed {
		t.Fatalf("describe: %+v", d)
	}
	write(t, l, model, []byte("written after the delete"), 70000)
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b.img")); err != nil {
		t.Fatal("replacement leg not created")
	}
	checkCopies(t, l, model)
	mustClose(t, l)

	// Now b.img missing at open (leg 1 failed) and a.img, the only ok
	// leg, deleted while open.
	os.Remove(filepath.Join(dir, "b.img"))
	env.Create = false
	l = openMirror(t, env, spec)
	defer l.Close()
	os.Remove(filepath.Join(dir, "a.img"))
	if d := l.Describe(); d.State != block.StateFailed {
		t.Fatalf("describe with no healthy leg: %+v", d)
	}
	write(t, l, model, []byte("still served from the open file"), 300000)
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if d := l.Describe(); d.State != block.StateOK {
		t.Fatalf("after repair: %+v", d)
	}
	checkCopies(t, l, model)
}

// Injected I/O errors: a failing leg is marked failed durably and the
// operation still succeeds; a failing read is retried on another leg; the
// last healthy leg is never failed.
func TestLegErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	id := t.Name()
	spec := fmt.Sprintf(`{"type":"mirror","params":{"region":65536},"children":[
		{"type":"mirrortest-fail","params":{"id":%q},"children":[{"type":"file","params":{"path":"a.img"}}]},
		{"type":"mirrortest-fail","params":{"id":%q},"children":[{"type":"file","params":{"path":"b.img"}}]}]}`, id+"a", id+"b")
	sa, sb := faults(id+"a"), faults(id+"b")
	env := block.Env{Dir: dir, Size: 1 << 20, Create: true}
	l := openMirror(t, env, spec)
	model := fillAll(t, l, 13)

	sb.write.Store(true)
	write(t, l, model, []byte("leg b misses this"), 4096)
	if got := legStates(l); got[1] != legFailed {
		t.Fatalf("after a write error: %v", got)
	}
	sb.write.Store(false)
	// The last healthy leg's errors go to the caller; it is kept.
	sa.write.Store(true)
	if err := l.WriteAt([]byte("x"), 0, false); !errors.Is(err, errInjected) {
		t.Fatalf("write with the last leg failing: %v", err)
	}
	if got := legStates(l); got[0] != legOK {
		t.Fatalf("last leg failed: %v", got)
	}
	sa.write.Store(false)
	checkAll(t, l, model)
	mustClose(t, l)

	// The failure is durable: leg b opens fine but stays failed.
	env.Create = false
	l = openMirror(t, env, spec)
	if got := legStates(l); got[1] != legFailed {
		t.Fatalf("after reopen: %v", got)
	}
	checkAll(t, l, model)
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	checkCopies(t, l, model)

	// A read error fails that leg and the read is served by the other.
	sa.read.Store(true)
	for range 3 {
		checkAll(t, l, model)
	}
	if got := legStates(l); got[0] != legFailed || got[1] != legOK {
		t.Fatalf("after read errors: %v", got)
	}
	sa.read.Store(false)
	// Reads as the NBD server makes them — TryReadAt, then ReadAt when it
	// declines — meet a broken leg too, whichever leg the round robin
	// starts at (a TryReadAt that moved it on sent every retry to the
	// other leg).
	for start := range 2 {
		if err := l.Repair(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		for range start {
			checkAll(t, l, model)
		}
		sa.read.Store(true)
		for range 4 {
			p := make([]byte, 4096)
			if !l.TryReadAt(p, 0) {
				if err := l.ReadAt(p, 0); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(p, model[:4096]) {
				t.Fatal("read differs from the model")
			}
		}
		if got := legStates(l); got[0] != legFailed || got[1] != legOK {
			t.Fatalf("round robin at %d: after read errors met through TryReadAt: %v", start, got)
		}
		sa.read.Store(false)
	}
	// A flush error fails the leg; the flush succeeds on the other.
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	sb.flush.Store(true)
	write(t, l, model, []byte("before the failing flush"), 9000)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := legStates(l); got[1] != legFailed {
		t.Fatalf("after a flush error: %v", got)
	}
	sb.flush.Store(false)
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	checkCopies(t, l, model)
	mustClose(t, l)
}

// The write-intent map: bits persist before data, are cleared lazily, and
// after a crash the dirty regions (only those) are resynchronised, with
// reads of a region not yet resynchronised all served by one leg.
func TestDirtyRegionResync(t *testing.T) { // not parallel: sets beforeResync
	const region = 65536
	dir := t.TempDir()
	fs := blocktest.NewFaultFS()
	env := block.Env{Dir: dir, Size: 1 << 20, Create: true, MetaFS: fs.Open}
	spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img")
	l := openMirror(t, env, spec)
	l.clearDelay.Store(0)
	model := fillAll(t, l, 17)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(l.dirty) != 0 {
		t.Fatalf("%d intent bits left after two quiet flushes", len(l.dirty))
	}
	n := fs.Writes()
	write(t, l, model, []byte("once"), 3*region)
	if fs.Writes() != n+1 {
		t.Fatalf("setting a bit took %d metadata writes", fs.Writes()-n)
	}
	write(t, l, model, []byte("twice"), 3*region+100)
	if fs.Writes() != n+1 {
		t.Fatal("a write into a dirty region wrote metadata")
	}
	if err := l.Flush(); err != nil || len(l.dirty) != 1 {
		t.Fatalf("one flush after a write: %v, %d dirty", err, len(l.dirty))
	}

	// Simulate a write that reached leg a but not leg b, and a crash.
	w := []byte("only on leg a before the crash")
	write(t, l, model, w, 3*region+200)
	bf, err := os.OpenFile(filepath.Join(dir, "b.img"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bf.Close()
	if _, err := bf.WriteAt(make([]byte, len(w)), 3*region+200); err != nil {
		t.Fatal(err)
	}
	crashed := fs.Restart()
	l.Close() // the machine is down: its metadata calls fail

	hold := make(chan struct{})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(hold) }) }
	beforeResync = func() { <-hold }
	defer func() { beforeResync = nil }()
	env.Create, env.MetaFS = false, crashed.Open
	l = openMirror(t, env, spec)
	defer l.Close()
	defer release() // before Close, also when the test fails early
	if l.unsynced != 1 {
		t.Fatalf("%d unsynced regions, want 1", l.unsynced)
	}
	for range 6 { // all from leg a, never the other
		checkAll(t, l, model)
		if err := l.Flush(); err != nil { // must not clear the region
			t.Fatal(err)
		}
	}
	release()
	l.bg.Wait()
	if l.copied.Load() != region {
		t.Fatalf("resync copied %d bytes, want one region", l.copied.Load())
	}
	checkCopies(t, l, model)
	if len(l.dirty) != 0 {
		t.Fatalf("%d intent bits left after the resync", len(l.dirty))
	}
}

func TestResize(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := block.Env{Dir: dir, Size: 1 << 20, Create: true}
	spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img")
	l := openMirror(t, env, spec)
	model := fillAll(t, l, 19)
	if err := l.Resize(l.Size() - 1); err == nil {
		t.Fatal("shrink accepted")
	}
	if err := l.Resize(block.MaxSize + 1); err == nil {
		t.Fatal("a size beyond block.MaxSize accepted")
	}
	if err := l.Resize(3<<20 + 1000); err != nil {
		t.Fatal(err)
	}
	model = append(model, make([]byte, 2<<20+1000)...)
	write(t, l, model, []byte("at the new end"), l.Size()-14)
	mustClose(t, l)

	// Grow while degraded; the returning leg grows during Repair.
	away := filepath.Join(dir, "b.away")
	os.Rename(filepath.Join(dir, "b.img"), away)
	env.Create = false
	l = openMirror(t, env, spec)
	if l.Size() != 3<<20+1000 {
		t.Fatalf("size after reopen %d", l.Size())
	}
	if err := l.Resize(5 << 20); err != nil {
		t.Fatal(err)
	}
	model = append(model, make([]byte, 5<<20-len(model))...)
	write(t, l, model, []byte("beyond the old end"), 4<<20)
	mustClose(t, l)
	os.Rename(away, filepath.Join(dir, "b.img"))
	l = openMirror(t, env, spec)
	defer l.Close()
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	checkCopies(t, l, model)
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := block.Env{Dir: dir, Size: 1 << 20, Create: true}
	spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img")
	l := openMirror(t, env, spec)
	model := fillAll(t, l, 23)
	mustClose(t, l)
	meta, _ := os.ReadFile(filepath.Join(dir, DefaultMeta))
	env.Create, env.ReadOnly = false, true
	l = openMirror(t, env, spec)
	if !l.Capabilities().ReadOnly || !errors.Is(l.WriteAt([]byte("x"), 0, false), block.ErrReadOnly) ||
		!errors.Is(l.Repair(context.Background(), nil), block.ErrReadOnly) {
		t.Fatal("read-only mirror accepted a change")
	}
	checkAll(t, l, model)
	mustClose(t, l)
	if after, _ := os.ReadFile(filepath.Join(dir, DefaultMeta)); string(after) != string(meta) {
		t.Fatal("read-only open changed the metadata")
	}
}

func TestRangeLockOrdersOverlaps(t *testing.T) {
	t.Parallel()
	var rl rangeLock
	queued := func(n int) {
		for {
			rl.mu.Lock()
			q := len(rl.q)
			rl.mu.Unlock()
			if q >= n {
				return
			}
		}
	}
	a := rl.lock(0, 100)
	b := rl.lock(100, 200) // disjoint: granted at once
	got := make(chan string, 2)
	go func() { c := rl.lock(50, 150); got <- "c"; rl.unlock(c) }()
	queued(3)
	go func() { d := rl.lock(140, 160); got <- "d"; rl.unlock(d) }() // behind b and c
	queued(4)
	rl.unlock(a)
	select {
	case s := <-got:
		t.Fatalf("%s granted while an overlapping holder remains", s)
	default:
	}
	rl.unlock(b)
	if first, second := <-got, <-got; first != "c" || second != "d" {
		t.Fatalf("order %s %s", first, second)
	}
}

// failSpec is a mirror whose legs are file legs behind fault switches ids.
func failSpec(params string, ids ...string) string {
	var kids []string
	for i, id := range ids {
		kids = append(kids, fmt.Sprintf(`{"type":"mirrortest-fail","params":{"id":%q},"children":[{"type":"file","params":{"path":"leg%d.img"}}]}`, id, i))
	}
	return fmt.Sprintf(`{"type":"mirror","params":%s,"children":[%s]}`, params, strings.Join(kids, ","))
}

// A leg that fails again in the middle of its rebuild keeps the stale
// bits of regions it missed, even those the rebuild had already copied
// but not yet checkpointed; the next Repair copies them.
func TestLegFailsDuringRebuild(t *testing.T) {
	t.Parallel()
	const region = 65536
	dir := t.TempDir()
	ida, idb := t.Name()+"a", t.Name()+"b"
	spec := failSpec(`{"region":65536}`, ida, idb)
	env := block.Env{Dir: dir, Size: 2 << 20, Create: true}
	l := openMirror(t, env, spec)
	defer l.Close()
	l.checkpointEvery.Store(1000)
	model := fillAll(t, l, 43)
	sb := faults(idb)
	sb.write.Store(true)
	write(t, l, model, randBytes(rand.New(rand.NewPCG(1, 1)), l.Size()), 0) // leg b misses everything
	sb.write.Store(false)
	var once sync.Once
	progress := func(done, _ int64) {
		if done < 10*region {
			return
		}
		once.Do(func() {
			// Region 2 is copied, not yet checkpointed; leg b fails on it.
			sb.write.Store(true)
			write(t, l, model, []byte("leg b fails on this"), 2*region+10)
			sb.write.Store(false)
		})
	}
	if err := l.Repair(context.Background(), progress); err != nil {
		t.Fatal(err)
	}
	checkCopies(t, l, model)
}

// A crash while a write has reached one leg and not the other: its intent
// bit stays set however many flushes and other writes happen meanwhile,
// so the restart resynchronises the region and the legs agree.
func TestCrashBetweenLegs(t *testing.T) {
	t.Parallel()
	const region = 65536
	dir := t.TempDir()
	fs := blocktest.NewFaultFS()
	ida, idb := t.Name()+"a", t.Name()+"b"
	spec := failSpec(`{"region":65536,"meta":"`+faultMeta+`"}`, ida, idb)
	env := block.Env{Dir: dir, Size: 1 << 20, Create: true, MetaFS: fs.Open}
	l := openMirror(t, env, spec)
	l.clearDelay.Store(0) // the test is that the bit survives anyway
	model := fillAll(t, l, 47)
	for range 2 {
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	gate := make(chan struct{})
	faults(idb).gate.Store(&gate)
	w := []byte("reaches leg a; leg b is stuck")
	done := make(chan error, 1)
	go func() { done <- l.WriteAt(w, 3*region+5, false) }()
	got := make([]byte, len(w))
	for string(got) != string(w) { // wait for leg a to have it
		f, err := os.ReadFile(filepath.Join(dir, "leg0.img"))
		if err != nil {
			t.Fatal(err)
		}
		copy(got, f[3*region+5:])
	}
	faults(idb).gate.Store(nil)
	for range 3 {
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	write(t, l, model, []byte("sets another bit, syncing the map"), 9*region)
	crashed, crashDir := fs.Restart(), copyDir(t, dir) // the machine stops here
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	l.Close()

	env = block.Env{Dir: crashDir, Size: 1 << 20, MetaFS: crashed.Open}
	l = openMirror(t, env, spec)
	defer l.Close()
	l.bg.Wait()
	copy(model[3*region+5:], w) // leg a, the resync source, had it
	checkCopies(t, l, model)
}

// Benchmarks: the mirror's cost over one file leg (go test -bench .).
func benchWrites(b *testing.B, spec string, size int, random bool) {
	env := block.Env{Dir: b.TempDir(), Size: 256 << 20, Create: true}
	l, err := block.Build(env, blocktest.Spec(b, spec))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	p := randBytes(rand.New(rand.NewPCG(1, 1)), int64(size))
	rng := rand.New(rand.NewPCG(2, 2))
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		off := int64(i*size) % l.Size()
		if random {
			off = rng.Int64N(l.Size()/int64(size)) * int64(size)
		}
		if err := l.WriteAt(p, off, false); err != nil {
			b.Fatal(err)
		}
		if i%64 == 63 {
			if err := l.Flush(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkWrite(b *testing.B) {
	for name, spec := range map[string]string{
		"file":   `{"type":"file","params":{"path":"a.img"}}`,
		"mirror": mirrorSpec("", "a.img", "b.img"),
	} {
		b.Run(name+"/4KiB-random", func(b *testing.B) { benchWrites(b, spec, 4096, true) })
		b.Run(name+"/1MiB-seq", func(b *testing.B) { benchWrites(b, spec, 1<<20, false) })
	}
}

// Intent bits outlive flushes while their region was written recently
// (the clear delay), and a clean Close clears them all.
func TestIntentClearDelay(t *testing.T) {
	t.Parallel()
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img")
	l := openMirror(t, env, spec)
	fillAll(t, l, 53)
	for range 3 {
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if len(l.dirty) != 16 {
		t.Fatalf("%d intent bits after recent writes, want all 16", len(l.dirty))
	}
	mustClose(t, l)
	env.Create = false
	l = openMirror(t, env, spec)
	defer l.Close()
	if len(l.dirty) != 0 || l.needsResync() {
		t.Fatalf("%d intent bits after a clean close", len(l.dirty))
	}
}

// A write is acknowledged only if a leg that is healthy when it completes
// took it: here the only leg that took it was failed meanwhile (by a read
// error), and the other leg, the last healthy one, refused it.
func TestAckNeedsAHealthyLeg(t *testing.T) {
	t.Parallel()
	ida, idb := t.Name()+"a", t.Name()+"b"
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := openMirror(t, env, failSpec(`{"region":65536}`, ida, idb))
	defer l.Close()
	sa, sb := faults(ida), faults(idb)
	gate := make(chan struct{})
	sa.gate.Store(&gate)
	done := make(chan error, 1)
	w := []byte("lands on b only")
	go func() { done <- l.WriteAt(w, 4096, false) }()
	for { // until b has it (a is held at the gate)
		f, err := os.ReadFile(filepath.Join(env.Dir, "leg1.img"))
		if err != nil {
			t.Fatal(err)
		}
		if string(f[4096:4096+len(w)]) == string(w) {
			break
		}
	}
	sb.read.Store(true)
	for legStates(l)[1] != legFailed {
		if err := l.ReadAt(make([]byte, 512), 0); err != nil {
			t.Fatal(err) // served by a after b failed
		}
	}
	sb.read.Store(false)
	sa.write.Store(true)
	sa.gate.Store(nil)
	close(gate)
	if err := <-done; err == nil {
		t.Fatal("write acknowledged though no healthy leg holds it")
	}
	if got := legStates(l); got[0] != legOK {
		t.Fatalf("states %v", got)
	}
	sa.write.Store(false)
}

// A leg that is a subtree (here throttle → file) and vanishes while open is
// rebuilt from the spec it was built with, parameters and all.
func TestRepairRebuildsSubtreeLegFromItsSpec(t *testing.T) {
	dir := t.TempDir()
	env := block.Env{Dir: dir, Size: 4 << 20, Create: true}
	spec := `{"type":"mirror","children":[
		{"type":"throttle","params":{"iops":100000},"children":[{"type":"file","params":{"path":"a.img"}}]},
		{"type":"file","params":{"path":"b.img"}}]}`
	l := openMirror(t, env, spec)
	defer mustClose(t, l)
	data := bytes.Repeat([]byte("subtree!"), 512)
	if err := l.WriteAt(data, 8192, false); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "a.img")); err != nil {
		t.Fatal(err)
	}
	if err := l.Repair(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	leg := l.Describe().Children[0]
	if leg.Type != "throttle" || !strings.Contains(string(leg.Params), `"iops":100000`) ||
		len(leg.Children) != 1 || leg.Children[0].Type != "file" || leg.State != block.StateOK {
		t.Fatalf("rebuilt leg: %+v", leg)
	}
	got, err := os.ReadFile(filepath.Join(dir, "a.img"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[8192:8192+len(data)], data) {
		t.Fatal("rebuilt leg lacks the data")
	}
}

// A superblock recording a size larger than any leg (forged, or from
// another mirror) is refused on open, before the maps that size would
// size are allocated.
func TestOpenRefusesSizeNoLegHolds(t *testing.T) {
	t.Parallel()
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	spec := mirrorSpec("", "a.img", "b.img")
	mustClose(t, openMirror(t, env, spec))
	mf, err := os.OpenFile(filepath.Join(env.Dir, DefaultMeta), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	sb, payload, err := superblock.OpenFile(sbSection{mf})
	if err != nil {
		t.Fatal(err)
	}
	st, err := decodeState(payload)
	if err != nil {
		t.Fatal(err)
	}
	st.Size = 1 << 60
	forged, _ := json.Marshal(st)
	if err := sb.Write(forged); err != nil {
		t.Fatal(err)
	}
	mf.Close()
	env.Create = false
	_, err = block.Build(env, blocktest.Spec(t, spec))
	if err == nil || !strings.Contains(err.Error(), "more than any leg holds") {
		t.Fatalf("open with a size no leg holds: %v", err)
	}
}
