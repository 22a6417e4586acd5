package mirror

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	_ "github.com/basalt-storage/basalt/internal/block/file"
	_ "github.com/basalt-storage/basalt/internal/block/throttle"
)

// mirrorSpec is a mirror over file legs named legs, with params.
func mirrorSpec(params string, legs ...string) string {
	var kids []string
	for _, p := range legs {
		kids = append(kids, fmt.Sprintf(`{"type":"file","params":{"path":%q}}`, p))
	}
	if params == "" {
		params = "{}"
	}
	return fmt.Sprintf(`{"type":"mirror","params":%s,"children":[%s]}`, params, strings.Join(kids, ","))
}

// openMirror builds spec in dir and returns the mirror layer.
func openMirror(t *testing.T, env block.Env, spec string) *Layer {
	t.Helper()
	l, err := block.Build(env, blocktest.Spec(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	return l.(*Layer)
}

func mustClose(t *testing.T, l block.Layer) {
	t.Helper()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func randBytes(rng *rand.Rand, n int64) []byte {
	p := make([]byte, n)
	for i := 0; i < len(p); i += 8 {
		v := rng.Uint64()
		for j := i; j < min(i+8, len(p)); j++ {
			p[j] = byte(v)
			v >>= 8
		}
	}
	return p
}

// fillAll writes random data over the whole device and returns it.
func fillAll(t *testing.T, l block.Layer, seed uint64) []byte {
	t.Helper()
	model := randBytes(rand.New(rand.NewPCG(seed, 1)), l.Size())
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	return model
}

// write writes p at off through l and into model.
func write(t *testing.T, l block.Layer, model, p []byte, off int64) {
	t.Helper()
	if err := l.WriteAt(p, off, false); err != nil {
		t.Fatalf("write %d+%d: %v", off, len(p), err)
	}
	copy(model[off:], p)
}

// checkAll compares the whole device with model.
func checkAll(t *testing.T, l block.Layer, model []byte) {
	t.Helper()
	got := make([]byte, l.Size())
	if err := l.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, model); i >= 0 {
		t.Fatalf("device differs from the model at byte %d", i)
	}
}

// checkCopies compares every leg alone with model.
func checkCopies(t *testing.T, l *Layer, model []byte) {
	t.Helper()
	for i := range l.NumCopies() {
		got := make([]byte, len(model))
		if err := l.ReadCopy(i, got, 0); err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
		if d := firstDiff(got, model); d >= 0 {
			t.Fatalf("copy %d differs from the model at byte %d (region %d)", i, d, int64(d)/l.region)
		}
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func legStates(l *Layer) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.states()
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// copyDir copies the regular files of from into a new temporary directory.
func copyDir(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			copyFile(t, filepath.Join(from, e.Name()), filepath.Join(to, e.Name()))
		}
	}
	return to
}

// A fault-injecting layer over a real child: while a switch is on, the
// operations it covers fail, as a dying disk's would. The data path below
// stays real.
var errInjected = errors.New("injected I/O error")

type switches struct {
	read, write, flush atomic.Bool
	gate               atomic.Pointer[chan struct{}] // set: writes wait for it to close
}

var faultSwitches sync.Map // id -> *switches

func faults(id string) *switches {
	s, _ := faultSwitches.LoadOrStore(id, &switches{})
	return s.(*switches)
}

type failLayer struct {
	block.Layer
	sw  *switches
	raw json.RawMessage
}

func init() {
	block.Register(block.Type{Name: "mirrortest-fail", MinChildren: 1, MaxChildren: 1,
		New: func(_ block.Env, raw json.RawMessage, ch []block.Layer) (block.Layer, error) {
			var p struct {
				ID string `json:"id"`
			}
			if err := block.DecodeParams(raw, &p); err != nil {
				return nil, err
			}
			return &failLayer{Layer: ch[0], sw: faults(p.ID), raw: raw}, nil
		}})
}

func (f *failLayer) ReadAt(p []byte, off int64) error {
	if f.sw.read.Load() {
		return errInjected
	}
	return f.Layer.ReadAt(p, off)
}

func (f *failLayer) WriteAt(p []byte, off int64, fua bool) error {
	if g := f.sw.gate.Load(); g != nil {
		<-*g
	}
	if f.sw.write.Load() {
		return errInjected
	}
	return f.Layer.WriteAt(p, off, fua)
}

func (f *failLayer) WriteZeroes(off, n int64, z block.ZeroFlags) error {
	if f.sw.write.Load() {
		return errInjected
	}
	return f.Layer.WriteZeroes(off, n, z)
}

func (f *failLayer) Trim(off, n int64, fua bool) error {
	if f.sw.write.Load() {
		return errInjected
	}
	return f.Layer.Trim(off, n, fua)
}

func (f *failLayer) Flush() error {
	if f.sw.flush.Load() {
		return errInjected
	}
	return f.Layer.Flush()
}

func (f *failLayer) Extents(off, n int64) ([]block.Extent, error) {
	if f.sw.read.Load() {
		return nil, errInjected
	}
	return f.Layer.Extents(off, n)
}

func (f *failLayer) Describe() block.Node {
	kid := f.Layer.Describe()
	return block.Node{Type: "mirrortest-fail", Params: f.raw, State: kid.State, Children: []block.Node{kid}}
}

func (f *failLayer) Children() []block.Layer { return []block.Layer{f.Layer} }
