package parity

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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// faultyType is a layer over one child (a leg) whose reads, writes or
// flushes fail with EIO while its switches (faultsFor) are on: a disk
// that opens but fails its I/O (with torn, a failing write lands its first
// half first). Params: {"id": NAME}.
const faultyType = "parity-test-faulty"

// legFaults are a faulty layer's switches.
type legFaults struct{ read, write, flush, torn atomic.Bool }

func (f *legFaults) set(kind string, on bool) {
	switch kind {
	case "read":
		f.read.Store(on)
	case "write":
		f.write.Store(on)
	case "flush":
		f.flush.Store(on)
	default:
		panic("fault kind " + kind)
	}
}

func (f *legFaults) off() {
	for _, k := range []string{"read", "write", "flush"} {
		f.set(k, false)
	}
}

var faultSwitches sync.Map // id -> *legFaults

func faultsFor(id string) *legFaults {
	f, _ := faultSwitches.LoadOrStore(id, &legFaults{})
	return f.(*legFaults)
}

// newFaults is fresh switches, off, for the faulty layers of id built
// from now on: ids are test names, and under go test -count=N a run
// would otherwise start with the faults a previous run left on.
func newFaults(id string) *legFaults {
	f := &legFaults{}
	faultSwitches.Store(id, f)
	return f
}

var errLegIO = fmt.Errorf("injected medium error: %w", syscall.EIO)

type faulty struct {
	block.Layer
	f   *legFaults
	raw json.RawMessage
}

func init() {
	block.Register(block.Type{Name: faultyType, MinChildren: 1, MaxChildren: 1,
		New: func(_ block.Env, raw json.RawMessage, ch []block.Layer) (block.Layer, error) {
			var p struct {
				ID string `json:"id"`
			}
			if err := block.DecodeParams(raw, &p); err != nil {
				return nil, err
			}
			return &faulty{Layer: ch[0], f: faultsFor(p.ID), raw: raw}, nil
		}})
}

func (f *faulty) ReadAt(p []byte, off int64) error {
	if f.f.read.Load() {
		return errLegIO
	}
	return f.Layer.ReadAt(p, off)
}

func (f *faulty) WriteAt(p []byte, off int64, fua bool) error {
	if f.f.write.Load() {
		if f.f.torn.Load() {
			f.Layer.WriteAt(p[:len(p)/2], off, false)
		}
		return errLegIO
	}
	return f.Layer.WriteAt(p, off, fua)
}

func (f *faulty) WriteZeroes(off, n int64, z block.ZeroFlags) error {
	if f.f.write.Load() {
		if f.f.torn.Load() {
			f.Layer.WriteZeroes(off, n/2, block.ZeroFlags{})
		}
		return errLegIO
	}
	return f.Layer.WriteZeroes(off, n, z)
}

func (f *faulty) Trim(off, n int64, fua bool) error {
	if f.f.write.Load() {
		return errLegIO
	}
	return f.Layer.Trim(off, n, fua)
}

func (f *faulty) Flush() error {
	if f.f.flush.Load() {
		return errLegIO
	}
	return f.Layer.Flush()
}

func (f *faulty) Describe() block.Node {
	kid := f.Layer.Describe()
	return block.Node{Type: faultyType, Params: f.raw, State: kid.State, Children: []block.Node{kid}}
}

func (f *faulty) Children() []block.Layer { return []block.Layer{f.Layer} }
func (f *faulty) Resize(n int64) error    { return f.Layer.(block.Resizer).Resize(n) }

// faultySpec is specFor with every leg under a faulty layer; it returns
// their switches, by leg.
func faultySpec(t *testing.T, n int, chunk int64) (string, []*legFaults) {
	var kids []string
	var fs []*legFaults
	for i := range n {
		id := fmt.Sprintf("%s/%d", t.Name(), i)
		fs = append(fs, newFaults(id))
		kids = append(kids, fmt.Sprintf(`{"type":%q,"params":{"id":%q},"children":[{"type":"file","params":{"path":"leg%d.img"}}]}`, faultyType, id, i))
	}
	return fmt.Sprintf(`{"type":"parity","params":{"chunk":%d},"children":[%s]}`, chunk, strings.Join(kids, ",")), fs
}

// dirtyStripes are the stripes crashedStore leaves being written, every
// leg the parity leg of some and a data leg of others.
var dirtyStripes = []int64{0, 1, 2, 3, 4, 9, 14, 23}

// crashedStore creates a parity volume of n legs in a new directory,
// fills it, then rewrites dirtyStripes durably (FUA) and "loses power":
// it returns a copy of the files as they are then — every write
// acknowledged and on disk, the stripes' intent bits still set — and
// the model of the data.
func crashedStore(t *testing.T, n int, chunk int64, spec string) (block.Env, []byte) {
	t.Helper()
	dsz := int64(n-1) * chunk
	env := block.Env{Dir: t.TempDir(), Size: 32*dsz - 1000, Create: true}
	l := build(t, env, spec)
	rng := rand.New(rand.NewPCG(uint64(n), 77))
	model := randBytes(rng, l.Size())
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil { // clean: nothing dirty
		t.Fatal(err)
	}
	env.Create = false
	l = build(t, env, spec)
	l.cleanDelay = time.Hour // the intent bits stay after the flushes
	for _, s := range dirtyStripes {
		p := randBytes(rng, dsz)
		if err := l.WriteAt(p, s*dsz, true); err != nil {
			t.Fatal(err)
		}
		copy(model[s*dsz:], p)
	}
	for _, s := range dirtyStripes {
		if !l.bm.Get(l.intentBit(s, l.epoch)) {
			t.Fatalf("stripe %d not dirty: the test does not set up what it means to", s)
		}
	}
	crashed := env
	crashed.Dir = copyStore(t, env.Dir)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return crashed, model
}

// lostByRecovery is which chunks on leg k an open after crashedStore
// loses when leg k fails the recovery's I/O of kind: recovery goes
// through the dirty stripes in order; a stripe whose data chunk on leg k
// it had made consistent before the leg failed keeps it (the parity it
// wrote reconstructs it), the others lose it (invariant 3). A read fails
// at the first stripe that reads leg k (where it holds data), a write at
// the first whose parity is on leg k, a flush after every stripe.
func lostByRecovery(l *Layer, k int, kind string) map[int64]bool {
	lost := map[int64]bool{}
	failed := false
	for _, s := range dirtyStripes {
		data := l.holdsData(s, k)
		switch {
		case kind == "read" && data, kind == "write" && l.parityLeg(s) == k:
			failed = true
		}
		if failed && data {
			lost[s] = true
		}
	}
	return lost
}

// checkChunks reads l chunk by chunk: a chunk in lost (by stripe and leg)
// must fail with EIO, every other one read as the model has it.
func checkChunks(t *testing.T, l *Layer, model []byte, lost func(s int64, leg int) bool, what string) {
	t.Helper()
	got := make([]byte, l.chunk)
	for off := int64(0); off < int64(len(model)); off += l.chunk {
		s, d := off/l.dsz, int((off%l.dsz)/l.chunk)
		leg := l.dataLeg(s, d)
		p := got[:min(l.chunk, int64(len(model))-off)]
		err := l.ReadAt(p, off)
		switch {
		case lost(s, leg):
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("%s: stripe %d chunk %d (leg %d) is lost: read %v, want EIO", what, s, d, leg, err)
			}
		case err != nil:
			t.Fatalf("%s: stripe %d chunk %d (leg %d): %v", what, s, d, leg, err)
		case !bytes.Equal(p, model[off:off+int64(len(p))]):
			t.Fatalf("%s: stripe %d chunk %d (leg %d) differs from what was written", what, s, d, leg)
		}
	}
}

func wantLegFailed(t *testing.T, l *Layer, k int, what string) {
	t.Helper()
	d := l.Describe()
	if l.state[k] != legFailed || l.disk[k] != legFailed || l.frozen.Load() {
		t.Fatalf("%s: leg %d state %q, on disk %q, frozen %v: want it failed, durably", what, k, l.state, l.disk, l.frozen.Load())
	}
	if countOut(l.state) != 1 || d.State != block.StateDegraded || d.Children[k].State != block.StateFailed {
		t.Fatalf("%s: state %s (legs %q, leg %d %s), want degraded with leg %d failed", what, d.State, l.state, k, d.Children[k].State, k)
	}
}

// A crash leaves stripes being written (their intent bits set) and at the
// restart one leg opens but fails its reads, writes or flushes. The open
// must not fail: the leg is marked failed (durably: the next open agrees,
// whether the leg works again or not) and the volume comes up degraded,
// every byte reading as written — except each chunk on that leg of a
// dirty stripe that recovery had not made consistent before the leg
// failed: that one cannot be recovered and reads as EIO (lost, as when a
// leg vanishes in a crash) until it is overwritten whole. A repair then
// brings the leg back.
func TestLegFailingRecoveryAtOpen(t *testing.T) {
	t.Parallel()
	const chunk = 4096
	for _, n := range []int{3, 4} {
		for _, kind := range []string{"read", "write", "flush"} {
			for k := range n {
				t.Run(fmt.Sprintf("%d legs/%s/leg %d", n, kind, k), func(t *testing.T) {
					t.Parallel()
					spec, faults := faultySpec(t, n, chunk)
					env, model := crashedStore(t, n, chunk, spec)
					faults[k].set(kind, true)
					l, err := block.Build(env, blocktest.Spec(t, spec))
					if err != nil {
						t.Fatalf("open after a crash with leg %d failing its %ss: %v", k, kind, err)
					}
					pl := l.(*Layer)
					defer func() { pl.Close() }()
					wantLegFailed(t, pl, k, "opened")
					lost := lostByRecovery(pl, k, kind)
					if kind == "read" && len(lost) == 0 {
						t.Fatal("no chunk lost: the test does not set up what it means to")
					}
					if got := pl.lost.Load(); got != int64(len(lost)) {
						t.Fatalf("%d chunks lost, want %d (stripes %v)", got, len(lost), lost)
					}
					isLost := func(s int64, leg int) bool { return leg == k && lost[s] }
					checkChunks(t, pl, model, isLost, "opened degraded")

					// Durable: the next open agrees, the leg failing or not.
					for _, on := range []bool{true, false} {
						if err := pl.Close(); err != nil {
							t.Fatal(err)
						}
						faults[k].set(kind, on)
						pl = build(t, env, spec)
						wantLegFailed(t, pl, k, fmt.Sprintf("reopened (leg failing %v)", on))
						checkChunks(t, pl, model, isLost, "reopened")
					}

					// A repair rebuilds the leg; the lost chunks stay lost
					// until overwritten whole.
					if err := pl.Repair(context.Background(), nil); err != nil {
						t.Fatal(err)
					}
					if st := pl.Describe().State; st != block.StateOK && len(lost) == 0 {
						t.Fatalf("repaired: state %s", st)
					}
					checkChunks(t, pl, model, isLost, "repaired")
					for s := range lost {
						off := s*pl.dsz + int64(pl.dataIndex(s, k))*chunk
						if err := pl.WriteAt(model[off:off+chunk], off, false); err != nil {
							t.Fatalf("overwrite lost chunk of stripe %d: %v", s, err)
						}
					}
					mustRead(t, pl, model, "lost chunks overwritten")
					if st := pl.Describe().State; st != block.StateOK {
						t.Fatalf("repaired and overwritten: state %s", st)
					}
					if err := pl.Close(); err != nil {
						t.Fatal(err)
					}
					checkParity(t, env, n, chunk)
				})
			}
		}
	}
}

// A second leg out while recovering at open freezes the layer, as two
// legs out at open do: the open succeeds, reads what the working legs
// hold (the rest fails with EIO), refuses writes, and writes no metadata —
// the first leg's failure is not persisted either — so that the next open
// with one of them back is merely degraded and recovers normally.
func TestSecondLegFailingRecoveryAtOpenFreezes(t *testing.T) {
	t.Parallel()
	const n, chunk = 4, 4096
	for _, tc := range []struct {
		name string
		// a fails the recovery's I/O of kindA (or its file is gone:
		// "gone"), b its I/O of kindB; then b works again.
		a, b         int
		kindA, kindB string
	}{
		{"one gone, another's read fails", 0, 1, "gone", "read"},
		{"a read fails, then another's flush", 2, 1, "flush", "read"},
		{"a read fails, then another's write", 3, 1, "read", "write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec, faults := faultySpec(t, n, chunk)
			env, model := crashedStore(t, n, chunk, spec)
			if tc.kindA == "gone" {
				loseLeg(t, env, tc.a)
			} else {
				faults[tc.a].set(tc.kindA, true)
			}
			faults[tc.b].set(tc.kindB, true)
			metaPath := filepath.Join(env.Dir, DefaultMeta)
			meta, err := os.ReadFile(metaPath)
			if err != nil {
				t.Fatal(err)
			}
			l, err := block.Build(env, blocktest.Spec(t, spec))
			if err != nil {
				t.Fatalf("open with legs %d and %d failing: %v, want it frozen", tc.a, tc.b, err)
			}
			pl := l.(*Layer)
			if st := pl.Describe().State; st != block.StateFailed || !pl.frozen.Load() || countOut(pl.state) != 2 {
				t.Fatalf("state %s, legs %q, frozen %v: want failed and frozen", st, pl.state, pl.frozen.Load())
			}
			if err := pl.WriteAt(make([]byte, 100), 0, false); !errors.Is(err, syscall.EIO) {
				t.Fatalf("write while frozen: %v, want EIO", err)
			}
			faults[tc.a].off() // reads of what it holds work again
			faults[tc.b].off()
			checkChunks(t, pl, model, func(_ int64, leg int) bool { return leg == tc.a || leg == tc.b }, "frozen")
			if err := pl.Close(); !errors.Is(err, syscall.EIO) && err != nil {
				t.Fatalf("close: %v", err)
			}
			after, _ := os.ReadFile(metaPath)
			if !bytes.Equal(meta, after) {
				t.Fatal("metadata changed by an open that froze")
			}

			// b works again: the open is merely degraded, recovering as
			// if only a had failed.
			if tc.kindA != "gone" {
				faults[tc.a].set(tc.kindA, true)
			}
			pl = build(t, env, spec)
			defer pl.Close()
			wantLegFailed(t, pl, tc.a, "reopened with one leg back")
			kind := tc.kindA
			if kind == "gone" {
				kind = "read" // every dirty chunk on it is lost
			}
			lost := lostByRecovery(pl, tc.a, kind)
			checkChunks(t, pl, model, func(s int64, leg int) bool { return leg == tc.a && lost[s] }, "reopened with one leg back")
		})
	}
}

// A leg whose flush fails when the volume is closed is marked failed, as
// at Flush: the other legs are flushed, so the close succeeds degraded,
// leaves nothing to recover, and every byte written reads back after a
// reopen — with the leg failing or not.
func TestCloseFailsLegWhoseFlushFails(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	spec, faults := faultySpec(t, n, chunk)
	env := block.Env{Dir: t.TempDir(), Size: 64 * chunk, Create: true}
	l := build(t, env, spec)
	rng := rand.New(rand.NewPCG(5, 5))
	model := randBytes(rng, l.Size())
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	const k = 1
	faults[k].flush.Store(true)
	if err := l.Close(); err != nil {
		t.Fatalf("close with leg %d failing its flush: %v", k, err)
	}
	if s := intentSet(l); s >= 0 {
		t.Fatalf("stripe %d's intent bit left set by a close that succeeded", s)
	}
	env.Create = false
	for _, on := range []bool{true, false} {
		faults[k].flush.Store(on)
		l = build(t, env, spec)
		wantLegFailed(t, l, k, fmt.Sprintf("reopened (leg failing %v)", on))
		mustRead(t, l, model, "reopened")
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// intentSet returns a stripe whose intent bit (of either epoch) is set in
// l's bitmap, or -1.
func intentSet(l *Layer) int64 {
	for i := l.bm.NextSet(0); i >= 0; i = l.bm.NextSet(i + 1) {
		if i%l.bps < 2 {
			return i / l.bps
		}
	}
	return -1
}

// An open on a full store leaves its recovery to settle, before the first
// update once there is space (see "A full store"). A leg that fails that
// recovery's I/O then is a leg failing while stripes are unsettled: the
// layer freezes (writes and flushes fail with EIO, nothing is persisted)
// rather than refuse every update with the leg's error while keeping it
// in service. The next open recovers: normally if the leg works again
// (and without it, degraded, if it still fails: TestLegFailingRecoveryAtOpen).
func TestLegFailingDeferredRecoveryFreezes(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	dsz := int64((n - 1) * chunk)
	var kids []string
	var full []*atomic.Bool
	var faults []*legFaults
	for i := range n {
		id := fmt.Sprintf("%s/%d", t.Name(), i)
		full = append(full, blocktest.NewFullSwitch(id))
		faults = append(faults, newFaults(id))
		child := fmt.Sprintf(`{"type":"file","params":{"path":"leg%d.img"}}`, i)
		kids = append(kids, fmt.Sprintf(`{"type":%q,"params":{"id":%q},"children":[%s]}`, faultyType, id, blocktest.FillingSpec(id, child)))
	}
	spec := fmt.Sprintf(`{"type":"parity","params":{"chunk":%d},"children":[%s]}`, chunk, strings.Join(kids, ","))
	env := block.Env{Dir: t.TempDir(), Size: 16 * dsz, Create: true}
	l := build(t, env, spec)
	rng := rand.New(rand.NewPCG(43, 1))
	model := randBytes(rng, env.Size)
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	l.cleanDelay = 0
	if err := l.Flush(); err != nil { // every stripe clean
		t.Fatal(err)
	}
	dirty := map[int64]bool{0: true, 5: true, 11: true}
	for _, off := range []int64{100, 5*dsz + 3000, 11 * dsz} {
		p := randBytes(rng, 5000)
		if err := l.WriteAt(p, off, false); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
	setAll(full, true)
	wantNoSpace(t, l.Close(), "close")
	env.Create = false
	l = build(t, env, spec) // its recovery waits for space
	wantAllOK(t, l, "opened on a full store")

	const k = 1
	setAll(full, false)
	faults[k].read.Store(true)
	if err := l.Flush(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("flush whose recovery leg %d fails: %v, want EIO", k, err)
	}
	if !l.frozen.Load() || l.state[k] != legFailed || l.disk[k] != legOK {
		t.Fatalf("legs %q (on disk %q), frozen %v: want leg %d out in memory only, frozen", l.state, l.disk, l.frozen.Load(), k)
	}
	if err := l.WriteAt(make([]byte, 10), 7*dsz, false); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write while frozen: %v, want EIO", err)
	}
	// The chunks on the working legs read as written, and so do those on
	// leg k of clean stripes (reconstructed); those of the stripes still
	// to recover cannot be.
	checkChunks(t, l, model, func(s int64, leg int) bool { return leg == k && dirty[s] }, "frozen")
	l.Close() // frozen: the intent bits stay

	// Nothing was persisted: with the leg working, the next open is an
	// ordinary recovery, every leg ok and every byte as written.
	faults[k].read.Store(false)
	l = build(t, env, spec)
	wantAllOK(t, l, "reopened with the leg working")
	mustRead(t, l, model, "reopened with the leg working")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkParity(t, env, n, chunk)
}

// Random operations (unaligned, partial stripes, zeroes, trims, extents)
// while one leg at a time fails its reads, writes or flushes — the faults
// kept across reopens, after a clean close or a crash (the files copied
// as they are, stripes still being written) — or vanishes across a
// reopen, with repairs. Nothing may fail but reads of a chunk marked lost
// (EIO); every other byte reads as the model has it; a repair and
// overwriting the lost chunks bring back a healthy volume with
// consistent parity.
func TestRandomLegFaultsAcrossReopens(t *testing.T) {
	t.Parallel()
	for _, n := range []int{3, 4} {
		for seed := uint64(1); seed <= 12; seed++ {
			t.Run(fmt.Sprintf("%d legs/%d", n, seed), func(t *testing.T) {
				t.Parallel()
				randomLegFaults(t, n, seed)
			})
		}
	}
}

func randomLegFaults(t *testing.T, n int, seed uint64) {
	const chunk = 4096
	spec, faults := faultySpec(t, n, chunk)
	env := block.Env{Dir: t.TempDir(), Size: 100*chunk + 1536, Create: true}
	l := build(t, env, spec)
	defer func() { l.Close() }()
	env.Create = false
	size := l.Size()
	model := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, 11))
	var hist []string
	fail := func(f string, a ...any) {
		t.Helper()
		for _, h := range hist[max(0, len(hist)-25):] {
			t.Log("  ", h)
		}
		t.Fatalf(f, a...)
	}
	faultOn := func() bool {
		for _, f := range faults {
			if f.read.Load() || f.write.Load() || f.flush.Load() {
				return true
			}
		}
		return false
	}
	allOff := func() {
		for _, f := range faults {
			f.off()
		}
	}
	// pieces calls fn for each chunk piece of [off, off+n) with whether it
	// is marked lost.
	pieces := func(off, n int64, fn func(off, n int64, lost bool)) {
		for x, end := off, off+n; x < end; {
			s, d := x/l.dsz, int(x%l.dsz/chunk)
			b := min(end, s*l.dsz+int64(d+1)*chunk)
			fn(x, b-x, l.isLost(s, l.dataLeg(s, d)))
			x = b
		}
	}
	// check reads [off, off+n): as the model has it, or EIO where (and
	// only where) a chunk is lost.
	check := func(off, n int64, what string) {
		got := make([]byte, n)
		err := l.ReadAt(got, off)
		if err == nil {
			if !bytes.Equal(got, model[off:off+n]) {
				fail("%s %d+%d: differs from the model (legs %q)", what, off, n, l.state)
			}
			return
		}
		if !errors.Is(err, syscall.EIO) {
			fail("%s %d+%d: %v", what, off, n, err)
		}
		anyLost := false
		pieces(off, n, func(x, m int64, lost bool) {
			anyLost = anyLost || lost
			p := make([]byte, m)
			err := l.ReadAt(p, x)
			switch {
			case lost && !errors.Is(err, syscall.EIO):
				fail("%s: lost chunk at %d reads %v, want EIO", what, x, err)
			case !lost && err != nil:
				fail("%s %d+%d: %v (legs %q)", what, x, m, err, l.state)
			case !lost && !bytes.Equal(p, model[x:x+m]):
				fail("%s %d+%d: differs from the model (legs %q)", what, x, m, l.state)
			}
		})
		if !anyLost {
			fail("%s %d+%d: %v, but no chunk in it is lost", what, off, n, err)
		}
	}
	for i := range 300 {
		off := rng.Int64N(size)
		n := min(rng.Int64N(30000)+1, size-off)
		if rng.IntN(5) == 0 {
			off = size - 1 - rng.Int64N(min(size, 20000))
			n = size - off
		}
		op := rng.IntN(13)
		hist = append(hist, fmt.Sprintf("op %d kind %d %d+%d legs %q lost %d", i, op, off, n, l.state, l.lost.Load()))
		switch op {
		case 0, 1, 2:
			p := randBytes(rng, n)
			if err := l.WriteAt(p, off, rng.IntN(4) == 0); err != nil {
				fail("write %d+%d: %v", off, n, err)
			}
			copy(model[off:], p)
		case 3:
			if err := l.WriteZeroes(off, n, block.ZeroFlags{NoHole: rng.IntN(2) == 0}); err != nil {
				fail("zero %d+%d: %v", off, n, err)
			}
			clear(model[off : off+n])
		case 4:
			if err := l.Trim(off, n, false); err != nil {
				fail("trim %d+%d: %v", off, n, err)
			}
			// Trim zeroes whole stripes or nothing: each byte reads as
			// zero or as before (a lost chunk it did not reach stays so).
			pieces(off, n, func(x, m int64, lost bool) {
				p := make([]byte, m)
				err := l.ReadAt(p, x)
				switch {
				case lost && errors.Is(err, syscall.EIO):
					return
				case err != nil:
					fail("read after trim %d+%d: %v", x, m, err)
				}
				for j := range p {
					if p[j] != 0 && p[j] != model[x+int64(j)] {
						fail("trim: byte %d reads %#x, was %#x", x+int64(j), p[j], model[x+int64(j)])
					}
				}
				copy(model[x:], p)
			})
		case 5, 6:
			check(off, n, "read")
		case 7:
			if faultOn() || l.Describe().State != block.StateOK {
				continue
			}
			k := rng.IntN(len(faults))
			kind := []string{"read", "write", "flush"}[rng.IntN(3)]
			faults[k].torn.Store(rng.IntN(2) == 0)
			faults[k].set(kind, true)
			hist = append(hist, fmt.Sprintf("   leg %d fails its %ss", k, kind))
		case 8:
			allOff()
		case 9:
			if err := l.Flush(); err != nil {
				fail("flush: %v", err)
			}
		case 10:
			allOff()
			if err := l.Repair(context.Background(), nil); err != nil {
				fail("repair: %v", err)
			}
			check(0, size, "after repair")
		case 11: // reopen, the faults kept; after a crash, or a leg gone
			crash := rng.IntN(3) == 0
			if crash {
				from := env.Dir
				env.Dir = copyStore(t, from)
				hist = append(hist, "   crash")
			} else if rng.IntN(2) == 0 {
				l.Flush()
			}
			cerr := l.Close()
			if !crash && cerr != nil {
				fail("close: %v", cerr)
			}
			if !crash && !faultOn() && l.Describe().State == block.StateOK && rng.IntN(3) == 0 {
				k := rng.IntN(len(faults))
				loseLeg(t, env, k)
				hist = append(hist, fmt.Sprintf("   removed leg %d", k))
			}
			lb, err := block.Build(env, blocktest.Spec(t, spec))
			if err != nil {
				fail("reopen: %v", err)
			}
			l = lb.(*Layer)
			if countOut(l.state) > 1 || l.frozen.Load() {
				fail("reopened with legs %q (frozen %v): one leg at a time fails", l.state, l.frozen.Load())
			}
		case 12:
			ex, err := l.Extents(off, n)
			if err != nil {
				fail("extents: %v", err)
			}
			at := off
			for _, e := range ex {
				end := min(at+e.Length, off+n)
				for j := at; j < end; j++ {
					if model[j] != 0 && (e.Zero || e.Hole) {
						fail("extents %d..%d zero=%v hole=%v but byte %d holds data", at, end, e.Zero, e.Hole, j)
					}
				}
				if at = end; at >= off+n {
					break
				}
			}
		}
	}
	allOff()
	if err := l.Repair(context.Background(), nil); err != nil {
		fail("repair: %v", err)
	}
	check(0, size, "final")
	// Overwriting the lost chunks whole heals them.
	for s := int64(0); s < l.stripes.Load(); s++ {
		for d := range n - 1 {
			if off := s*l.dsz + int64(d)*chunk; off < size && l.isLost(s, l.dataLeg(s, d)) {
				end := min(off+chunk, size)
				if err := l.WriteAt(model[off:end], off, false); err != nil {
					fail("overwrite lost chunk at %d: %v", off, err)
				}
			}
		}
	}
	mustRead(t, l, model, "healed")
	if st := l.Describe().State; st != block.StateOK {
		fail("healed: state %s", st)
	}
	if err := l.Close(); err != nil {
		fail("close: %v", err)
	}
	checkParity(t, env, n, chunk)
}
