package cow

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/basalt-storage/basalt/internal/block/blocktest"
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

	fds := blocktest.Pipe(t)
	spliced := 0
	for i := range 300 {
		off := rng.Int64N(int64(len(model)))
		n := int(min(rng.Int64N(200<<10)+1, int64(len(model))-off))
		k := l.SpliceTo(fds[1], off, n, i%2 == 0)
		if k < 0 || k > n {
			t.Fatalf("SpliceTo(%d, %d) moved %d", off, n, k)
		}
		got := make([]byte, n)
		blocktest.ReadPipe(t, fds[0], got[:k])
		if err := l.ReadAt(got[k:], off+int64(k)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model[off:off+int64(n)]) {
			t.Fatalf("range %d+%d (%d spliced): wrong bytes", off, n, k)
		}
		spliced += k
	}
	if spliced == 0 {
		t.Fatal("nothing was spliced")
	}
}
