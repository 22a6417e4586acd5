package cow

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"golang.org/x/sys/unix"
)

// TestSpliceTo: bytes spliced from a chain (runs in the top and in bases,
// holes, and a base smaller than the grown volume) followed by ReadAt of
// the rest are the volume's bytes, whatever the range.
func TestSpliceTo(t *testing.T) {
	env := testEnv(t, 256<<10)
	l := build(t, env, fileSpec)
	defer l.Close()
	rng := rand.New(rand.NewPCG(12, 13))
	model := make([]byte, env.Size)
	for i := range 3 {
		randomOps(t, rng, l, model, 15)
		if _, err := l.Snapshot("s" + string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Resize(512 << 10); err != nil { // the bases end at 256 KiB
		t.Fatal(err)
	}
	model = append(model, make([]byte, 256<<10)...)
	randomOps(t, rng, l, model, 10)

	spliced := blocktest.SpliceReads(t, l, model, rng, 300, 200<<10, "chain")
	if spliced == 0 {
		t.Fatal("nothing was spliced")
	}
}

// TestSpliceFrom: writes taken from a pipe (as far as the layer takes
// them, the rest written with WriteAt) between snapshots leave the volume
// holding what was written — through the snapshots, which make every
// chunk a base's (those the layer refuses: they need a copy-up), and
// through a reopen, which reads back which chunks the top holds.
func TestSpliceFrom(t *testing.T) {
	env := testEnv(t, 1<<20)
	l := build(t, env, fileSpec)
	rng := rand.New(rand.NewPCG(14, 15))
	model := make([]byte, env.Size)
	fds := blocktest.Pipe(t)
	taken, refused := 0, 0
	for i := range 300 {
		if i%60 == 59 {
			if _, err := l.Snapshot("s" + string(rune('a'+i/60))); err != nil {
				t.Fatal(err)
			}
		}
		off := rng.Int64N(int64(len(model)))
		n := int(min(rng.Int64N(200<<10)+1, int64(len(model))-off))
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(rng.Uint32())
		}
		if _, err := unix.Write(fds[1], p); err != nil {
			t.Fatal(err)
		}
		k := l.SpliceFrom(fds[0], off, n)
		if k < 0 || k > n {
			t.Fatalf("SpliceFrom(%d, %d) took %d", off, n, k)
		}
		rest := make([]byte, n-k)
		blocktest.ReadPipe(t, fds[0], rest)
		if !bytes.Equal(rest, p[k:]) {
			t.Fatalf("SpliceFrom(%d, %d) took %d bytes and left others in the pipe", off, n, k)
		}
		if err := l.WriteAt(rest, off+int64(k), false); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
		taken += k
		if k == 0 {
			refused++
		}
	}
	if taken == 0 || refused == 0 {
		t.Fatalf("took %d bytes, refused %d writes: want some of each", taken, refused)
	}
	expect(t, l, model, "after spliced writes")
	if _, err := l.Snapshot("last"); err != nil {
		t.Fatal(err)
	}
	expect(t, l, model, "after a snapshot")
	l = reopen(t, l, &env, fileSpec)
	defer l.Close()
	expect(t, l, model, "after a reopen")
}
