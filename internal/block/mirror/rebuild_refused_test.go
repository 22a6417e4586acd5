package mirror

import (
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// hookLayer calls the hook registered under its id before every write, so
// a test can hold one write (a rebuild's copy of a chosen region) while
// other operations run.
type hookLayer struct {
	block.Layer
	id  string
	raw json.RawMessage
}

var writeHooks sync.Map // id -> func(off int64)

func init() {
	block.Register(block.Type{Name: "mirrortest-hook", MinChildren: 1, MaxChildren: 1,
		New: func(_ block.Env, raw json.RawMessage, ch []block.Layer) (block.Layer, error) {
			var p struct {
				ID string `json:"id"`
			}
			if err := block.DecodeParams(raw, &p); err != nil {
				return nil, err
			}
			return &hookLayer{Layer: ch[0], id: p.ID, raw: raw}, nil
		}})
}

func (h *hookLayer) WriteAt(p []byte, off int64, fua bool) error {
	if f, ok := writeHooks.Load(h.id); ok {
		f.(func(int64))(off)
	}
	return h.Layer.WriteAt(p, off, fua)
}

func (h *hookLayer) Describe() block.Node {
	kid := h.Layer.Describe()
	return block.Node{Type: "mirrortest-hook", Params: h.raw, State: kid.State, Children: []block.Node{kid}}
}

func (h *hookLayer) Children() []block.Layer { return []block.Layer{h.Layer} }

// TestRebuildKeepsRegionRefusedAfterItsCopy: a write that a rebuilding leg
// refuses for want of space, into a region the rebuild has already copied
// but not yet checkpointed, makes that region stale for the leg again (the
// leg holds only part of the write). The checkpoint must not clear that
// bit as the copy's: the leg would turn ok holding data no other leg has,
// and reads of the region would return one version or the other depending
// on the leg they land on.
func TestRebuildKeepsRegionRefusedAfterItsCopy(t *testing.T) {
	f := newFixture(t, 65536, 1<<20, 71, "filling", "hook")
	full := blocktest.FullSwitch(f.id)
	// Leg b fails and misses writes to regions 1 and 5.
	f.failB(1, 5)

	// Hold the rebuild's copy of region 5: region 1 is copied by then.
	reached, release := f.holdWrite(5 * f.region)
	repaired := f.repair()
	<-reached

	// A write into region 1, which leg b (rebuilding) refuses for want of
	// space after landing part of it; leg a takes it.
	full.Store(true)
	if err := f.WriteAt(randBytes(f.rng, f.region), 1*f.region, false); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write the rebuilding leg refuses: %v, want ENOSPC", err)
	}
	full.Store(false)
	close(release)
	if err := <-repaired; err != nil {
		t.Fatalf("repair: %v", err)
	}
	f.wantOK()
	// The refused write's region must have been copied again.
	f.alike(1)
	checkCopies(t, f.Layer, f.model)
}

// volatileLayer keeps writes in memory until Flush, like a page cache; a
// flush refused for want of space (its switch on) drops them, as a
// writeback that found no space does (and the next fsync of the file
// reports success: the error went to the one before).
type volatileLayer struct {
	block.Layer
	refuse  *atomic.Bool
	id      string
	raw     json.RawMessage
	mu      sync.Mutex
	pending []volatileWrite
}

type volatileWrite struct {
	off int64
	p   []byte
}

var volatileSwitches sync.Map // id -> *atomic.Bool

func volatileSwitch(id string) *atomic.Bool {
	s, _ := volatileSwitches.LoadOrStore(id, &atomic.Bool{})
	return s.(*atomic.Bool)
}

func init() {
	block.Register(block.Type{Name: "mirrortest-volatile", MinChildren: 1, MaxChildren: 1,
		New: func(_ block.Env, raw json.RawMessage, ch []block.Layer) (block.Layer, error) {
			var p struct {
				ID string `json:"id"`
			}
			if err := block.DecodeParams(raw, &p); err != nil {
				return nil, err
			}
			return &volatileLayer{Layer: ch[0], refuse: volatileSwitch(p.ID), id: p.ID, raw: raw}, nil
		}})
}

func (v *volatileLayer) ReadAt(p []byte, off int64) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.Layer.ReadAt(p, off); err != nil {
		return err
	}
	for _, w := range v.pending {
		lo, hi := max(off, w.off), min(off+int64(len(p)), w.off+int64(len(w.p)))
		if lo < hi {
			copy(p[lo-off:hi-off], w.p[lo-w.off:])
		}
	}
	return nil
}

func (v *volatileLayer) WriteAt(p []byte, off int64, fua bool) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if fua {
		if err := v.settle(); err != nil {
			return err
		}
		return v.Layer.WriteAt(p, off, true)
	}
	v.pending = append(v.pending, volatileWrite{off, append([]byte(nil), p...)})
	return nil
}

func (v *volatileLayer) WriteZeroes(off, n int64, z block.ZeroFlags) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.settle(); err != nil {
		return err
	}
	return v.Layer.WriteZeroes(off, n, z)
}

// settle writes the pending writes to the child, in order.
func (v *volatileLayer) settle() error {
	for _, w := range v.pending {
		if err := v.Layer.WriteAt(w.p, w.off, false); err != nil {
			return err
		}
	}
	v.pending = nil
	return nil
}

// refusedHooks are called (by id) when a flush has been refused, before
// it returns: between the writeback's failure and the mirror hearing of it.
var refusedHooks sync.Map // id -> func()

func (v *volatileLayer) Flush() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.refuse.Load() {
		v.pending = nil // the writeback found no space: the writes are gone
		if f, ok := refusedHooks.Load(v.id); ok {
			v.mu.Unlock()
			f.(func())()
			v.mu.Lock()
		}
		return syscall.ENOSPC
	}
	if err := v.settle(); err != nil {
		return err
	}
	return v.Layer.Flush()
}

func (v *volatileLayer) Describe() block.Node {
	kid := v.Layer.Describe()
	return block.Node{Type: "mirrortest-volatile", Params: v.raw, State: kid.State, Children: []block.Node{kid}}
}

func (v *volatileLayer) Children() []block.Layer { return []block.Layer{v.Layer} }

// TestRebuildKeepsCopiesARefusedFlushMayHaveDropped: a flush a rebuilding
// leg refuses for want of space may have dropped the rebuild's copies it
// had taken and not yet made durable (a writeback that found no space;
// the rebuild's own flush before its checkpoint then succeeds, the error
// having gone to the refused one). Those regions must stay stale for the
// leg, or it turns ok without their data.
func TestRebuildKeepsCopiesARefusedFlushMayHaveDropped(t *testing.T) {
	f := newFixture(t, 65536, 1<<20, 72, "hook", "volatile")
	f.failB(1, 5)
	// Let the intent bits go: the flush below then finds none set where
	// the rebuild copies (leg b's stale map alone records those regions).
	f.settle()
	if n := f.intent.Count(); n != 0 {
		t.Fatalf("%d intent bits still set", n)
	}

	reached, release := f.holdWrite(5 * f.region)
	repaired := f.repair()
	<-reached // region 1 is copied onto leg b, in its cache

	f.refuse.Store(true)
	if err := f.Flush(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("flush the rebuilding leg refuses: %v, want ENOSPC", err)
	}
	f.refuse.Store(false)
	close(release)
	if err := <-repaired; err != nil {
		t.Fatalf("repair: %v", err)
	}
	f.wantOK()
	checkCopies(t, f.Layer, f.model)
}
