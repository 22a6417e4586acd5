package cow

import (
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// benchLayer is a 256 MiB volume with the default chunk, every chunk
// written, snapshotted, and every other MiB written again: reads map to
// both images.
func benchLayer(b *testing.B) *Layer {
	const size = 256 << 20
	root := b.TempDir()
	env := block.Env{Dir: filepath.Join(root, "vol"), Images: filepath.Join(root, "images"), Size: size, Create: true}
	d, err := block.Build(env, blocktest.Spec(b, bigSpec))
	if err != nil {
		b.Fatal(err)
	}
	l := d.(*Layer)
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	for off := int64(0); off < size; off += 1 << 20 {
		if err := l.WriteAt(buf, off, false); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := l.Snapshot("bench"); err != nil {
		b.Fatal(err)
	}
	for off := int64(0); off < size; off += 2 << 20 {
		if err := l.WriteAt(buf, off, false); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Flush(); err != nil {
		b.Fatal(err)
	}
	return l
}

// BenchmarkReadAt: random 4 KiB reads and sequential 1 MiB reads through
// the layer, from the page cache (the owner table's lookup is on this
// path).
func BenchmarkReadAt(b *testing.B) {
	l := benchLayer(b)
	defer l.Close()
	size := l.Size()
	for _, bs := range []int64{4 << 10, 1 << 20} {
		b.Run(sizeName(bs), func(b *testing.B) {
			b.SetBytes(bs)
			b.RunParallel(func(pb *testing.PB) {
				p := make([]byte, bs)
				rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
				for pb.Next() {
					if err := l.ReadAt(p, rng.Int64N(size/bs)*bs); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkRuns: the owner table's part of a read alone, mapping a 4 KiB
// and a 1 MiB range to the images that hold it.
func BenchmarkRuns(b *testing.B) {
	l := benchLayer(b)
	defer l.Close()
	size := l.Size()
	for _, bs := range []int64{4 << 10, 1 << 20} {
		b.Run(sizeName(bs), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 1))
			n := 0
			for b.Loop() {
				l.chainMu.RLock()
				n += len(l.runs(rng.Int64N(size/bs)*bs, bs, false))
				l.chainMu.RUnlock()
			}
			if n == 0 {
				b.Fatal("no runs")
			}
		})
	}
}

func sizeName(n int64) string {
	if n >= 1<<20 {
		return "1M"
	}
	return "4k"
}

// BenchmarkOwnerLoad: one lookup in the paged owner table against one in
// the flat slice it replaced, over a 256 GiB volume's worth of chunks (a
// third of them held), at random chunks and chunk after chunk.
func BenchmarkOwnerLoad(b *testing.B) {
	const n = 1 << 22
	flat := make([]atomic.Uint32, n)
	tb := newOwnerTable(n, ownerPageShift)
	for c := int64(0); c < n; c += 3 {
		flat[c].Store(1)
		tb.Store(c, 1)
	}
	rng := rand.New(rand.NewPCG(2, 2))
	idx := make([]int64, 1<<16)
	for i := range idx {
		idx[i] = rng.Int64N(n)
	}
	var sink uint32
	for _, order := range []string{"random", "sequential"} {
		at := func(i int) int64 { return idx[i&(len(idx)-1)] }
		if order == "sequential" {
			at = func(i int) int64 { return int64(i) & (n - 1) }
		}
		b.Run(order+"/flat", func(b *testing.B) {
			for i := range b.N {
				sink += flat[at(i)].Load()
			}
		})
		b.Run(order+"/paged", func(b *testing.B) {
			for i := range b.N {
				sink += tb.Load(at(i))
			}
		})
	}
	_ = sink
}
