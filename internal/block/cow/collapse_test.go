package cow

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/fault"
)

// TestCollapse: a volume snapshotted twice, extended and written after
// the second snapshot, collapses that snapshot's image into its top: every
// byte reads the same, before and after a reopen; the old top leaves the
// chain and Collect removes it; the collapsed image's file holds the
// chunks the top held; the first snapshot is untouched and a repeated
// Snapshot of the tag that created the new top still returns its image.
func TestCollapse(t *testing.T) {
	env := testEnv(t, 1<<20+4096) // not a multiple of the chunk
	l := build(t, env, fileSpec)
	rng := rand.New(rand.NewPCG(11, 11))
	model := make([]byte, env.Size)
	randomOps(t, rng, l, model, 40)
	first, err := l.Snapshot("s0")
	if err != nil {
		t.Fatal(err)
	}
	firstModel := append([]byte(nil), model...)
	randomOps(t, rng, l, model, 40)
	mid, err := l.Snapshot("s1")
	if err != nil {
		t.Fatal(err)
	}
	oldTop := l.Top()
	// Extended after the snapshot: the collapsed image must grow.
	if err := l.Resize(1<<20 + 200<<10); err != nil {
		t.Fatal(err)
	}
	model = append(model, make([]byte, 200<<10-4096)...)
	randomOps(t, rng, l, model, 60)
	expect(t, l, model, "before collapse")
	if l.Depth() != 3 {
		t.Fatalf("depth %d before collapse, want 3", l.Depth())
	}
	var done, total int64
	if err := l.Collapse(context.Background(), mid, func(d, n int64) { done, total = d, n }); err != nil {
		t.Fatal(err)
	}
	if done != total || total != chunks(l.Size(), 8192) {
		t.Fatalf("progress ended at %d of %d", done, total)
	}
	expect(t, l, model, "after collapse")
	if l.Depth() != 2 || l.Top() != mid {
		t.Fatalf("after collapse: depth %d, top %s; want 2, %s", l.Depth(), l.Top(), mid)
	}
	// The new top's stack was grown to the extended size (as Resize
	// keeps a top's: a reopen checks it).
	if n := l.top.dev.Size(); n < l.Size() {
		t.Fatalf("the collapsed image's stack holds %d bytes, the volume %d", n, l.Size())
	}
	// Every chunk the volume reads from its top is in the collapsed
	// image's own file.
	f, err := os.ReadFile(filepath.Join(env.Images, mid, "data.img"))
	if err != nil {
		t.Fatal(err)
	}
	f = append(f, make([]byte, max(0, l.Size()-int64(len(f))))...) // a hole at the end
	held := 0
	for c, o := range l.owner.held(0, l.owner.Len()) {
		if o != l.top.depth {
			continue
		}
		held++
		lo, hi := c*8192, min((c+1)*8192, l.Size())
		if !bytes.Equal(f[lo:hi], model[lo:hi]) {
			t.Fatalf("chunk %d: the collapsed image's file does not hold the volume's data", c)
		}
	}
	if held == 0 {
		t.Fatal("the collapsed image holds no chunk")
	}
	// Still the same work done: the first snapshot's image.
	if img, err := l.Snapshot("s0"); err != nil || img != first {
		t.Fatalf("repeated snapshot s0 after collapse: %s %v, want %s", img, err, first)
	}
	if l.Depth() != 2 {
		t.Fatalf("a repeated snapshot changed the depth to %d", l.Depth())
	}
	removed, err := Collect(env.Images, []string{l.Top(), first}, 0)
	if err != nil || len(removed) != 1 || removed[0] != oldTop {
		t.Fatalf("collect removed %v %v, want the old top %s", removed, err, oldTop)
	}
	expect(t, l, model, "after collect")
	c := clone(t, env, first, fileSpec)
	expect(t, c, firstModel, "clone of the first snapshot")
	c.Close()
	randomOps(t, rng, l, model, 30)
	l = reopen(t, l, &env, fileSpec)
	defer l.Close()
	expect(t, l, model, "collapsed volume reopened")
	if l.Depth() != 2 || l.Size() != int64(len(model)) {
		t.Fatalf("reopened: depth %d, size %d", l.Depth(), l.Size())
	}
	// Called again, it finds its work done.
	if err := l.Collapse(context.Background(), mid, nil); err != nil {
		t.Fatalf("repeated collapse: %v", err)
	}
}

// TestCollapseUnheldChunks: chunks no image holds read from the top's
// device, and after a collapse from the collapsed image's. Data the
// collapsed image has there (written while it was the top, never made
// durable: its bit was never set) must not reappear, and data the top has
// there must not disappear.
func TestCollapseUnheldChunks(t *testing.T) {
	env := testEnv(t, 256<<10)
	l := build(t, env, fileSpec)
	defer l.Close()
	mid, err := l.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	// Stale data in the frozen image's device at chunk 3, and in the
	// top's device at chunk 5, both at chunks neither holds: what a crash
	// after unflushed writes leaves.
	for _, w := range []struct {
		img   string
		chunk int64
	}{{mid, 3}, {l.Top(), 5}} {
		f, err := os.OpenFile(filepath.Join(env.Images, w.img, "data.img"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(bytes.Repeat([]byte{0xEE}, 8192), w.chunk*8192); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	model := make([]byte, env.Size)
	copy(model[5*8192:], bytes.Repeat([]byte{0xEE}, 8192))
	expect(t, l, model, "before collapse")
	if err := l.Collapse(context.Background(), mid, nil); err != nil {
		t.Fatal(err)
	}
	expect(t, l, model, "after collapse")
}

// TestCollapseWithConcurrentWrites: writers write, zero, flush and read
// back their own stripes of the volume while a collapse runs; every read
// matches, and after the collapse (and a reopen) every byte is as written.
// Run with -race.
func TestCollapseWithConcurrentWrites(t *testing.T) {
	env := testEnv(t, 16<<20)
	l := build(t, env, fileSpec)
	rng := rand.New(rand.NewPCG(12, 12))
	model := make([]byte, env.Size)
	randomOps(t, rng, l, model, 100)
	mid, err := l.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	randomOps(t, rng, l, model, 300)
	const writers = 4
	const piece = 3000 // not chunk-aligned: pieces share chunks across writers
	var stop atomic.Bool
	var wg, started sync.WaitGroup
	started.Add(writers)
	var mu sync.Mutex // guards model (each writer owns its pieces)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 99))
			n := int(env.Size) / piece
			for i := 0; !stop.Load() || i < 200; i++ {
				if i == 20 {
					started.Done()
				}
				k := r.IntN(n/writers)*writers + w // writer w owns pieces k%writers == w
				off := int64(k * piece)
				p := make([]byte, piece)
				switch r.IntN(8) {
				case 0:
					if err := l.WriteZeroes(off, piece, block.ZeroFlags{}); err != nil {
						t.Error(err)
						return
					}
				case 1:
					if err := l.Flush(); err != nil {
						t.Error(err)
						return
					}
					continue
				default:
					for j := range p {
						p[j] = byte(r.Uint32())
					}
					if err := l.WriteAt(p, off, r.IntN(4) == 0); err != nil {
						t.Error(err)
						return
					}
				}
				mu.Lock()
				copy(model[off:], p)
				mu.Unlock()
				got := make([]byte, piece)
				if err := l.ReadAt(got, off); err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(got, p) {
					t.Errorf("writer %d: piece %d reads back wrong", w, k)
					return
				}
			}
		}()
	}
	started.Wait() // writers are under way
	err = l.Collapse(context.Background(), mid, nil)
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		return
	}
	expect(t, l, model, "after a collapse with concurrent writes")
	if l.Depth() != 1 {
		t.Fatalf("depth %d after collapse", l.Depth())
	}
	l = reopen(t, l, &env, fileSpec)
	defer l.Close()
	expect(t, l, model, "reopened")
}

// TestCollapseRefusals: an image that is not the top's parent, a
// read-only layer, and a chain changed by a snapshot are refused.
func TestCollapseRefusals(t *testing.T) {
	env := testEnv(t, 256<<10)
	l := build(t, env, fileSpec)
	defer l.Close()
	model := make([]byte, env.Size)
	randomOps(t, rand.New(rand.NewPCG(13, 13)), l, model, 10)
	first, err := l.Snapshot("a")
	if err != nil {
		t.Fatal(err)
	}
	second, err := l.Snapshot("b")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{first, "img-0123456789abcdef", ""} {
		if err := l.Collapse(context.Background(), id, nil); err == nil {
			t.Fatalf("collapse of %q, not the top's parent, succeeded", id)
		}
	}
	if l.Depth() != 3 {
		t.Fatalf("a refused collapse changed the depth to %d", l.Depth())
	}
	renv := env
	renv.Dir, renv.Create, renv.ReadOnly, renv.Base = t.TempDir(), false, true, second
	r := build(t, renv, fileSpec)
	defer r.Close()
	if err := r.Collapse(context.Background(), first, nil); !errors.Is(err, block.ErrReadOnly) {
		t.Fatalf("collapse on a read-only layer: %v", err)
	}
	expect(t, l, model, "after refusals")
}

// TestCollapseCrashKeepsUnpersistedChunks: a chunk the collapsed image
// holds and the top copied up but has not yet persisted its bit for must
// not change in the collapsed image before the commit: a crash at the
// collapse's first metadata write (the top's flush) must read the chunk
// as it was last flushed, exactly as without the collapse.
func TestCollapseCrashKeepsUnpersistedChunks(t *testing.T) {
	root := t.TempDir()
	env := block.Env{Dir: filepath.Join(root, "vol"), Images: filepath.Join(root, "images"), Size: 64 << 10, Create: true}
	fs := blocktest.NewFaultFS()
	env.MetaFS = fs.Open
	l := build(t, env, fileSpec)
	old := bytes.Repeat([]byte{1}, 8192)
	if err := l.WriteAt(old, 0, false); err != nil {
		t.Fatal(err)
	}
	mid, err := l.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteAt(bytes.Repeat([]byte{2}, 100), 0, false); err != nil {
		t.Fatal(err)
	}
	fs.CrashAt = fs.Writes()
	if err := l.Collapse(context.Background(), mid, nil); err == nil || !fs.Crashed() {
		t.Fatalf("collapse: %v, crashed %v", err, fs.Crashed())
	}
	l.Close()
	env.Create, env.MetaFS = false, fs.Restart().Open
	l = build(t, env, fileSpec)
	defer l.Close()
	model := make([]byte, env.Size)
	copy(model, old)
	expect(t, l, model, "after a crash at the collapse's flush")
	if err := l.Collapse(context.Background(), mid, nil); err != nil {
		t.Fatalf("collapse rerun: %v", err)
	}
	expect(t, l, model, "after the rerun")
}

// TestCollapseCrashAtEveryMetadataWrite runs writes, two snapshots, an
// extend, more writes (flushed, then unflushed) and a collapse of the snapshot's image
// followed by more writes, crashing (whole and torn) at each metadata
// write in turn. The reopened volume must hold every chunk as last
// acknowledged durable (a completed collapse flushed) or newer, never
// anything else; a rerun of the collapse must complete without changing a
// byte, and survive another reopen.
func TestCollapseCrashAtEveryMetadataWrite(t *testing.T) {
	const size, grown = 256 << 10, 320 << 10
	var model []byte
	var snapImg string
	run := func(t *testing.T, fs *blocktest.FaultFS, env block.Env) (flushed [][]byte) {
		env.MetaFS = fs.Open
		l, err := block.Build(env, blocktest.Spec(t, fileSpec))
		if err != nil {
			return nil
		}
		defer l.Close()
		c := l.(*Layer)
		rng := rand.New(rand.NewPCG(14, 14))
		model = make([]byte, size)
		flushed = append(flushed, slices.Clone(model))
		write := func(n int) bool {
			for range n {
				off := rng.Int64N(int64(len(model)) - 20000)
				p := make([]byte, rng.IntN(20000)+1)
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				if c.WriteAt(p, off, false) != nil {
					return false
				}
				copy(model[off:], p)
			}
			return true
		}
		flush := func() bool {
			if c.Flush() != nil {
				return false
			}
			flushed = append(flushed, slices.Clone(model))
			return true
		}
		if !write(20) || !flush() {
			return
		}
		// A first snapshot below: the top copies chunks up from both.
		if _, err := c.Snapshot("first"); err != nil {
			return
		}
		if !write(20) || !flush() {
			return
		}
		if snapImg, err = c.Snapshot("snap"); err != nil {
			return
		}
		if c.Resize(grown) != nil {
			return
		}
		model = append(model, make([]byte, grown-size)...)
		flushed[len(flushed)-1] = append(flushed[len(flushed)-1], make([]byte, grown-size)...)
		// Flushed writes in the top, then unflushed ones.
		if !write(20) || !flush() || !write(20) {
			return
		}
		if c.Collapse(context.Background(), snapImg, nil) != nil {
			return
		}
		flushed = append(flushed, slices.Clone(model)) // the commit flushed
		if write(10) {
			flush()
		}
		return
	}
	root := t.TempDir()
	mkEnv := func(name string) block.Env {
		return block.Env{Dir: filepath.Join(root, name, "vol"), Images: filepath.Join(root, name, "images"), Size: size, Create: true}
	}
	count := blocktest.NewFaultFS()
	run(t, count, mkEnv("count"))
	if count.Crashed() || len(model) != grown {
		t.Fatal("the workload failed without a crash")
	}
	writes := count.Writes()
	if writes < 10 {
		t.Fatalf("only %d metadata writes: the test would prove little", writes)
	}
	for k := range writes {
		for ti, tear := range []func(int) bool{nil, fault.Half(4096)} {
			name := "k" + string(rune('A'+k%26)) + string(rune('a'+k/26)) + string(rune('0'+ti))
			fs := blocktest.NewFaultFS()
			fs.CrashAt, fs.Tear = k, tear
			env := mkEnv(name)
			snapImg = ""
			flushed := run(t, fs, env)
			if !fs.Crashed() {
				t.Fatalf("write %d: no crash", k)
			}
			if len(flushed) == 0 {
				continue // crashed creating: nothing was acknowledged
			}
			env.Create = false
			rfs := fs.Restart()
			env.MetaFS = rfs.Open
			l := build(t, env, fileSpec)
			got := make([]byte, l.Size())
			if err := l.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			last := flushed[len(flushed)-1]
			if len(got) < len(last) {
				t.Fatalf("crash at metadata write %d (tear %d): %d bytes, an acknowledged extend made %d", k, ti, len(got), len(last))
			}
			for c := 0; c < len(got); c += 8192 {
				e := min(c+8192, len(got))
				g := got[c:e]
				ok := e <= len(model) && bytes.Equal(g, model[c:e])
				if e <= len(last) && bytes.Equal(g, last[c:e]) {
					ok = true
				}
				if e > len(last) && !slices.ContainsFunc(g, func(b byte) bool { return b != 0 }) {
					ok = true // beyond the last flushed size: zeroes, or newest
				}
				if !ok {
					t.Fatalf("crash at metadata write %d (tear %d): chunk %d is neither flushed nor newest data", k, ti, c/8192)
				}
			}
			// A rerun (when the snapshot exists and is still the top's
			// parent, or already collapsed) completes and changes nothing.
			if snapImg != "" && (l.top.meta.Parent == snapImg || l.Top() == snapImg) {
				if err := l.Collapse(context.Background(), snapImg, nil); err != nil {
					t.Fatalf("crash at %d (tear %d): collapse rerun: %v", k, ti, err)
				}
				if l.Top() != snapImg || l.Depth() != 2 {
					t.Fatalf("crash at %d (tear %d): after the rerun top %s depth %d", k, ti, l.Top(), l.Depth())
				}
				expect(t, l, got, "after the rerun")
				l.Close()
				env.MetaFS = rfs.Restart().Open
				l = build(t, env, fileSpec)
				expect(t, l, got, "rerun, reopened")
			}
			l.Close()
		}
	}
}

// TestCollapseThenSnapshotReleasesFrozen: an image frozen by a snapshot,
// made the top again by a collapse and frozen again by the next snapshot
// is counted as held frozen once, and released when the volume closes
// (a leaked count refuses its clones' repairs for the life of the process).
func TestCollapseThenSnapshotReleasesFrozen(t *testing.T) {
	env := testEnv(t, 64<<10)
	l := build(t, env, fileSpec)
	a := l.Top()
	if _, err := l.Snapshot("s1"); err != nil {
		t.Fatal(err)
	}
	if err := l.Collapse(context.Background(), a, nil); err != nil {
		t.Fatal(err)
	}
	if l.Top() != a {
		t.Fatalf("top %s after the collapse, want %s", l.Top(), a)
	}
	if _, err := l.Snapshot("s2"); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if held, err := isFrozenOpen(l.imageDir(a)); err != nil || held {
		t.Fatalf("image %s still held frozen after its volume closed (%v)", a, err)
	}
}

// TestFastZeroDuringCollapse: a fast zero of a chunk a collapse pass has
// already copied is copied again before the commit (the write path marks
// it), so the volume reads zeroes after the collapse, not the old bytes.
func TestFastZeroDuringCollapse(t *testing.T) {
	const chunk = 8192
	env := testEnv(t, 8*chunk)
	l := build(t, env, fileSpec)
	defer l.Close()
	if err := l.WriteAt(bytes.Repeat([]byte{0xAA}, 8*chunk), 0, false); err != nil {
		t.Fatal(err)
	}
	mid, err := l.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteAt(bytes.Repeat([]byte{0xBB}, chunk), 2*chunk, false); err != nil { // the top's
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	done := false
	err = l.Collapse(context.Background(), mid, func(int64, int64) {
		if done {
			return
		}
		done = true
		if err := l.WriteZeroes(2*chunk, chunk, block.ZeroFlags{Fast: true}); err != nil {
			t.Errorf("fast zero: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, chunk)
	if err := l.ReadAt(got, 2*chunk); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, chunk)) {
		t.Fatalf("after the collapse chunk 2 reads %x…, want zeroes", got[:8])
	}
}
