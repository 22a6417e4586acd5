package mirror

import (
	"errors"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// TestRebuildCopyOvertakenByRefusedFlush: a user's flush the rebuilding
// leg refuses for want of space, while the rebuild is copying a region
// onto it, drops the part of the copy the leg had cached — after the
// refusal forgot the rebuild's copies, but before the rebuild recorded
// this one as copied. The region must stay stale for the leg: the
// checkpoint's own flush then succeeds (the error went to the user's),
// and clearing the region's bit would make the leg ok without its data.
func TestRebuildCopyOvertakenByRefusedFlush(t *testing.T) {
	const region = 2 << 20 // two chunks of the copy buffer
	id := t.Name() + "/b.img"
	refuse := volatileSwitch(id)
	legB := `{"type":"mirrortest-hook","params":{"id":"` + id + `"},"children":[` +
		`{"type":"mirrortest-volatile","params":{"id":"` + id + `"},"children":[{"type":"file","params":{"path":"b.img"}}]}]}`
	spec := `{"type":"mirror","params":{"region":2097152},"children":[{"type":"file","params":{"path":"a.img"}},` + legB + `]}`
	env := block.Env{Dir: t.TempDir(), Size: 4 * region, Create: true}
	l := openMirror(t, env, spec)
	defer func() { l.Close() }()
	model := fillAll(t, l, 77)
	rng := rand.New(rand.NewPCG(77, 2))

	// Leg b fails and misses a write to region 1.
	l.failLeg(1, l.legs[1].dev, errors.New("a disk error"))
	if err := l.persist(); err != nil {
		t.Fatal(err)
	}
	write(t, l, model, randBytes(rng, region), 1*region)
	l.clearDelay.Store(0)
	for range 2 {
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	// Hold the rebuild's copy of region 1 at its second chunk: the first
	// is in leg b's cache.
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	writeHooks.Store(id, func(off int64) {
		if off == 1*region+(1<<20) {
			once.Do(func() {
				close(reached)
				<-release
			})
		}
	})
	defer writeHooks.Delete(id)
	repaired := make(chan error, 1)
	go func() { repaired <- l.Repair(t.Context(), nil) }()
	<-reached

	refuse.Store(true)
	if err := l.Flush(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("flush the rebuilding leg refuses: %v, want ENOSPC", err)
	}
	refuse.Store(false)
	close(release)
	if err := <-repaired; err != nil {
		t.Fatalf("repair: %v", err)
	}
	if s := legStates(l); s[0] != legOK || s[1] != legOK {
		t.Fatalf("legs %v after the repair, want both ok", s)
	}
	checkCopies(t, l, model)
}
