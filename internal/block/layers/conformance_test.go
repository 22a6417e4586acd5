package layers_test

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	_ "github.com/basalt-storage/basalt/internal/block/layers"
)

// stacks every layer type must serve correctly, built over file layers.
var stacks = map[string]string{
	"file":       `{"type":"file","params":{"path":"a.img"}}`,
	"linear":     `{"type":"linear","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}},{"type":"file","params":{"path":"c.img"}}]}`,
	"partition":  `{"type":"linear","params":{"offset":1048576,"length":4194304},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
	"checksum":   `{"type":"checksum","children":[{"type":"file","params":{"path":"a.img"}}]}`,
	"parity":     `{"type":"parity","params":{"chunk":4096},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}},{"type":"file","params":{"path":"c.img"}}]}`,
	"mirror":     `{"type":"mirror","params":{"region":65536},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}`,
	"stripe":     `{"type":"stripe","params":{"chunk":4096},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}},{"type":"file","params":{"path":"c.img"}},{"type":"file","params":{"path":"d.img"}}]}`,
	"stripe-64k": `{"type":"stripe","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}},{"type":"file","params":{"path":"c.img"}}]}`,
	"throttle":   `{"type":"throttle","params":{"iops":100000,"bps":1073741824},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
	"nested":     `{"type":"throttle","params":{"iops":100000},"children":[{"type":"stripe","params":{"chunk":8192},"children":[{"type":"linear","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]},{"type":"file","params":{"path":"c.img"}}]}]}`,
}

// TestConformance drives each stack with random operations and compares
// every read with a byte-array model of the device (package blocktest).
func TestConformance(t *testing.T) {
	for name, js := range stacks {
		t.Run(name, func(t *testing.T) {
			blocktest.Conformance(t, block.Env{Dir: t.TempDir(), Size: 8 << 20, Create: true}, js, 400)
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
		if err := block.Check(blocktest.Spec(t, js)); err == nil {
			t.Errorf("Check(%s) accepted it", js)
		}
	}
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	for _, js := range []string{
		`{"type":"file","params":{"path":"a","colour":"red"}}`,
		`{"type":"file"}`,
		`{"type":"stripe","params":{"chunk":1000},"children":[{"type":"file","params":{"path":"a"}},{"type":"file","params":{"path":"b"}}]}`,
	} {
		if l, err := block.Build(env, blocktest.Spec(t, js)); err == nil {
			l.Close()
			t.Errorf("Build(%s) accepted it", js)
		}
	}
}
