package block_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"runtime/debug"
	"sync"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	_ "github.com/basalt-storage/basalt/internal/block/file"
	_ "github.com/basalt-storage/basalt/internal/block/linear"
	_ "github.com/basalt-storage/basalt/internal/block/stripe"
)

// A spec nested deeper than any stack needs is refused by Check (and so by
// Build), not recursed into without bound.
func TestCheckRefusesDeepSpecs(t *testing.T) {
	s := block.Spec{Type: "file", Params: json.RawMessage(`{"path":"a.img"}`)}
	for range 300 {
		s = block.Spec{Type: "linear", Children: []block.Spec{s}}
	}
	if err := block.Check(s); err == nil {
		t.Fatal("Check accepted a spec 301 layers deep")
	}
	if l, err := block.Build(block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}, s); err == nil {
		l.Close()
		t.Fatal("Build built a spec 301 layers deep")
	}
}

// A spec that contains itself (Spec values sharing a Children slice can)
// is refused, not recursed into until the stack overflows and kills the
// process.
func TestCheckRefusesCyclicSpecs(t *testing.T) {
	defer debug.SetMaxStack(debug.SetMaxStack(64 << 20)) // fail fast on the old code
	kids := make([]block.Spec, 1)
	s := block.Spec{Type: "linear", Children: kids}
	kids[0] = s // s's only child is s
	if err := block.Check(s); err == nil {
		t.Fatal("Check accepted a cyclic spec")
	}
}

// A stack is created only with a size in (0, block.MaxSize]: a zero or
// negative size built zero-byte files and a zero-byte device, a huge one
// made a layer's arithmetic on it overflow. It is refused before anything
// is created.
func TestBuildRefusesBadCreateSize(t *testing.T) {
	specs := []string{
		`{"type":"file","params":{"path":"a.img"}}`,
		`{"type":"stripe","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}`,
		`{"type":"linear","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}`,
	}
	for _, spec := range specs {
		for _, size := range []int64{0, -4096, block.MaxSize + 1, math.MaxInt64} {
			dir := t.TempDir()
			l, err := block.Build(block.Env{Dir: dir, Size: size, Create: true}, blocktest.Spec(t, spec))
			if err == nil {
				t.Errorf("size %d: built a %d-byte %s", size, l.Size(), spec)
				l.Close()
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("size %d: %s: left %d files behind", size, spec, len(ents))
			}
		}
	}
}

// closeCounts counts the closes of the probe types' layers, by id.
var (
	closeMu     sync.Mutex
	closeCounts = map[string]int{}
)

// probe is a layer of the probe types: it fails to build when its
// params say so, and counts its closes.
type probe struct {
	block.Layer // nil: only Close and Describe are called
	id          string
	children    []block.Layer
}

func (r *probe) Close() error {
	closeMu.Lock()
	closeCounts[r.id]++
	closeMu.Unlock()
	return nil
}

type probeParams struct {
	ID   string `json:"id"`
	Fail bool   `json:"fail"`
}

func init() {
	newProbe := func(_ block.Env, raw json.RawMessage, children []block.Layer) (block.Layer, error) {
		var p probeParams
		if err := block.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		if p.Fail {
			return nil, fmt.Errorf("%s fails", p.ID)
		}
		return &probe{id: p.ID, children: children}, nil
	}
	block.Register(block.Type{Name: "probe-node", MinChildren: 0, MaxChildren: -1, New: newProbe})
}

// A build that fails half way closes every layer it built exactly once:
// the siblings built before a child that failed, and the children of a
// layer whose New failed; nothing else.
func TestBuildFailureClosesOnce(t *testing.T) {
	node := func(id string, fail bool, kids ...string) string {
		s := fmt.Sprintf(`{"type":"probe-node","params":{"id":%q,"fail":%v}`, id, fail)
		if len(kids) > 0 {
			s += `,"children":[`
			for i, k := range kids {
				if i > 0 {
					s += ","
				}
				s += k
			}
			s += "]"
		}
		return s + "}"
	}
	for _, c := range []struct {
		name   string
		spec   string
		closed []string
	}{
		{"a child fails", node("top", false, node("a", false, node("a1", false)), node("b", false), node("c", true), node("d", false)),
			[]string{"a", "b"}},
		{"New fails", node("top", true, node("a", false, node("a1", false)), node("b", false)),
			[]string{"a", "b"}},
		{"a grandchild fails", node("top", false, node("a", false), node("b", false, node("b1", false), node("b2", true))),
			[]string{"a", "b1"}},
	} {
		closeMu.Lock()
		clear(closeCounts)
		closeMu.Unlock()
		_, err := block.Build(block.Env{Create: true, Size: 4096}, blocktest.Spec(t, c.spec))
		if err == nil {
			t.Fatalf("%s: built", c.name)
		}
		closeMu.Lock()
		got := maps.Clone(closeCounts)
		closeMu.Unlock()
		want := map[string]int{}
		for _, id := range c.closed {
			want[id] = 1
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: closes %v, want %v (%v)", c.name, got, want, err)
		}
	}
}

// Combine claims an operation only when every child supports it.
func TestCombine(t *testing.T) {
	full := blocktest.NewMem(4096, true)
	all := block.Combine([]block.Layer{full, full})
	if all != full.Capabilities() {
		t.Fatalf("combined %+v, want %+v", all, full.Capabilities())
	}
	if c := block.Combine([]block.Layer{full, blocktest.NewMem(4096, false)}); c.FastZero {
		t.Fatal("FastZero claimed with a child that lacks it")
	}
}

// TestCheckNewHoldsParamsToTheirNames: a new stack's parameters must name
// the layer's fields exactly (Type.Params) — "Chunk" for "chunk" is
// refused, as a key given twice is — but a saved stack holding such a
// name, accepted before names were case-sensitive, still builds.
func TestCheckNewHoldsParamsToTheirNames(t *testing.T) {
	leaves := `{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}`
	for spec, ok := range map[string]bool{
		`{"type":"stripe","params":{"chunk":65536},"children":[` + leaves + `]}`:                   true,
		`{"type":"stripe","params":{"Chunk":65536},"children":[` + leaves + `]}`:                   false,
		`{"type":"stripe","params":{"chunk":4096,"chunk":65536},"children":[` + leaves + `]}`:      false,
		`{"type":"stripe","children":[{"type":"file","params":{"Path":"a.img"}},{"type":"file"}]}`: false,
	} {
		s := blocktest.Spec(t, spec)
		if err := block.CheckNew(s); (err == nil) != ok {
			t.Errorf("CheckNew(%s) = %v, want ok %v", spec, err, ok)
		}
	}
	saved := blocktest.Spec(t, `{"type":"stripe","params":{"Chunk":65536},"children":[`+leaves+`]}`)
	l, err := block.Build(block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}, saved)
	if err != nil {
		t.Fatalf("a saved stack with a parameter in another case: %v", err)
	}
	var p struct{ Chunk int64 }
	if err := json.Unmarshal(l.Describe().Params, &p); err != nil || p.Chunk != 65536 {
		t.Errorf("its params %s: chunk %d, %v; want 65536", l.Describe().Params, p.Chunk, err)
	}
	l.Close()
}
