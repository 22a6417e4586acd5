package layers_test

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/keys"
)

// newTestKeys wraps data keys with a fresh cluster key, for crypt stacks.
func newTestKeys(t *testing.T) *keys.Wrapper {
	w, err := keys.New(keys.Generate())
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// checkNoExtents asks d about empty ranges: the contract (block.Device)
// answers no extents and no error. Checksum and crypt answered one
// extent of no bytes, and stripe, linear and parity did over children
// without block status; mirror refused there.
func checkNoExtents(t *testing.T, d block.Device) {
	t.Helper()
	for _, off := range []int64{0, 4097, d.Size()} {
		if ex, err := d.Extents(off, 0); err != nil || len(ex) != 0 {
			t.Errorf("Extents(%d, 0) = %v, %v; want no extents, no error", off, ex, err)
		}
	}
}

// Every layer type, each declaring Extents (built over files).
func TestExtentsZeroLength(t *testing.T) {
	all := map[string]string{
		"cow":   `{"type":"cow","params":{"chunk":8192},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
		"crypt": `{"type":"crypt","children":[{"type":"file","params":{"path":"a.img"}}]}`,
	}
	for name, js := range stacks {
		all[name] = js
	}
	for name, js := range all {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			env := block.Env{Dir: filepath.Join(root, "v"), Images: filepath.Join(root, "i"), Size: 8 << 20, Create: true, Keys: newTestKeys(t)}
			l, err := block.Build(env, blocktest.Spec(t, js))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if !l.Capabilities().Extents {
				t.Fatal("does not declare Extents")
			}
			checkNoExtents(t, l)
		})
	}
}

func init() {
	// An 8 MiB in-memory device declaring no block status.
	block.Register(block.Type{
		Name: "zl-mem", Doc: "blocktest.Mem, for TestExtentsZeroLengthWithoutBlockStatus",
		New: func(block.Env, json.RawMessage, []block.Layer) (block.Layer, error) {
			return blocktest.NewMem(8<<20, true), nil
		},
	})
}

// The layers with children, over children that do not declare Extents
// (blocktest.Mem): the empty answer does not depend on it.
func TestExtentsZeroLengthWithoutBlockStatus(t *testing.T) {
	mem := `{"type":"zl-mem"}`
	for name, js := range map[string]string{
		"stripe":   `{"type":"stripe","params":{"chunk":4096},"children":[` + mem + `,` + mem + `]}`,
		"linear":   `{"type":"linear","children":[` + mem + `,` + mem + `]}`,
		"parity":   `{"type":"parity","params":{"chunk":4096},"children":[` + mem + `,` + mem + `,` + mem + `]}`,
		"mirror":   `{"type":"mirror","children":[` + mem + `,` + mem + `]}`,
		"checksum": `{"type":"checksum","children":[` + mem + `]}`,
		"crypt":    `{"type":"crypt","children":[` + mem + `]}`,
	} {
		t.Run(name, func(t *testing.T) {
			env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true, Keys: newTestKeys(t)}
			l, err := block.Build(env, blocktest.Spec(t, js))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if l.Capabilities().Extents {
				t.Fatal("declares Extents over children that do not")
			}
			checkNoExtents(t, l)
		})
	}
}
