package layers_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	_ "github.com/basalt-storage/basalt/internal/block/layers"
)

func spec(t *testing.T, s string) block.Spec {
	t.Helper()
	var sp block.Spec
	if err := json.Unmarshal([]byte(s), &sp); err != nil {
		t.Fatal(err)
	}
	return sp
}

// stacks every layer type must serve correctly, built over file layers.
var stacks = map[string]string{
	"file":      `{"type":"file","params":{"path":"a.img"}}`,
	"linear":    `{"type":"linear","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}},{"type":"file","params":{"path":"c.img"}}]}`,
	"partition": `{"type":"linear","params":{"offset":1048576,"length":4194304},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
	"stripe":    `{"type":"stripe","params":{"chunk":4096},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}},{"type":"file","params":{"path":"c.img"}},{"type":"file","params":{"path":"d.img"}}]}`,
	"throttle":  `{"type":"throttle","params":{"iops":100000,"bps":1073741824},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
	"nested":    `{"type":"throttle","params":{"iops":100000},"children":[{"type":"stripe","params":{"chunk":8192},"children":[{"type":"linear","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]},{"type":"file","params":{"path":"c.img"}}]}]}`,
}

// TestConformance drives each stack with random operations and compares
// every read with a byte-array model of the device.
func TestConformance(t *testing.T) {
	for name, js := range stacks {
		t.Run(name, func(t *testing.T) {
			env := block.Env{Dir: t.TempDir(), Size: 8 << 20, Create: true}
			l, err := block.Build(env, spec(t, js))
			if err != nil {
				t.Fatal(err)
			}
			size := l.Size()
			if size <= 0 {
				t.Fatalf("size %d", size)
			}
			model := make([]byte, size)
			rng := rand.New(rand.NewPCG(1, uint64(len(name))))
			for i := 0; i < 400; i++ {
				off := rng.Int64N(size)
				n := min(rng.Int64N(256<<10)+1, size-off)
				switch rng.IntN(5) {
				case 0, 1:
					p := make([]byte, n)
					for j := range p {
						p[j] = byte(rng.IntN(256))
					}
					if err := l.WriteAt(p, off, rng.IntN(4) == 0); err != nil {
						t.Fatalf("write %d+%d: %v", off, n, err)
					}
					copy(model[off:], p)
				case 2:
					if err := l.WriteZeroes(off, n, block.ZeroFlags{NoHole: rng.IntN(2) == 0}); err != nil {
						t.Fatalf("zero %d+%d: %v", off, n, err)
					}
					clear(model[off : off+n])
				case 3:
					got := make([]byte, n)
					if err := l.ReadAt(got, off); err != nil {
						t.Fatalf("read %d+%d: %v", off, n, err)
					}
					if !bytes.Equal(got, model[off:off+n]) {
						t.Fatalf("op %d: read %d+%d differs from the model", i, off, n)
					}
				case 4:
					ex, err := l.Extents(off, n)
					if err != nil || len(ex) == 0 {
						t.Fatalf("extents %d+%d: %v %v", off, n, ex, err)
					}
					at := off
					for _, e := range ex {
						if e.Length <= 0 {
							t.Fatalf("extent of length %d", e.Length)
						}
						if e.Zero {
							end := min(at+e.Length, off+n)
							if !bytes.Equal(model[at:end], make([]byte, end-at)) {
								t.Fatalf("extent %d+%d reported zero but holds data", at, e.Length)
							}
						}
						at += e.Length
					}
				}
			}
			if err := l.Flush(); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if err := l.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, model) {
				t.Fatal("final contents differ from the model")
			}
			if d := l.Describe(); d.State != block.StateOK || d.Type == "" {
				t.Fatalf("describe: %+v", d)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			// Reopen (not Create): the data is still there.
			env.Create = false
			l, err = block.Build(env, spec(t, js))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := l.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
				t.Fatalf("after reopen: %v", err)
			}
		})
	}
}

func TestCheckRejectsBadSpecs(t *testing.T) {
	for _, js := range []string{
		`{"type":"nope"}`,
		`{"type":"stripe","children":[{"type":"file","params":{"path":"a"}}]}`,
		`{"type":"file","params":{"path":"a"},"children":[{"type":"file","params":{"path":"b"}}]}`,
		`{"type":"throttle"}`,
	} {
		if err := block.Check(spec(t, js)); err == nil {
			t.Errorf("Check(%s) accepted it", js)
		}
	}
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	for _, js := range []string{
		`{"type":"file","params":{"path":"a","colour":"red"}}`,
		`{"type":"file"}`,
		`{"type":"stripe","params":{"chunk":1000},"children":[{"type":"file","params":{"path":"a"}},{"type":"file","params":{"path":"b"}}]}`,
	} {
		if l, err := block.Build(env, spec(t, js)); err == nil {
			l.Close()
			t.Errorf("Build(%s) accepted it", js)
		}
	}
}
