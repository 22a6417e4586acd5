package mirror

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
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
	const region = 65536
	id := t.Name() + "/b.img"
	refuse := volatileSwitch(id)
	legB := `{"type":"mirrortest-dsync","children":[` +
		`{"type":"mirrortest-volatile","params":{"id":"` + id + `"},"children":[{"type":"file","params":{"path":"b.img"}}]}]}`
	spec := `{"type":"mirror","params":{"region":65536},"children":[{"type":"file","params":{"path":"a.img"}},` + legB + `]}`
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := openMirror(t, env, spec)
	defer func() { l.Close() }()
	model := fillAll(t, l, 75)
	rng := rand.New(rand.NewPCG(75, 2))
	l.clearDelay.Store(0)

	// Acknowledged, in leg b's cache.
	write(t, l, model, randBytes(rng, region), 1*region)

	// A FUA write elsewhere, which leg b refuses: its writeback found no
	// space and dropped region 1's write.
	refuse.Store(true)
	if err := l.WriteAt(randBytes(rng, region), 3*region, true); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("FUA write leg b refuses: %v, want ENOSPC", err)
	}
	refuse.Store(false)

	// Space is back.
	for range 2 {
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	l.bg.Wait() // the copy across a flush starts
	if s := legStates(l); s[0] != legOK || s[1] != legOK {
		t.Fatalf("legs %v, want both ok", s)
	}
	// Region 3's write was not acknowledged: either version will do, as
	// long as both legs hold the same.
	a, b := make([]byte, region), make([]byte, region)
	if err := l.ReadCopy(0, a, 3*region); err != nil {
		t.Fatal(err)
	}
	if err := l.ReadCopy(1, b, 3*region); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(a, b); i >= 0 {
		t.Fatalf("legs differ in region 3 at byte %d", i)
	}
	copy(model[3*region:], a)
	checkCopies(t, l, model)
}
