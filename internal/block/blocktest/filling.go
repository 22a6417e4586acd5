package blocktest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/basalt-storage/basalt/internal/block"
)

// FillingType is a layer over one child on a file system that fills up,
// for tests of a full store: while its switch is on, a write lands half
// its bytes (the space there was) and fails with ENOSPC, a write of zeroes
// fails with ENOSPC, and so does a flush (ext4 reports a delayed
// allocation's ENOSPC at fsync). Nothing is wrong with the child. Params:
// {"id": NAME}, the switch's name (FullSwitch); with "readonly": true it
// stands for a file system turned read-only instead: while the switch is
// on, writes land nothing and they, writes of zeroes, trims and flushes
// fail with EROFS marked block.ErrStoreReadOnly (as block.File marks it
// when the whole file system refuses).
const FillingType = "test-filling"

var fullSwitches sync.Map // id -> *atomic.Bool

// FullSwitch is the switch of the filling layers with params {"id": id}.
func FullSwitch(id string) *atomic.Bool {
	s, _ := fullSwitches.LoadOrStore(id, &atomic.Bool{})
	return s.(*atomic.Bool)
}

// NewFullSwitch is a fresh switch, off, for the filling layers with params
// {"id": id} built from now on. A test making their spec takes it rather
// than FullSwitch: its ids are its name, and under go test -count=N a
// run would otherwise start with the switch a previous run left on.
func NewFullSwitch(id string) *atomic.Bool {
	s := &atomic.Bool{}
	fullSwitches.Store(id, s)
	return s
}

// FillingSpec is the spec of a filling layer with switch id over child.
func FillingSpec(id, child string) string {
	p, _ := json.Marshal(map[string]string{"id": id})
	return `{"type":"` + FillingType + `","params":` + string(p) + `,"children":[` + child + `]}`
}

// ReadOnlySpec is the spec of a filling layer with switch id over child
// whose file system turns read-only while the switch is on.
func ReadOnlySpec(id, child string) string {
	p, _ := json.Marshal(map[string]any{"id": id, "readonly": true})
	return `{"type":"` + FillingType + `","params":` + string(p) + `,"children":[` + child + `]}`
}

// RefusingSpec is FillingSpec (errno ENOSPC) or ReadOnlySpec (EROFS).
func RefusingSpec(id string, errno syscall.Errno, child string) string {
	if errno == syscall.EROFS {
		return ReadOnlySpec(id, child)
	}
	return FillingSpec(id, child)
}

// RandomOp runs one random operation on l over [off, off+n), as the full
// store tests drive their layers: a write of fill(n) (FUA one time in
// four), a write of zeroes, or a flush, each keeping model in step when it
// succeeds. It returns the operation's error and the bytes it covered (0
// for a flush).
func RandomOp(rng *rand.Rand, l block.Device, model []byte, off, n int64, fill func(int64) []byte) (int64, error) {
	var err error
	switch rng.IntN(5) {
	case 0, 1, 2:
		p := fill(n)
		if err = l.WriteAt(p, off, rng.IntN(4) == 0); err == nil {
			copy(model[off:], p)
		}
	case 3:
		if err = l.WriteZeroes(off, n, block.ZeroFlags{}); err == nil {
			clear(model[off : off+n])
		}
	case 4:
		err = l.Flush()
		n = 0
	}
	return n, err
}

type filling struct {
	block.Layer
	full  *atomic.Bool
	errno error // ENOSPC, or EROFS marked ErrStoreReadOnly (readonly)
	raw   json.RawMessage
}

func init() {
	block.Register(block.Type{Name: FillingType, MinChildren: 1, MaxChildren: 1,
		New: func(_ block.Env, raw json.RawMessage, ch []block.Layer) (block.Layer, error) {
			var p struct {
				ID       string `json:"id"`
				ReadOnly bool   `json:"readonly"`
			}
			if err := block.DecodeParams(raw, &p); err != nil {
				return nil, err
			}
			f := &filling{Layer: ch[0], full: FullSwitch(p.ID), errno: syscall.ENOSPC, raw: raw}
			if p.ReadOnly {
				f.errno = fmt.Errorf("%w: %w", block.ErrStoreReadOnly, syscall.EROFS)
			}
			return f, nil
		}})
}

func (f *filling) WriteAt(p []byte, off int64, fua bool) error {
	if f.full.Load() {
		if f.errno == error(syscall.ENOSPC) {
			f.Layer.WriteAt(p[:len(p)/2], off, false)
		}
		return f.errno
	}
	return f.Layer.WriteAt(p, off, fua)
}

func (f *filling) WriteZeroes(off, n int64, z block.ZeroFlags) error {
	if f.full.Load() {
		return f.errno
	}
	return f.Layer.WriteZeroes(off, n, z)
}

// Trim frees space on a full file system; a read-only one refuses it.
func (f *filling) Trim(off, n int64, fua bool) error {
	if f.full.Load() && f.errno != error(syscall.ENOSPC) {
		return f.errno
	}
	return f.Layer.Trim(off, n, fua)
}

func (f *filling) Flush() error {
	if f.full.Load() {
		return f.errno
	}
	return f.Layer.Flush()
}

func (f *filling) Describe() block.Node {
	kid := f.Layer.Describe()
	return block.Node{Type: FillingType, Params: f.raw, State: kid.State, Children: []block.Node{kid}}
}

func (f *filling) Children() []block.Layer { return []block.Layer{f.Layer} }
