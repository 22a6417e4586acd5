package mirror

import (
	"encoding/json"
	"errors"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// dsyncLayer stands for a file whose FUA writes are pwritev2(RWF_DSYNC):
// their sync reports (and consumes) an error of the file's writeback, of
// any of its writes. Over a mirrortest-volatile child with its switch on,
// a FUA write is refused as that child's flush is: the writes the child
// had cached are gone.
type dsyncLayer struct {
	block.Layer
	raw json.RawMessage
}

func init() {
	block.Register(block.Type{Name: "mirrortest-dsync", MinChildren: 1, MaxChildren: 1,
		New: func(_ block.Env, raw json.RawMessage, ch []block.Layer) (block.Layer, error) {
			return &dsyncLayer{Layer: ch[0], raw: raw}, nil
		}})
}

func (d *dsyncLayer) WriteAt(p []byte, off int64, fua bool) error {
	if v, ok := d.Layer.(*volatileLayer); ok && fua && v.refuse.Load() {
		return v.Flush()
	}
	return d.Layer.WriteAt(p, off, fua)
}

func (d *dsyncLayer) Describe() block.Node {
	kid := d.Layer.Describe()
	return block.Node{Type: "mirrortest-dsync", Params: d.raw, State: kid.State, Children: []block.Node{kid}}
}

func (d *dsyncLayer) Children() []block.Layer { return []block.Layer{d.Layer} }

// TestRefusedFUAWriteKeepsOtherWrites: a FUA write an ok leg refuses for
// want of space may have been told of a writeback that dropped other
// writes the leg had taken since its last flush (as a refused flush may),
// not only its own. Those writes' regions must be treated as a refused
// flush's are — unsynced, copied across once space is back — or the
// users' next flush succeeds, lets their intent bits go, and the ok legs
// differ: reads return one version or the other depending on the leg.
func TestRefusedFUAWriteKeepsOtherWrites(t *testing.T) {
	f := newFixture(t, 65536, 1<<20, 75, "dsync", "volatile")
	f.clearDelay.Store(0)

	// Acknowledged, in leg b's cache.
	f.write(1)

	// A FUA write elsewhere, which leg b refuses: its writeback found no
	// space and dropped region 1's write.
	f.refuse.Store(true)
	if err := f.WriteAt(randBytes(f.rng, f.region), 3*f.region, true); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("FUA write leg b refuses: %v, want ENOSPC", err)
	}
	f.refuse.Store(false)

	// Space is back. The first flush starts the copy across.
	f.flushes(2)
	f.wantOK()
	// Region 3's write was not acknowledged: either version will do, as
	// long as both legs hold the same.
	f.alike(3)
	checkCopies(t, f.Layer, f.model)
}
