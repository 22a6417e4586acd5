package parity

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/fault"
)

// crashRun drives a layer through a fixed workload whose metadata lives in
// a FaultFS, and tracks what a restart must find: known[i] is set when byte
// i was written by an acknowledged write that a successful Flush (or FUA)
// made durable and nothing touched since. It stops at the first error (the
// crash: every metadata call after it fails).
type crashRun struct {
	t       *testing.T
	spec    string
	env     block.Env
	fs      *blocktest.FaultFS
	l       *Layer
	rng     *rand.Rand
	model   []byte
	known   []byte     // 1: known
	pending [][2]int64 // acknowledged, not yet flushed
	created bool
}

const (
	crashLegs  = 3
	crashChunk = 4096
	crashDsz   = (crashLegs - 1) * crashChunk
	crashSize  = 8 * crashDsz
)

// newCrashRun prepares a run on fs; with cached, the legs are cachedfile
// layers whose unflushed writes the crash drops (but what fs.Keep keeps).
func newCrashRun(t *testing.T, fs *blocktest.FaultFS, cached bool) *crashRun {
	spec := specFor(crashLegs, crashChunk)
	if cached {
		spec = blocktest.Cached(t, spec)
	}
	return &crashRun{
		t: t, spec: spec, fs: fs, rng: rand.New(rand.NewPCG(42, 42)),
		env:   block.Env{Dir: t.TempDir(), Size: crashSize, MetaFS: fs.Open},
		model: make([]byte, crashSize), known: make([]byte, crashSize),
	}
}

func (c *crashRun) open(create bool) error {
	env := c.env
	env.Create = create
	l, err := block.Build(env, blocktest.Spec(c.t, c.spec))
	if err != nil {
		return err
	}
	c.l = l.(*Layer)
	c.l.cleanDelay = time.Hour // the write count must not depend on timing
	c.l.batchStripes = 3       // a rebuild of several batches
	if create {
		c.created = true
		c.mark(0, crashSize, 1) // zeroes
	}
	return nil
}

var ones = bytes.Repeat([]byte{1}, crashSize)

func (c *crashRun) mark(off, n int64, v byte) {
	if v == 0 {
		clear(c.known[off : off+n])
	} else {
		copy(c.known[off:off+n], ones)
	}
}

func (c *crashRun) forget(off, n int64) { c.mark(off, n, 0) }

func (c *crashRun) write(off, n int64, fua bool) error {
	p := randBytes(c.rng, n)
	c.forget(off, n)
	if err := c.l.WriteAt(p, off, fua); err != nil {
		return err
	}
	copy(c.model[off:], p)
	c.pending = append(c.pending, [2]int64{off, n})
	if fua {
		c.mark(off, n, 1)
	}
	return nil
}

func (c *crashRun) zero(off, n int64) error {
	c.forget(off, n)
	if err := c.l.WriteZeroes(off, n, block.ZeroFlags{}); err != nil {
		return err
	}
	clear(c.model[off : off+n])
	c.pending = append(c.pending, [2]int64{off, n})
	return nil
}

func (c *crashRun) flush() error {
	if err := c.l.Flush(); err != nil {
		return err
	}
	for _, r := range c.pending {
		c.mark(r[0], r[1], 1)
	}
	c.pending = nil
	return nil
}

// close is a clean shutdown: it flushes, so pending writes become known.
func (c *crashRun) close() error {
	l := c.l
	c.l = nil
	if err := l.Close(); err != nil {
		return err
	}
	for _, r := range c.pending {
		c.mark(r[0], r[1], 1)
	}
	c.pending = nil
	return nil
}

// workload: healthy writes of every shape, a clean restart with leg 1
// gone, degraded writes (into the missing chunks and beside them, FUA,
// whole-stripe zeroes), another restart, a rebuild, and writes after it.
func (c *crashRun) workload() error {
	steps := []func() error{
		func() error { return c.open(true) },
		func() error { return c.write(0, crashSize, false) },
		c.flush,
		func() error { return c.write(1000, 5000, false) },              // unaligned, two chunks
		func() error { return c.write(3*crashChunk, crashChunk, true) }, // FUA
		func() error { return c.zero(2*crashDsz, 2*crashDsz) },          // whole stripes
		func() error { return c.write(5*crashDsz+100, 300, false) },
		c.flush,
		func() error { return c.write(7*crashDsz, crashDsz, false) }, // a full stripe
		c.close,
		func() error { return os.Remove(legPath(c.env, 1)) },
		func() error { return c.open(false) },
		func() error { return c.write(0, 3*crashDsz, false) },    // every chunk of stripes 0-2
		func() error { return c.write(4*crashDsz+10, 20, true) }, // small, FUA
		c.flush,
		func() error { return c.write(6*crashDsz+4000, 200, false) }, // across chunks 0/1
		func() error { return c.zero(2*crashDsz, crashDsz) },
		func() error { return c.write(5*crashDsz, 2*crashDsz+77, false) },
		c.flush,
		func() error { return c.write(crashDsz+crashChunk, 999, false) }, // unflushed
		c.close,
		func() error { return c.open(false) },
		func() error { return c.l.Repair(context.Background(), nil) },
		func() error { return c.write(3*crashDsz+50, 5000, false) },
		c.flush,
		c.close,
	}
	for i, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
	}
	return nil
}

// check restarts from what landed and asserts: it opens (unless the crash
// came while it was being created), every known byte reads back, Repair
// completes, the parity on disk is consistent, and with another leg lost
// every known byte still reads back.
func (c *crashRun) check(what string) {
	t := c.t
	t.Helper()
	if c.l != nil {
		c.l.Close() // the crashed process's files; its metadata calls fail
		c.l = nil
	}
	fs := c.fs.Restart()
	env := c.env
	env.MetaFS = fs.Open
	l, err := block.Build(env, blocktest.Spec(t, c.spec))
	if err != nil {
		if !c.created {
			return // creation never completed: nothing was acknowledged
		}
		t.Fatalf("%s: reopen: %v", what, err)
	}
	verify := func(l block.Layer, when string) {
		t.Helper()
		got := make([]byte, crashSize)
		if err := l.ReadAt(got, 0); err != nil {
			t.Fatalf("%s, %s: read: %v", what, when, err)
		}
		for b := 0; b < crashSize; b += 512 {
			known, g, m := c.known[b:b+512], got[b:b+512], c.model[b:b+512]
			if bytes.Equal(known, ones[:512]) && bytes.Equal(g, m) {
				continue
			}
			for i := range known {
				if known[i] == 1 && g[i] != m[i] {
					t.Fatalf("%s, %s: byte %d (stripe %d) is %#x, want %#x", what, when, b+i, (b+i)/crashDsz, g[i], m[i])
				}
			}
		}
	}
	verify(l, "after restart")
	if err := l.(*Layer).Repair(context.Background(), nil); err != nil {
		t.Fatalf("%s: repair: %v", what, err)
	}
	verify(l, "after repair")
	if err := l.Close(); err != nil {
		t.Fatalf("%s: close: %v", what, err)
	}
	if err := parityError(env, crashLegs, crashChunk); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	loseLeg(t, env, 2)
	l, err = block.Build(env, blocktest.Spec(t, c.spec))
	if err != nil {
		t.Fatalf("%s: reopen without leg 2: %v", what, err)
	}
	defer l.Close()
	verify(l, "leg 2 lost")
}

// TestCrashAtEveryMetadataWrite crashes the workload at each of its
// metadata writes (whole and torn), with legs that are plain files (whose
// every write survives, as after a killed process) and legs behind a
// volatile cache, of which the crash keeps no unflushed write or some.
func TestCrashAtEveryMetadataWrite(t *testing.T) {
	t.Parallel()
	for _, data := range []struct {
		name   string
		cached bool
		keep   func(int) bool
	}{{"files", false, nil}, {"cache lost", true, nil}, {"cache partly kept", true, blocktest.KeepSome(3)}} {
		t.Run(data.name, func(t *testing.T) {
			t.Parallel()
			crashEveryMetadataWrite(t, data.cached, data.keep)
		})
	}
}

func crashEveryMetadataWrite(t *testing.T, cached bool, keep func(int) bool) {
	base := newCrashRun(t, blocktest.NewFaultFS(), cached)
	base.fs.Keep = keep
	if err := base.workload(); err != nil {
		t.Fatal(err)
	}
	n := base.fs.Writes()
	t.Logf("the workload makes %d metadata writes", n)
	base.check("no crash")
	if n < 20 {
		t.Fatalf("only %d metadata writes: the workload does not exercise much", n)
	}
	for _, tear := range []struct {
		name string
		fn   func(int) bool
	}{{"whole", nil}, {"torn", fault.Half(4096)}} {
		t.Run(tear.name, func(t *testing.T) {
			t.Parallel()
			// Each crash point is independent; a few at a time keep the
			// disk busy (the runs are mostly fdatasync).
			ks := make(chan int)
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for k := range ks {
						t.Run(fmt.Sprint("at", k), func(t *testing.T) {
							fs := blocktest.NewFaultFS()
							fs.CrashAt, fs.Tear, fs.Keep = k, tear.fn, keep
							c := newCrashRun(t, fs, cached)
							err := c.workload()
							if err == nil || !fs.Crashed() {
								t.Fatalf("crash at write %d of %d: workload %v, crashed %v", k, n, err, fs.Crashed())
							}
							c.check(fmt.Sprintf("crash at metadata write %d/%d (%v)", k, n, err))
						})
					}
				})
			}
			for k := range n {
				ks <- k
			}
			close(ks)
			wg.Wait()
		})
	}
}

// The journal alone: a torn entry must leave the previous one in force.
func TestJournalTornEntryKeepsPrevious(t *testing.T) {
	t.Parallel()
	f := &fault.File{CrashAt: -1}
	j := newJournal(&section{f: f, limit: -1}, 4096, 2)
	pu := &pairUse{pair: 1, last: -1}
	a := bytes.Repeat([]byte{1}, 4096)
	if err := j.put(pu, 1, 7, 5, 2, a); err != nil {
		t.Fatal(err)
	}
	b := bytes.Repeat([]byte{2}, 4096)
	torn := fault.New(f.Image(), 0, fault.Half(8192))
	j2 := newJournal(&section{f: torn, limit: -1}, 4096, 2)
	if err := j2.put(&pairUse{pair: 1, last: pu.last}, 2, 7, 5, 2, b); err == nil {
		t.Fatal("write did not crash")
	}
	j3 := newJournal(&section{f: fault.New(torn.Image(), -1, nil), limit: -1}, 4096, 2)
	if err := j3.scan(7); err != nil {
		t.Fatal(err)
	}
	got, ok, err := j3.lookup(5, 2)
	if err != nil || !ok || !bytes.Equal(got, a) {
		t.Fatalf("after a torn entry: ok=%v err=%v", ok, err)
	}
	if _, ok, _ := j3.lookup(5, 1); ok {
		t.Fatal("entry found for another leg")
	}
	if err := j3.scan(8); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := j3.lookup(5, 2); ok {
		t.Fatal("entry of an old epoch believed")
	}
}

// A stripe's old journal entry can outlive a newer one (its pair unused
// while the newer one's pair was reused by another stripe). A crash at the
// start of the stripe's next degraded update must not make recovery
// believe the old entry: the newest entry of a stripe dirty on disk is
// always from its current dirty period (entry first, then intent bit).
func TestStaleJournalEntryNeverBelieved(t *testing.T) {
	t.Parallel()
	const s, other = 3, 6 // stripes whose data chunk 0 is on the same leg
	spec := specFor(crashLegs, crashChunk)
	v1, v2, v3 := bytes.Repeat([]byte{1}, 100), bytes.Repeat([]byte{2}, 100), bytes.Repeat([]byte{3}, 100)
	run := func(fs *blocktest.FaultFS, counted *int) (block.Env, error) {
		env := block.Env{Dir: t.TempDir(), Size: crashSize, Create: true, MetaFS: fs.Open}
		l := build(t, env, spec)
		m := l.dataLeg(s, 0)
		if l.dataLeg(other, 0) != m {
			t.Fatal("test stripes do not share a leg")
		}
		l.Close()
		loseLeg(t, env, m)
		env.Create = false
		l = build(t, env, spec)
		defer l.Close()
		l.cleanDelay = 0
		pin := func(pair int) {
			l.mu.Lock()
			l.jr.free = []int{pair}
			l.mu.Unlock()
		}
		steps := []func() error{
			func() error { pin(5); return l.WriteAt(v1, s*crashDsz, false) }, // entry V1 in pair 5
			l.Flush, // s clean, pair 5 free
			func() error { pin(7); return l.WriteAt(v2, s*crashDsz, false) }, // entry V2 in pair 7
			l.Flush,
			func() error { pin(7); return l.WriteAt(v1, other*crashDsz, false) }, // overwrites V2's entry
			l.Flush,
		}
		for _, step := range steps {
			if err := step(); err != nil {
				t.Fatal(err)
			}
		}
		*counted = fs.Writes()
		pin(9)
		return env, l.WriteAt(v3, s*crashDsz, false)
	}
	var w int
	if _, err := run(blocktest.NewFaultFS(), &w); err != nil {
		t.Fatal(err)
	}
	for _, k := range []int{w, w + 1} {
		for _, tear := range []func(int) bool{nil, fault.Half(4096)} {
			fs := blocktest.NewFaultFS()
			fs.CrashAt, fs.Tear = k, tear
			env, err := run(fs, new(int))
			if err == nil || !fs.Crashed() {
				t.Fatalf("crash at %d: %v", k, err)
			}
			env.MetaFS = fs.Restart().Open
			l := build(t, env, spec)
			got := make([]byte, 100)
			if err := l.ReadAt(got, s*crashDsz); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, v2) && !bytes.Equal(got, v3) {
				t.Fatalf("crash at metadata write %d: the chunk reads %d..., want the last written (2) or the one in flight (3)", k, got[0])
			}
			l.Close()
		}
	}
}
