package mirror

import (
	"encoding/json"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// syncResizer is a leg whose Resize syncs the file first, as block.File's
// does (it fsyncs the new size): over a mirrortest-volatile child, a
// resize while that child's switch is on drops the writes it holds and
// fails with ENOSPC, as a writeback that found no space does — reported to
// that one sync only, so the leg's next flush succeeds.
type syncResizer struct {
	block.Layer
	raw json.RawMessage
}

func init() {
	block.Register(block.Type{Name: "mirrortest-syncresize", MinChildren: 1, MaxChildren: 1,
		New: func(_ block.Env, raw json.RawMessage, ch []block.Layer) (block.Layer, error) {
			return &syncResizer{Layer: ch[0], raw: raw}, nil
		}})
}

func (s *syncResizer) Resize(n int64) error {
	if err := s.Layer.Flush(); err != nil {
		return fmt.Errorf("resize: %w", err)
	}
	// The file below the test layers grows.
	var d block.Layer = s.Layer
	for {
		if r, ok := d.(block.Resizer); ok {
			return r.Resize(n)
		}
		d = d.(block.Parent).Children()[0]
	}
}

func (s *syncResizer) Describe() block.Node {
	kid := s.Layer.Describe()
	return block.Node{Type: "mirrortest-syncresize", Params: s.raw, State: kid.State, Children: []block.Node{kid}}
}

func (s *syncResizer) Children() []block.Layer { return []block.Layer{s.Layer} }

// TestResizeRefusedSyncKeepsLegsAlike: growing a leg syncs it (a file's
// Resize fsyncs), and a writeback that finds no space then drops writes
// the leg had taken and reports that to the resize alone. The mirror
// ignored it beyond failing the resize: a later flush succeeded on every
// leg, the write it covered was on one leg only, and reads returned one
// version or the other depending on the leg they landed on.
func TestResizeRefusedSyncKeepsLegsAlike(t *testing.T) {
	f := newFixture(t, 65536, 1<<20, 81, "syncresize", "volatile")

	// Acknowledged, in leg b's cache only.
	f.write(3)
	f.refuse.Store(true)
	if err := f.Resize(2 << 20); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("resize leg b refuses: %v, want ENOSPC", err)
	}
	f.refuse.Store(false)
	// The flush succeeds; the write is now held by one leg only. Whatever
	// version it reads as, every read must say the same, and once the
	// resync the flush started is done, every leg must hold it.
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	first := make([]byte, f.region)
	if err := f.ReadAt(first, 3*f.region); err != nil {
		t.Fatal(err)
	}
	for k := range 4 {
		got := make([]byte, f.region)
		if err := f.ReadAt(got, 3*f.region); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(got, first); i >= 0 {
			t.Fatalf("read %d of region 3 differs from the first at byte %d: the legs differ", k+1, i)
		}
	}
	copy(f.model[3*f.region:], first)
	waitResynced(t, f.Layer)
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	checkCopies(t, f.Layer, f.model)
}

// TestResizeRefusedSyncKeepsRebuildCopies: a rebuild's copies that a
// leg's resize-time sync dropped (refused for want of space) must stay
// stale for the leg; else the rebuild's own checkpoint flush, which
// succeeds, clears their bits and the leg turns ok without the data.
func TestResizeRefusedSyncKeepsRebuildCopies(t *testing.T) {
	// Leg b: the syncResizer over the hook (to hold the rebuild).
	f := newFixture(t, 65536, 1<<20, 82, "syncresize", "hook", "volatile")
	f.failB(1, 5)
	// Let the intent bits go: leg b's stale map alone records the regions.
	f.settle()

	reached, release := f.holdWrite(5 * f.region)
	repaired := f.repair()
	<-reached // region 1 is copied onto leg b, in its cache

	f.refuse.Store(true)
	if err := f.Resize(2 << 20); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("resize the rebuilding leg refuses: %v, want ENOSPC", err)
	}
	f.refuse.Store(false)
	close(release)
	if err := <-repaired; err != nil {
		t.Fatalf("repair: %v", err)
	}
	f.wantOK()
	checkCopies(t, f.Layer, f.model)
}

// waitResynced waits for the background resync to have copied every
// region waiting for it.
func waitResynced(t *testing.T, l *Layer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		n := l.unsynced
		l.mu.Unlock()
		if n == 0 {
			l.bg.Wait()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d regions still wait for a resync", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
