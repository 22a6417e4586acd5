package cow

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/fault"
	_ "github.com/basalt-storage/basalt/internal/block/file"
	_ "github.com/basalt-storage/basalt/internal/block/stripe"
)

const (
	fileSpec   = `{"type":"cow","params":{"chunk":8192},"children":[{"type":"file","params":{"path":"data.img"}}]}`
	stripeSpec = `{"type":"cow","children":[{"type":"stripe","params":{"chunk":4096},"children":[{"type":"file","params":{"path":"0.img"}},{"type":"file","params":{"path":"1.img"}}]}]}`
)

// reads counts ReadAt calls of every `counted` layer (a file layer that
// counts), so tests can see how many device reads a cow read costs.
var reads atomic.Int64

type counted struct{ block.Layer }

func (c counted) ReadAt(p []byte, off int64) error { reads.Add(1); return c.Layer.ReadAt(p, off) }

func init() {
	block.Register(block.Type{Name: "countedfile", MinChildren: 0, MaxChildren: 0,
		New: func(env block.Env, raw json.RawMessage, _ []block.Layer) (block.Layer, error) {
			l, err := block.Build(env, block.Spec{Type: "file", Params: raw})
			return counted{l}, err
		}})
}

func testEnv(t *testing.T, size int64) block.Env {
	root := t.TempDir()
	return block.Env{Dir: filepath.Join(root, "vol"), Images: filepath.Join(root, "images"), Size: size, Create: true}
}

// reopen flushes and closes l, then opens it again from env (now no
// longer creating) and spec.
func reopen(t *testing.T, l *Layer, env *block.Env, spec string) *Layer {
	t.Helper()
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	env.Create = false
	return build(t, *env, spec)
}

func build(t *testing.T, env block.Env, spec string) *Layer {
	t.Helper()
	l, err := block.Build(env, blocktest.Spec(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	return l.(*Layer)
}

func TestConformance(t *testing.T) {
	for name, spec := range map[string]string{"file": fileSpec, "stripe": stripeSpec} {
		t.Run(name, func(t *testing.T) { blocktest.Conformance(t, testEnv(t, 8<<20), spec, 400) })
	}
}

// randomOps applies n random writes and zeroes to l and the model.
func randomOps(t *testing.T, rng *rand.Rand, l block.Device, model []byte, n int) {
	t.Helper()
	size := int64(len(model))
	for range n {
		off := rng.Int64N(size)
		m := min(rng.Int64N(40<<10)+1, size-off)
		if rng.IntN(4) == 0 {
			if err := l.WriteZeroes(off, m, block.ZeroFlags{}); err != nil {
				t.Fatal(err)
			}
			clear(model[off : off+m])
			continue
		}
		p := make([]byte, m)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		if err := l.WriteAt(p, off, rng.IntN(8) == 0); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
}

func expect(t *testing.T, l block.Device, model []byte, what string) {
	t.Helper()
	got := make([]byte, len(model))
	if err := l.ReadAt(got, 0); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !bytes.Equal(got, model) {
		for i := range got {
			if got[i] != model[i] {
				t.Fatalf("%s: differs from the model at byte %d (chunk %d)", what, i, i/8192)
			}
		}
	}
}

// clone opens a new volume on image base, in its own directory.
func clone(t *testing.T, env block.Env, base, spec string) *Layer {
	t.Helper()
	env.Dir = filepath.Join(t.TempDir(), "clone")
	env.Base, env.Create = base, true
	return build(t, env, spec)
}

// TestSnapshotsAndClones takes a chain of snapshots while writing, and
// checks the volume, a clone of every snapshot, writes to the clones (which
// must not show through anywhere else), and a reopen.
func TestSnapshotsAndClones(t *testing.T) {
	env := testEnv(t, 1<<20+4096) // not a multiple of the chunk
	l := build(t, env, fileSpec)
	defer l.Close()
	rng := rand.New(rand.NewPCG(7, 7))
	model := make([]byte, env.Size)
	type snap struct {
		image string
		model []byte
	}
	var snaps []snap
	for i := range 12 {
		randomOps(t, rng, l, model, 30)
		img, err := l.Snapshot("snap-" + string(rune('a'+i)))
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, snap{img, append([]byte(nil), model...)})
	}
	randomOps(t, rng, l, model, 30)
	expect(t, l, model, "volume")
	if l.Depth() != 13 {
		t.Fatalf("depth %d, want 13", l.Depth())
	}
	// A repeated snapshot call with the last tag is a no-op.
	if img, err := l.Snapshot("snap-l"); err != nil || img != snaps[11].image {
		t.Fatalf("repeated snapshot: %s %v, want %s", img, err, snaps[11].image)
	}
	for i, s := range snaps {
		c := clone(t, env, s.image, fileSpec)
		expect(t, c, s.model, "clone of snapshot "+string(rune('a'+i)))
		cm := append([]byte(nil), s.model...)
		randomOps(t, rng, c, cm, 20)
		expect(t, c, cm, "clone after writes")
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	expect(t, l, model, "volume after clones wrote")
	l = reopen(t, l, &env, fileSpec)
	expect(t, l, model, "volume after reopen")
	for i, s := range snaps {
		c := clone(t, env, s.image, fileSpec)
		expect(t, c, s.model, "clone after reopen "+string(rune('a'+i)))
		c.Close()
	}
}

// TestLongChainReadBound: a chunk written at the bottom of a 200-image
// chain costs exactly one device read, like a chunk in the top.
func TestLongChainReadBound(t *testing.T) {
	spec := `{"type":"cow","params":{"chunk":4096},"children":[{"type":"countedfile","params":{"path":"d.img"}}]}`
	env := testEnv(t, 1<<20)
	l := build(t, env, spec)
	defer l.Close()
	p := bytes.Repeat([]byte{7}, 4096)
	if err := l.WriteAt(p, 0, false); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if err := l.WriteAt([]byte{byte(i)}, 4096, false); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Snapshot(""); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, 4096)
	reads.Store(0)
	if err := l.ReadAt(got, 0); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("read through the chain: %v", err)
	}
	if n := reads.Load(); n != 1 {
		t.Fatalf("a read through a 201-image chain made %d device reads, want 1", n)
	}
	// Two chunks held by two different images: two reads.
	reads.Store(0)
	got = make([]byte, 8192)
	if err := l.ReadAt(got, 0); err != nil || got[4096] != 199 {
		t.Fatalf("read: %v %d", err, got[4096])
	}
	if n := reads.Load(); n != 2 {
		t.Fatalf("%d device reads, want 2", n)
	}
}

func TestFlattenAndCollect(t *testing.T) {
	env := testEnv(t, 1<<20)
	l := build(t, env, fileSpec)
	rng := rand.New(rand.NewPCG(3, 3))
	model := make([]byte, env.Size)
	randomOps(t, rng, l, model, 40)
	img, err := l.Snapshot("s1")
	if err != nil {
		t.Fatal(err)
	}
	snapModel := append([]byte(nil), model...)
	c := clone(t, env, img, fileSpec)
	cm := append([]byte(nil), snapModel...)
	randomOps(t, rng, c, cm, 20)
	l.Close() // the source volume is deleted...
	os.RemoveAll(env.Dir)
	// ... and so is the snapshot: only the clone's top is a root. The
	// snapshot's image is kept: the clone reads from it.
	removed, err := Collect(env.Images, []string{c.Top()}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 { // the source volume's top
		t.Fatalf("removed %v, want the source's top only", removed)
	}
	expect(t, c, cm, "clone after collect")
	var progressed int64
	if err := c.Flatten(context.Background(), func(done, total int64) { progressed = done }); err != nil {
		t.Fatal(err)
	}
	if progressed != chunks(env.Size, 8192) {
		t.Fatalf("progress ended at %d", progressed)
	}
	expect(t, c, cm, "clone after flatten")
	removed, err = Collect(env.Images, []string{c.Top()}, 0)
	if err != nil || len(removed) != 1 || removed[0] != img {
		t.Fatalf("after flatten removed %v %v, want the snapshot's image %s", removed, err, img)
	}
	expect(t, c, cm, "clone after its base was collected")
	c.Close()
	cenv := env
	cenv.Dir, cenv.Create = filepath.Join(filepath.Dir(c.env.Dir), "clone"), false
	c = build(t, cenv, fileSpec)
	defer c.Close()
	expect(t, c, cm, "flattened clone reopened")
	if c.Depth() != 1 {
		t.Fatalf("depth %d after flatten and reopen", c.Depth())
	}
	// Young images survive a collection that does not know them.
	if removed, _ := Collect(env.Images, nil, time.Hour); len(removed) != 0 {
		t.Fatalf("removed young images %v", removed)
	}
}

func TestResize(t *testing.T) {
	env := testEnv(t, 64<<10)
	l := build(t, env, fileSpec)
	defer l.Close()
	model := make([]byte, 64<<10)
	rng := rand.New(rand.NewPCG(4, 4))
	randomOps(t, rng, l, model, 10)
	if _, err := l.Snapshot("s"); err != nil {
		t.Fatal(err)
	}
	if err := l.Resize(200 << 10); err != nil {
		t.Fatal(err)
	}
	model = append(model, make([]byte, 136<<10)...)
	expect(t, l, model, "after grow")
	randomOps(t, rng, l, model, 20)
	expect(t, l, model, "grown and written")
	l = reopen(t, l, &env, fileSpec)
	if l.Size() != 200<<10 {
		t.Fatalf("size %d after reopen", l.Size())
	}
	expect(t, l, model, "grown, reopened")
}

// TestConcurrentCopyUps: many writers hit the same base-held chunks at
// once; every byte must end as the model says (run with -race).
func TestConcurrentCopyUps(t *testing.T) {
	env := testEnv(t, 256<<10)
	l := build(t, env, fileSpec)
	defer l.Close()
	base := bytes.Repeat([]byte{0xAB}, 256<<10)
	if err := l.WriteAt(base, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Snapshot("s"); err != nil {
		t.Fatal(err)
	}
	model := append([]byte(nil), base...)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Writer w owns bytes with index%8 == w, 512-byte pieces.
			for i := w * 512; i < len(model); i += 8 * 512 {
				p := bytes.Repeat([]byte{byte(w + 1)}, 512)
				if err := l.WriteAt(p, int64(i), false); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for i := 0; i < len(model); i += 512 {
		for j := range 512 {
			model[i+j] = byte((i/512)%8 + 1)
		}
	}
	expect(t, l, model, "after concurrent copy-ups")
}

// TestCrashAtEveryMetadataWrite runs writes, a flush, a snapshot, more
// writes and a flush, crashing (whole and torn) at each metadata write in
// turn; the restarted volume must open, hold everything flushed before the
// crash, and the snapshot must either exist with its exact content or not
// at all. It runs with a plain data file, whose every write survives (as
// after a killed process), and with a data file behind a volatile cache,
// of which the crash keeps no unflushed write or an arbitrary half.
func TestCrashAtEveryMetadataWrite(t *testing.T) {
	for _, data := range []struct {
		name   string
		cached bool
		keep   func(int) bool
	}{{"file", false, nil}, {"cache lost", true, nil}, {"cache partly kept", true, blocktest.KeepSome(5)}} {
		t.Run(data.name, func(t *testing.T) {
			spec := fileSpec
			if data.cached {
				spec = blocktest.Cached(t, fileSpec)
			}
			crashEveryMetadataWrite(t, spec, data.cached, data.keep)
		})
	}
}

func crashEveryMetadataWrite(t *testing.T, spec string, cached bool, keep func(int) bool) {
	// versions holds the contents since the last completed flush: that
	// flush's, then after every completed write.
	var versions [][]byte
	run := func(t *testing.T, fs *blocktest.FaultFS, env block.Env) (flushed bool, snapImg string, snapModel []byte) {
		env.MetaFS = fs.Open
		l, err := block.Build(env, blocktest.Spec(t, spec))
		if err != nil {
			return false, "", nil // crashed while creating
		}
		defer l.Close()
		c := l.(*Layer)
		rng := rand.New(rand.NewPCG(9, 9))
		model := make([]byte, env.Size)
		versions, flushed = [][]byte{bytes.Clone(model)}, true
		step := func(n int) bool {
			for range n {
				off := rng.Int64N(env.Size - 20000)
				p := make([]byte, rng.IntN(20000)+1)
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				if c.WriteAt(p, off, false) != nil {
					return false
				}
				copy(model[off:], p)
				versions = append(versions, bytes.Clone(model))
			}
			if c.Flush() != nil {
				return false
			}
			versions = [][]byte{bytes.Clone(model)}
			return true
		}
		if !step(20) {
			return
		}
		img, err := c.Snapshot("snap")
		if err != nil {
			return
		}
		snapImg, snapModel = img, bytes.Clone(model)
		step(20)
		return
	}
	root := t.TempDir()
	mkEnv := func(name string) block.Env {
		return block.Env{Dir: filepath.Join(root, name, "vol"), Images: filepath.Join(root, name, "images"), Size: 256 << 10, Create: true}
	}
	count := blocktest.NewFaultFS()
	if _, img, _ := run(t, count, mkEnv("count")); img == "" {
		t.Fatal("the workload failed without a crash")
	}
	writes := count.Writes()
	if writes < 6 {
		t.Fatalf("only %d metadata writes: the test would prove little", writes)
	}
	for k := range writes {
		for ti, tear := range []func(int) bool{nil, fault.Half(4096)} {
			name := "k" + string(rune('A'+k%26)) + string(rune('a'+k/26)) + string(rune('0'+ti))
			fs := blocktest.NewFaultFS()
			fs.CrashAt, fs.Tear, fs.Keep = k, tear, keep
			env := mkEnv(name)
			flushed, snapImg, snapModel := run(t, fs, env)
			if !fs.Crashed() {
				t.Fatalf("write %d: no crash", k)
			}
			if !flushed {
				continue // crashed creating: nothing was acknowledged
			}
			env.Create = false
			env.MetaFS = fs.Restart().Open
			l, err := block.Build(env, blocktest.Spec(t, spec))
			if err != nil {
				t.Fatalf("crash at metadata write %d (tear %d): reopen: %v", k, ti, err)
			}
			got := make([]byte, env.Size)
			if err := l.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			// Each chunk holds its last flushed content or a newer one
			// (unflushed writes may or may not have survived, chunk by
			// chunk), never anything else. A plain file keeps every
			// write: a chunk there is the last flushed or the newest.
			allowed := versions
			if !cached {
				allowed = [][]byte{versions[0], versions[len(versions)-1]}
			}
			for c := 0; c < len(got); c += 8192 {
				if !slices.ContainsFunc(allowed, func(v []byte) bool { return bytes.Equal(got[c:c+8192], v[c:c+8192]) }) {
					t.Fatalf("crash at metadata write %d (tear %d): chunk %d is neither flushed nor newer data", k, ti, c/8192)
				}
			}
			if snapImg != "" {
				cenv := env
				cenv.Dir, cenv.Base, cenv.Create = filepath.Join(root, name, "clone"), snapImg, true
				c, err := block.Build(cenv, blocktest.Spec(t, spec))
				if err != nil {
					t.Fatalf("crash at %d: snapshot image unusable: %v", k, err)
				}
				expect(t, c, snapModel, "snapshot after crash")
				c.Close()
			}
			l.Close()
		}
	}
}

// TestSweepFollowsNewTops: a root read after the listing may name a top
// made since — unlisted — whose chain runs into listed images; those are
// kept. Listed images that nothing reaches go.
func TestSweepFollowsNewTops(t *testing.T) {
	env := testEnv(t, 1<<20)
	l := build(t, env, fileSpec)
	defer l.Close()
	model := make([]byte, env.Size)
	randomOps(t, rand.New(rand.NewPCG(5, 5)), l, model, 10)
	old := l.Top()
	orphan := clone(t, env, old, fileSpec) // a clone whose volume is gone
	orphanTop := orphan.Top()
	orphan.Close()
	listed, err := ListImages(env.Images)
	if err != nil {
		t.Fatal(err)
	}
	// A snapshot after the listing: the top moves to a new, unlisted
	// image whose parent is the old top (the snapshot's image).
	if _, err := l.Snapshot("later"); err != nil {
		t.Fatal(err)
	}
	if l.Top() == old {
		t.Fatal("snapshot did not move the top")
	}
	removed, err := Sweep(env.Images, listed, []string{l.Top()}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != orphanTop {
		t.Fatalf("removed %v, want only the orphan clone's top %s", removed, orphanTop)
	}
	expect(t, l, model, "volume after a sweep that listed it before its snapshot")
}
