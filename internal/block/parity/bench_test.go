package parity

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	_ "github.com/basalt-storage/basalt/internal/block/stripe"
)

// Benchmarks against a stripe (RAID-0) over the same number of file legs:
// the cost of parity and of the write-intent bitmap. Run with
// go test -run X -bench . ./internal/block/parity/
func benchStack(b *testing.B, typ string, degraded bool) block.Layer {
	var kids []string
	for i := range 4 {
		kids = append(kids, fmt.Sprintf(`{"type":"file","params":{"path":"leg%d.img"}}`, i))
	}
	spec := fmt.Sprintf(`{"type":%q,"children":[%s]}`, typ, strings.Join(kids, ","))
	env := block.Env{Dir: b.TempDir(), Size: 64 << 20, Create: true}
	l, err := block.Build(env, blocktest.Spec(b, spec))
	if err != nil {
		b.Fatal(err)
	}
	p := make([]byte, 1<<20)
	for off := int64(0); off < l.Size(); off += int64(len(p)) {
		if err := l.WriteAt(p, off, false); err != nil {
			b.Fatal(err)
		}
	}
	if degraded {
		l.Close()
		loseLeg(b, env, 1)
		env.Create = false
		if l, err = block.Build(env, blocktest.Spec(b, spec)); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { l.Close() })
	return l
}

func benchIO(b *testing.B, l block.Layer, size int64, write bool) {
	rng := rand.New(rand.NewPCG(1, 1))
	p := make([]byte, size)
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		off := rng.Int64N(l.Size()/size) * size
		var err error
		if write {
			err = l.WriteAt(p, off, false)
		} else {
			err = l.ReadAt(p, off)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWrite4K(b *testing.B) {
	for _, typ := range []string{"stripe", "parity"} {
		b.Run(typ, func(b *testing.B) { benchIO(b, benchStack(b, typ, false), 4096, true) })
	}
	b.Run("parity-degraded", func(b *testing.B) { benchIO(b, benchStack(b, "parity", true), 4096, true) })
}

func BenchmarkWrite1M(b *testing.B) {
	for _, typ := range []string{"stripe", "parity"} {
		b.Run(typ, func(b *testing.B) { benchIO(b, benchStack(b, typ, false), 1<<20, true) })
	}
	b.Run("parity-degraded", func(b *testing.B) { benchIO(b, benchStack(b, "parity", true), 1<<20, true) })
}

func BenchmarkRead64K(b *testing.B) {
	for _, typ := range []string{"stripe", "parity"} {
		b.Run(typ, func(b *testing.B) { benchIO(b, benchStack(b, typ, false), 64<<10, false) })
	}
	b.Run("parity-degraded", func(b *testing.B) { benchIO(b, benchStack(b, "parity", true), 64<<10, false) })
}
