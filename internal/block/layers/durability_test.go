package layers_test

import (
	"bytes"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/keys"
)

// The block contract's durability promise, for every layer type: what a
// successful Flush followed, and every FUA write, survives a power loss.
// Each stack runs over files behind a volatile cache (blocktest.Cached)
// with random writes, FUA writes, zeroes, trims and flushes; then the
// machine loses power — dropping every write never made durable, or an
// arbitrary half of them — and the reopened stack must read every durable
// byte back.
func TestFlushAndFUASurvivePowerLoss(t *testing.T) {
	all := maps.Clone(stacks)
	all["crypt"] = `{"type":"crypt","children":[{"type":"file","params":{"path":"a.img"}}]}`
	all["cow"] = `{"type":"cow","params":{"chunk":8192},"children":[{"type":"file","params":{"path":"a.img"}}]}`
	all["crypt-checksum-cow-stripe"] = `{"type":"crypt","children":[{"type":"checksum","children":[{"type":"cow","children":[{"type":"stripe","params":{"chunk":4096},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}]}]}]}`
	all["cow-mirror"] = `{"type":"cow","children":[{"type":"mirror","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}]}`
	all["checksum-cow-parity"] = `{"type":"checksum","children":[{"type":"cow","children":[{"type":"parity","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}},{"type":"file","params":{"path":"c.img"}}]}]}]}`
	k, err := keys.New(keys.Generate())
	if err != nil {
		t.Fatal(err)
	}
	for name, js := range all {
		for _, keep := range []struct {
			name string
			fn   func(int) bool
		}{{"lost", nil}, {"partly kept", blocktest.KeepSome(1)}} {
			t.Run(name+"/"+keep.name, func(t *testing.T) {
				dir := t.TempDir()
				fs := blocktest.NewFaultFS()
				fs.Keep = keep.fn
				env := block.Env{Dir: dir, Images: filepath.Join(dir, "images"), Size: 8 << 20, Create: true, Keys: k, MetaFS: fs.Open}
				spec := blocktest.Spec(t, blocktest.Cached(t, js))
				l, err := block.Build(env, spec)
				if err != nil {
					t.Fatal(err)
				}
				model, known := powerLossWorkload(t, l, rand.New(rand.NewPCG(uint64(len(js)), 3)))
				fs.Crash()
				l.Close() // after the power loss: nothing it writes may count
				env.Create, env.MetaFS = false, fs.Restart().Open
				l, err = block.Build(env, spec)
				if err != nil {
					t.Fatalf("reopen: %v", err)
				}
				defer l.Close()
				got := make([]byte, len(model))
				if err := l.ReadAt(got, 0); err != nil {
					t.Fatalf("read after the power loss: %v", err)
				}
				for i := range got {
					if known[i] && got[i] != model[i] {
						t.Fatalf("byte %d, durable before the power loss, is %#x, want %#x", i, got[i], model[i])
					}
				}
			})
		}
	}
}

// powerLossWorkload runs random operations on l, ending with a write it
// never flushes. It returns what l reads as, and which bytes of that are
// durable: written by a FUA write, or before a successful Flush, and not
// touched since.
func powerLossWorkload(t *testing.T, l block.Layer, rng *rand.Rand) (model []byte, known []bool) {
	t.Helper()
	size := l.Size()
	caps := l.Capabilities()
	if !caps.Flush || !caps.FUA {
		t.Fatalf("capabilities %+v: no flush or FUA", caps)
	}
	model, known = make([]byte, size), make([]bool, size)
	for i := range known {
		known[i] = true // a new stack reads as zeroes
	}
	var pending [][2]int64
	mark := func(off, n int64, v bool) {
		for i := off; i < off+n; i++ {
			known[i] = v
		}
	}
	for range 120 {
		off := rng.Int64N(size)
		n := min(rng.Int64N(64<<10)+1, size-off)
		if rng.IntN(2) == 0 {
			off &^= 4095
			n = min(max(4096, n&^4095), size-off)
		}
		fua := rng.IntN(4) == 0
		mark(off, n, false)
		var err error
		switch op := rng.IntN(10); {
		case op < 6:
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			err = l.WriteAt(p, off, fua)
			copy(model[off:], p)
		case op < 7 && caps.WriteZeroes:
			err = l.WriteZeroes(off, n, block.ZeroFlags{FUA: fua})
			clear(model[off : off+n])
		case op < 8 && caps.Trim: // old data or zeroes: the model learns which
			err = l.Trim(off, n, fua)
			fua = false
			if err == nil {
				err = l.ReadAt(model[off:off+n], off)
			}
		default:
			if err := l.Flush(); err != nil {
				t.Fatalf("flush: %v", err)
			}
			for _, r := range pending {
				mark(r[0], r[1], true)
			}
			pending = nil
			continue
		}
		if err != nil {
			t.Fatalf("op at %d+%d: %v", off, n, err)
		}
		if fua {
			mark(off, n, true)
		} else {
			pending = append(pending, [2]int64{off, n})
		}
	}
	got := make([]byte, size)
	if err := l.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("before the power loss the stack reads other than written: %v", err)
	}
	if err := l.WriteAt([]byte("never flushed"), 0, false); err != nil {
		t.Fatal(err)
	}
	copy(model, "never flushed")
	mark(0, 13, false)
	return model, known
}
