package volume

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/lock"
	"github.com/basalt-storage/basalt/internal/meta"
)

// hookLayer is a test layer that runs a hook (if set) when the stack is
// grown or flushed, before passing the call on: tests cancel a caller's
// context there, in the middle of a workflow.
type hookLayer struct{ block.Layer }

var (
	hookMu               sync.Mutex
	onResize, onFlushing func()
)

func runHook(h *func()) {
	hookMu.Lock()
	fn := *h
	hookMu.Unlock()
	if fn != nil {
		fn()
	}
}

func setHook(h *func(), fn func()) {
	hookMu.Lock()
	*h = fn
	hookMu.Unlock()
}

func (l hookLayer) Resize(n int64) error {
	runHook(&onResize)
	return l.Layer.(block.Resizer).Resize(n)
}

func (l hookLayer) Flush() error {
	runHook(&onFlushing)
	return l.Layer.Flush()
}

func (l hookLayer) Children() []block.Layer { return []block.Layer{l.Layer} }

func init() {
	registerWrapper("testhook", "runs test hooks on resize and flush", func(c block.Layer) block.Layer { return hookLayer{c} })
}

// hookType registers an admin type with testhook over a standard cow stack.
func hookType(t *testing.T, s *Service) string {
	t.Helper()
	name := uniq("hook")
	stack := `{"type":"testhook","children":[{"type":"cow","children":[{"type":"file","params":{"path":"data.img"}}]}]}`
	if _, err := s.CreateVolumeType(ctxT(t), name, "test hooks", json.RawMessage(stack)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.DeleteVolumeType(context.Background(), name) })
	return name
}

// TestCloneOfSnapshotTakenMeanwhile: a clone asked of a snapshot
// still being taken (its writer has not frozen the volume yet: no image)
// that becomes available before the clone commits must hold the
// snapshot's data — or be refused — never be an empty volume presented as
// the snapshot's clone.
func TestCloneOfSnapshotTakenMeanwhile(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, model := e.filledVolume(s, alice, 1<<20, 11)
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	taken := e.snapAvailable(sn.ID)
	// As the record looks while the volume's writer (another node) has
	// not taken it yet.
	e.editSnapshot(sn.ID, func(x *meta.Snapshot) { x.Status, x.Image = meta.StatusCreating, "" })
	var once sync.Once
	testHookLocked = func(h *lock.Held) {
		if strings.Contains(h.Key(), sn.ID) {
			// The writer takes it while the clone waits for its lock.
			once.Do(func() {
				e.editSnapshot(sn.ID, func(x *meta.Snapshot) { x.Status, x.Image = meta.StatusAvailable, taken.Image })
			})
		}
	}
	t.Cleanup(func() { testHookLocked = nil })
	c, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
	testHookLocked = nil
	if err != nil {
		wantCode(t, err, errs.CodeSnapshotNotReady)
	} else {
		e.sameVolume(s, c.ID, model, "clone of a snapshot taken while the clone was asked for")
	}
	cleanupAll(t, s, alice)
	checkProvisioned(t)
}

// TestExtendOutlivesCaller: an extend whose caller goes away (its
// context cancelled) once the extend is recorded must still end — at the
// new size, or at the old one with its bytes given back — instead of
// leaving the volume extending (refusing every other workflow, its
// target's bytes provisioned) until the node restarts.
func TestExtendOutlivesCaller(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	alice := caller("alice")
	typ := hookType(t, s)
	base := e.provisioned()
	v, err := s.CreateVolume(ctxT(t), alice, CreateVolume{SizeBytes: 1 << 20, Type: typ})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	setHook(&onResize, cancel) // the caller gives up while the stack grows
	t.Cleanup(func() { setHook(&onResize, nil) })
	_, err = s.ExtendVolume(ctx, alice, v.ID, 2<<20)
	setHook(&onResize, nil)
	t.Logf("extend with its caller gone: %v", err)
	cur := e.volume(v.ID)
	if cur.Status != meta.StatusAvailable {
		t.Fatalf("volume left %s (node %q, target %d) after its extend's caller went away", cur.Status, cur.Node, cur.TargetSize)
	}
	if got := e.provisioned() - base; got != cur.SizeBytes {
		t.Fatalf("provisioned grew by %d, the volume is %d bytes", got, cur.SizeBytes)
	}
	// And the volume takes the next workflow.
	if _, err := s.ExtendVolume(ctxT(t), alice, v.ID, 3<<20); err != nil {
		t.Fatalf("extend after: %v", err)
	}
	cleanupAll(t, s, alice)
	checkProvisioned(t)
}

// TestSnapshotOutlivesCaller: a snapshot whose caller goes away
// while the volume is frozen must still end available (or error), not
// stay creating with the volume marked as being snapshotted — which
// refuses the volume's extend, delete and next snapshot until a restart.
func TestSnapshotOutlivesCaller(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	alice := caller("alice")
	typ := hookType(t, s)
	v, err := s.CreateVolume(ctxT(t), alice, CreateVolume{SizeBytes: 1 << 20, Type: typ})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	setHook(&onFlushing, cancel) // the freeze's flush: the record is written
	t.Cleanup(func() { setHook(&onFlushing, nil) })
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
	setHook(&onFlushing, nil)
	t.Logf("snapshot with its caller gone: %v", err)
	if sn == nil {
		snaps, lerr := s.Snapshots(ctxT(t), alice, v.ID)
		if lerr != nil || len(snaps) != 1 {
			t.Fatalf("snapshots of the volume: %v, %v", snaps, lerr)
		}
		sn = snaps[0]
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.snapshot(sn.ID).Status == meta.StatusCreating && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := e.snapshot(sn.ID); got.Status == meta.StatusCreating {
		t.Fatalf("snapshot left creating after its caller went away: %+v", got)
	}
	if cur := e.volume(v.ID); len(cur.Snapshotting) != 0 {
		t.Fatalf("volume still marked as snapshotted: %v", cur.Snapshotting)
	}
	cleanupAll(t, s, alice)
	checkProvisioned(t)
}
