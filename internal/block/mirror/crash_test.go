package mirror

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/bitmap"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/fault"
)

// faultMeta is the metadata path in crash tests: absolute, so every copy
// of the data directory finds the same file in the (in-memory) FaultFS.
const faultMeta = "/faultfs/mirror.meta"

// crashOp is one write of a crash workload and what its caller was told.
type crashOp struct {
	off     int64
	data    []byte
	fua     bool
	acked   bool // WriteAt returned nil
	durable bool // acked with FUA, or a Flush returned nil after it
}

// crashOps are writes to disjoint ranges (so each range ends up either
// old or new), several crossing region boundaries.
func crashOps(seed uint64, n int) []*crashOp {
	rng := rand.New(rand.NewPCG(seed, 77))
	ops := make([]*crashOp, n)
	for j := range ops {
		ops[j] = &crashOp{off: int64(j)*60000 + 13, data: randBytes(rng, 3000+int64(j)*4000), fua: j%3 == 0}
	}
	return ops
}

func (o *crashOp) do(l block.Layer) {
	o.acked = l.WriteAt(o.data, o.off, o.fua) == nil
	o.durable = o.acked && o.fua
}

func flushed(l block.Layer, ops []*crashOp) {
	if l.Flush() == nil {
		for _, o := range ops {
			o.durable = o.durable || o.acked
		}
	}
}

// verifyAfterCrash checks every leg of l alone: identical to each other,
// equal to base outside the ops, each op's range old or new, and new where
// the op was durable (or acknowledged, when strictAcked: plain data files
// survive the "crash" as written).
func verifyAfterCrash(t *testing.T, l *Layer, base []byte, ops []*crashOp, strictAcked bool) {
	t.Helper()
	first := make([]byte, len(base))
	if err := l.ReadCopy(0, first, 0); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(base)
	for j, o := range ops {
		got := first[o.off : o.off+int64(len(o.data))]
		isNew := bytes.Equal(got, o.data)
		if !isNew && !bytes.Equal(got, base[o.off:o.off+int64(len(o.data))]) {
			t.Fatalf("op %d: range holds neither the old nor the new data", j)
		}
		if !isNew && (o.durable || strictAcked && o.acked) {
			t.Fatalf("op %d (acked %v, durable %v) lost", j, o.acked, o.durable)
		}
		if isNew {
			copy(want[o.off:], o.data)
		}
	}
	if d := firstDiff(first, want); d >= 0 {
		t.Fatalf("copy 0 differs outside the written ranges at %d", d)
	}
	checkCopies(t, l, want)
}

// dataModes are the legs crash tests run on: plain files, whose every
// write survives the crash (as after a killed process), and files behind
// a volatile cache of which the crash keeps no unflushed write, or an
// arbitrary half.
var dataModes = []struct {
	name   string
	cached bool
	keep   func(int) bool
}{{"files", false, nil}, {"cache lost", true, nil}, {"cache partly kept", true, blocktest.KeepSome(11)}}

// TestCrashDuringWriteBurst crashes the metadata at every write of a burst
// of writes and flushes (whole and torn), optionally with a leg failing in
// the middle of it, then restarts: the mirror must open, resynchronise,
// and hold every flushed write on every leg.
func TestCrashDuringWriteBurst(t *testing.T) {
	t.Parallel() // touches no package state
	for _, legFails := range []bool{false, true} {
		for _, data := range dataModes {
			t.Run(fmt.Sprintf("leg fails %v/%s", legFails, data.name), func(t *testing.T) {
				crashBurst(t, legFails, data.cached, data.keep)
			})
		}
	}
}

func crashBurst(t *testing.T, legFails, cached bool, keep func(int) bool) {
	const size = 512 << 10
	specFor := func(id string) string {
		s := fmt.Sprintf(`{"type":"mirror","params":{"region":65536,"meta":%q},"children":[
			{"type":"mirrortest-fail","params":{"id":%q},"children":[{"type":"file","params":{"path":"a.img"}}]},
			{"type":"file","params":{"path":"b.img"}}]}`, faultMeta, id)
		if cached {
			s = blocktest.Cached(t, s)
		}
		return s
	}
	// The prepared state: created, filled, closed cleanly.
	baseDir := t.TempDir()
	fs0 := blocktest.NewFaultFS()
	env := block.Env{Dir: baseDir, Size: size, Create: true, MetaFS: fs0.Open}
	l := openMirror(t, env, specFor("prep"))
	base := fillAll(t, l, 31)
	mustClose(t, l)

	run := func(t *testing.T, id string, fs *blocktest.FaultFS, dir string) []*crashOp {
		env := block.Env{Dir: dir, Size: size, MetaFS: fs.Open}
		l := openMirror(t, env, specFor(id))
		l.clearDelay.Store(0) // exercise clearing (stale maps synced first)
		ops := crashOps(5, 9)
		for _, o := range ops[:5] {
			if legFails && o == ops[3] {
				faults(id).write.Store(true) // leg a dies: leg b alone takes the rest
			}
			o.do(l)
		}
		flushed(l, ops)
		var wg sync.WaitGroup
		for _, o := range ops[5:8] {
			wg.Go(func() { o.do(l) })
		}
		wg.Wait()
		flushed(l, ops)
		for _, o := range ops[8:] {
			o.do(l)
		}
		flushed(l, ops)
		flushed(l, ops) // clears intent bits
		l.Close()       // errors expected after a crash
		faults(id).write.Store(false)
		return ops
	}

	dry := fs0.Restart()
	run(t, t.Name()+"/dry", dry, copyDir(t, baseDir))
	n := dry.Writes()
	if n < 5 { // group commit makes it vary a little
		t.Fatalf("the workload made only %d metadata writes", n)
	}
	t.Logf("crashing at each of %d metadata writes", n)
	tears := map[string]func(int) bool{"whole": nil, "torn page": fault.Half(bitmap.SlotSize), "torn header": fault.Half(64)}
	for tname, tear := range tears {
		t.Run(tname, func(t *testing.T) {
			t.Parallel()
			crashes := 0
			for k := 0; k <= n; k++ {
				id := fmt.Sprintf("%s/%d", t.Name(), k)
				dir := copyDir(t, baseDir)
				fs := fs0.Restart()
				fs.CrashAt, fs.Tear, fs.Keep = k, tear, keep
				ops := run(t, id, fs, dir)
				if fs.Crashed() {
					crashes++
				}
				env := block.Env{Dir: dir, Size: size, MetaFS: fs.Restart().Open}
				l, err := block.Build(env, blocktest.Spec(t, specFor(id)))
				if err != nil {
					t.Fatalf("crash at write %d: reopen: %v", k, err)
				}
				m := l.(*Layer)
				m.bg.Wait()
				if legFails {
					if err := m.Repair(context.Background(), nil); err != nil {
						t.Fatalf("crash at write %d: repair: %v", k, err)
					}
				}
				if d := m.Describe(); d.State != block.StateOK {
					t.Fatalf("crash at write %d: state %+v", k, d)
				}
				verifyAfterCrash(t, m, base, ops, !cached)
				mustClose(t, m)
			}
			if 2*crashes < n { // concurrent writes share Syncs: later k may not be reached
				t.Fatalf("only %d of %d runs crashed", crashes, n+1)
			}
		})
	}
}

// TestCrashDuringRepair crashes the metadata at every write of a repair
// that recreates a lost leg (with writes before and after it), then
// restarts and repairs again: the result must be complete on every leg.
func TestCrashDuringRepair(t *testing.T) {
	t.Parallel()
	for _, data := range dataModes {
		t.Run(data.name, func(t *testing.T) {
			t.Parallel()
			crashRepair(t, data.cached, data.keep)
		})
	}
}

func crashRepair(t *testing.T, cached bool, keep func(int) bool) {
	const size = 512 << 10
	spec := mirrorSpec(`{"region":65536,"meta":"`+faultMeta+`"}`, "a.img", "b.img")
	if cached {
		spec = blocktest.Cached(t, spec)
	}
	baseDir := t.TempDir()
	fs0 := blocktest.NewFaultFS()
	env := block.Env{Dir: baseDir, Size: size, Create: true, MetaFS: fs0.Open}
	l := openMirror(t, env, spec)
	base := fillAll(t, l, 41)
	mustClose(t, l)
	// Lose leg b and write while degraded: the prepared state.
	os.Remove(filepath.Join(baseDir, "b.img"))
	fs1 := fs0.Restart()
	env = block.Env{Dir: baseDir, Size: size, MetaFS: fs1.Open}
	l = openMirror(t, env, spec)
	write(t, l, base, []byte("degraded write"), 200000)
	write(t, l, base, []byte("another one"), 400000)
	mustClose(t, l)

	run := func(fs *blocktest.FaultFS, dir string) []*crashOp {
		l := openMirror(t, block.Env{Dir: dir, Size: size, MetaFS: fs.Open}, spec)
		l.checkpointEvery.Store(2) // crash points between checkpoints too
		ops := crashOps(9, 4)
		ops[0].do(l)
		l.Repair(context.Background(), nil) // fails after a crash
		ops[1].do(l)
		ops[2].do(l)
		flushed(l, ops)
		ops[3].do(l)
		l.Close()
		return ops
	}
	dry := fs1.Restart()
	run(dry, copyDir(t, baseDir))
	n := dry.Writes()
	if n < 10 {
		t.Fatalf("the workload made only %d metadata writes", n)
	}
	t.Logf("crashing at each of %d metadata writes", n)
	for tname, tear := range map[string]func(int) bool{"whole": nil, "torn page": fault.Half(bitmap.SlotSize), "torn header": fault.Half(64)} {
		for k := 0; k <= n; k++ {
			dir := copyDir(t, baseDir)
			fs := fs1.Restart()
			fs.CrashAt, fs.Tear, fs.Keep = k, tear, keep
			ops := run(fs, dir)
			env := block.Env{Dir: dir, Size: size, MetaFS: fs.Restart().Open}
			l, err := block.Build(env, blocktest.Spec(t, spec))
			if err != nil {
				t.Fatalf("%s crash at write %d: reopen: %v", tname, k, err)
			}
			m := l.(*Layer)
			m.bg.Wait()
			if err := m.Repair(context.Background(), nil); err != nil {
				t.Fatalf("%s crash at %d: repair: %v", tname, k, err)
			}
			verifyAfterCrash(t, m, base, ops, !cached)
			mustClose(t, m)
		}
	}
}
