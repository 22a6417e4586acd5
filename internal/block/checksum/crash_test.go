package checksum

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/bitmap"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/fault"
)

// crashOp is one step of the crash workload.
type crashOp struct {
	kind   string // write, zero, trim, flush, resize
	off, n int64
	fua    bool
}

const crashSize = GroupData + 5000 // two groups, the last ending in a short block

var crashOps = []crashOp{
	{kind: "write", off: 100, n: 9000},
	{kind: "write", off: GroupData + 100, n: 3000},
	{kind: "flush"},
	{kind: "write", off: GroupData - 5000, n: 10000, fua: true}, // across the groups to the end
	{kind: "write", off: crashSize - 6000, n: 6000},
	{kind: "zero", off: GroupData - 4000, n: 6000},
	{kind: "trim", off: GroupData - 2*BlockSize - 100, n: 2*BlockSize + 5100}, // to the end
	{kind: "write", off: 50, n: 100},
	{kind: "flush"},
	{kind: "write", off: 10, n: 20},
	{kind: "resize", n: 2*GroupData + 333},
	{kind: "write", off: crashSize - 100, n: 10000},       // across the old end
	{kind: "write", off: 2*GroupData + 333 - 500, n: 500}, // the new end
	{kind: "flush"},
	{kind: "write", off: 5 * BlockSize, n: BlockSize}, // never flushed
}

// run runs op i on l.
func run(l *Layer, op crashOp, i int) error {
	switch op.kind {
	case "write":
		return l.WriteAt(random(uint64(100+i), op.n), op.off, op.fua)
	case "zero":
		return l.WriteZeroes(op.off, op.n, block.ZeroFlags{})
	case "trim":
		return l.Trim(op.off, op.n, false)
	case "flush":
		return l.Flush()
	case "resize":
		return l.Resize(op.n)
	}
	panic(op.kind)
}

// effect applies op i to model (in place but for a resize) and returns it.
func effect(op crashOp, i int, model []byte) []byte {
	switch op.kind {
	case "write":
		copy(model[op.off:], random(uint64(100+i), op.n))
	case "zero":
		clear(model[op.off : op.off+op.n])
	case "trim": // whole blocks (the short last one too) become zeroes
		size := int64(len(model))
		for b := (op.off + BlockSize - 1) / BlockSize; b*BlockSize < size && min((b+1)*BlockSize, size) <= op.off+op.n; b++ {
			clear(model[b*BlockSize : min((b+1)*BlockSize, size)])
		}
	case "resize":
		model = append(model, make([]byte, op.n-int64(len(model)))...)
	}
	return model
}

// TestCrashAtEveryMetaWrite crashes the in-flux map at each of its writes
// during a workload of writes, zeroes, trims, flushes and a resize (torn
// and not; and with every table write since the last flush lost while
// the data landed), restarts, and checks that the layer opens, reads
// everything without error, and holds every acknowledged write — the data
// files keep what was written, so that is stronger than "every flushed
// write" — and for the operation the crash interrupted, each block old or
// new.
func TestCrashAtEveryMetaWrite(t *testing.T) {
	n := countMetaWrites(t, spec)
	for _, c := range []struct {
		tear func(int) bool
		lose bool
	}{{nil, true}, {fault.Half(bitmap.SlotSize), true}} {
		for k := 0; k <= n; k++ {
			t.Run(fmt.Sprintf("tear=%v/lose=%v/crash=%d", c.tear != nil, c.lose, k), func(t *testing.T) {
				crashRun(t, k, n, c.tear, c.lose)
			})
		}
	}
}

// TestCrashVolatileChild runs the same workload over a child behind a
// volatile cache, crashing at each metadata write: whatever the crash
// drops of what was never flushed (all of it, or an arbitrary half), the
// layer must open, read everything without a checksum error, scrub clean,
// and hold every byte a Flush or FUA made durable.
func TestCrashVolatileChild(t *testing.T) {
	cspec := blocktest.Cached(t, spec)
	n := countMetaWrites(t, cspec)
	for _, keep := range []struct {
		name string
		fn   func(int) bool
	}{{"lost", nil}, {"partly kept", blocktest.KeepSome(7)}} {
		for _, tear := range []func(int) bool{nil, fault.Half(bitmap.SlotSize)} {
			for k := 0; k <= n; k++ {
				t.Run(fmt.Sprintf("%s/tear=%v/crash=%d", keep.name, tear != nil, k), func(t *testing.T) {
					volatileRun(t, cspec, k, n, tear, keep.fn)
				})
			}
		}
	}
}

// countMetaWrites counts the metadata writes of the workload on spec.
func countMetaWrites(t *testing.T, spec string) int {
	fs := blocktest.NewFaultFS()
	l, err := block.Build(block.Env{Dir: t.TempDir(), Size: crashSize, Create: true, MetaFS: fs.Open}, blocktest.Spec(t, spec))
	must(t, err)
	start := fs.Writes()
	for i, op := range crashOps {
		must(t, run(l.(*Layer), op, i))
	}
	n := fs.Writes() - start
	l.Close()
	if n < 8 {
		t.Fatalf("only %d metadata writes in the workload", n)
	}
	return n
}

// flushedBase writes a flushed base the workload overwrites in part
// (around the operations, to keep the test fast) and returns it.
func flushedBase(t *testing.T, l *Layer) []byte {
	model := make([]byte, crashSize)
	for _, r := range [][2]int64{{0, 64 << 10}, {GroupData - 64<<10, 64<<10 + 5000}} {
		p := random(uint64(r[0]), r[1])
		must(t, l.WriteAt(p, r[0], false))
		copy(model[r[0]:], p)
	}
	must(t, l.Flush())
	return model
}

func crashRun(t *testing.T, k, n int, tear func(int) bool, lose bool) {
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	fs := blocktest.NewFaultFS()
	fs.Keep = blocktest.KeepAll // the data files keep every write: so do the tables
	l := build(t, block.Env{Dir: dir, Size: crashSize, Create: true, MetaFS: fs.Open})
	model := flushedBase(t, l)
	durable := tables(t, img)
	fs.CrashAt, fs.Tear = fs.Writes()+k, tear
	after := model
	var crashed bool
	for i, op := range crashOps {
		if err := run(l, op, i); err != nil {
			// The server dies here; op may have been partly done.
			crashed = true
			after = effect(op, i, append([]byte(nil), model...))
			// The child never fails here: a failed Flush flushed the
			// child before its map write crashed (which, torn, may even
			// have landed); a Resize that grew the file fsynced it.
			if op.kind == "flush" || op.kind == "resize" && fileSize(t, img) > ChildSize(int64(len(model))) {
				durable = tables(t, img)
			}
			break
		}
		model = effect(op, i, model)
		after = model
		if op.kind == "flush" || op.kind == "resize" {
			durable = tables(t, img)
		}
	}
	if crashed != (k < n) || crashed != fs.Crashed() {
		t.Fatalf("crash at write %d of %d: workload failed %v, fault fs crashed %v", k, n, crashed, fs.Crashed())
	}
	crash(l)
	if lose {
		// Every table write since the last flush is lost, every data
		// write landed: the worst case for false corruption reports.
		for g, raw := range durable {
			rawWrite(t, img, raw, tableOff(int64(g)))
		}
		for g := int64(len(durable)); g < groupsFor(DataSize(fileSize(t, img))); g++ {
			rawWrite(t, img, make([]byte, BlockSize), tableOff(g))
		}
	}

	l = build(t, block.Env{Dir: dir, MetaFS: fs.Restart().Open})
	defer l.Close()
	size := l.Size()
	if size != int64(len(model)) && size != int64(len(after)) {
		t.Fatalf("size %d after restart, want %d or %d", size, len(model), len(after))
	}
	got := readAll(t, l) // no block may read as corrupt
	for b := int64(0); b*BlockSize < size; b++ {
		lo, hi := b*BlockSize, min((b+1)*BlockSize, size)
		blk := got[lo:hi]
		if hi <= int64(len(model)) && bytes.Equal(blk, model[lo:hi]) ||
			hi <= int64(len(after)) && bytes.Equal(blk, after[lo:hi]) ||
			lo >= int64(len(model)) && bytes.Equal(blk, zeroBlock[:hi-lo]) {
			continue
		}
		t.Fatalf("block %d after restart is neither before nor after the interrupted operation", b)
	}
	rep, err := l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 0 {
		t.Fatalf("scrub after restart: %+v %v", rep, err)
	}
	// And the restarted layer works.
	must(t, l.WriteAt([]byte("after"), 3, true))
	must(t, l.Flush())
}

// volatileRun is one crash of TestCrashVolatileChild: the workload on
// cspec crashing at metadata write k, keeping what keep selects of the
// cache.
func volatileRun(t *testing.T, cspec string, k, n int, tear, keep func(int) bool) {
	dir := t.TempDir()
	fs := blocktest.NewFaultFS()
	env := block.Env{Dir: dir, Size: crashSize, Create: true, MetaFS: fs.Open}
	l0, err := block.Build(env, blocktest.Spec(t, cspec))
	must(t, err)
	l := l0.(*Layer)
	model := flushedBase(t, l)
	// known[i] is 1 when byte i of model is durable: flushed, or written
	// with FUA, and not touched since by an operation that was not.
	known := bytes.Repeat([]byte{1}, crashSize)
	var pending [][2]int64
	mark := func(off, n int64, v byte) {
		for i := off; i < off+n && i < int64(len(known)); i++ {
			known[i] = v
		}
	}
	fs.CrashAt, fs.Tear, fs.Keep = fs.Writes()+k, tear, keep
	crashed := false
	for i, op := range crashOps {
		if op.kind == "write" || op.kind == "zero" || op.kind == "trim" {
			mark(op.off, op.n, 0)
		}
		if err := run(l, op, i); err != nil {
			crashed = true // op may have been partly done: its range is unknown
			break
		}
		model = effect(op, i, model)
		switch {
		case op.kind == "write" && op.fua:
			mark(op.off, op.n, 1)
		case op.kind == "write" || op.kind == "zero" || op.kind == "trim":
			pending = append(pending, [2]int64{op.off, op.n})
		case op.kind == "flush":
			for _, r := range pending {
				mark(r[0], r[1], 1)
			}
			pending = nil
		case op.kind == "resize": // the new range is durably zero
			known = append(known, bytes.Repeat([]byte{1}, len(model)-len(known))...)
		}
	}
	if crashed != (k < n) || crashed != fs.Crashed() {
		t.Fatalf("crash at write %d of %d: workload failed %v, fault fs crashed %v", k, n, crashed, fs.Crashed())
	}
	crash(l)

	env.Create, env.MetaFS = false, fs.Restart().Open
	l0, err = block.Build(env, blocktest.Spec(t, cspec))
	if err != nil {
		t.Fatalf("crash at metadata write %d: reopen: %v", k, err)
	}
	l = l0.(*Layer)
	defer l.Close()
	got := readAll(t, l) // no block may read as corrupt
	for i := range min(len(got), len(model)) {
		if known[i] == 1 && got[i] != model[i] {
			t.Fatalf("crash at metadata write %d: durable byte %d (block %d) lost", k, i, i/BlockSize)
		}
	}
	rep, err := l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 0 {
		t.Fatalf("scrub after restart: %+v %v", rep, err)
	}
	must(t, l.WriteAt([]byte("after"), 3, true))
	must(t, l.Flush())
}

// tables reads every table block of the child file at img.
func tables(t *testing.T, img string) [][]byte {
	var out [][]byte
	for g := range groupsFor(DataSize(fileSize(t, img))) {
		out = append(out, rawRead(t, img, BlockSize, tableOff(g)))
	}
	return out
}

func fileSize(t *testing.T, path string) int64 {
	st, err := os.Stat(path)
	must(t, err)
	return st.Size()
}
