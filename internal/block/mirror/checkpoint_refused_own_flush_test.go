package mirror

import (
	"errors"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// TestCheckpointRefusedFlushKeepsUserWrites: a rebuild checkpoint's own
// flush of the rebuilding leg, refused for want of space, may have dropped
// not only the rebuild's copies but also the users' writes the leg had
// taken since its last flush (a writeback that found no space), and the
// file reports that to this one sync only: the users' next flush of the
// leg succeeds. The regions of those writes must become stale for the leg
// (as after a refused user flush), or their intent bits are cleared and
// the leg turns ok after the rebuild without the writes.
func TestCheckpointRefusedFlushKeepsUserWrites(t *testing.T) {
	const region = 65536
	id := t.Name() + "/b.img"
	refuse := volatileSwitch(id)
	legB := `{"type":"mirrortest-hook","params":{"id":"` + id + `"},"children":[` +
		`{"type":"mirrortest-volatile","params":{"id":"` + id + `"},"children":[{"type":"file","params":{"path":"b.img"}}]}]}`
	spec := `{"type":"mirror","params":{"region":65536},"children":[{"type":"file","params":{"path":"a.img"}},` + legB + `]}`
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := openMirror(t, env, spec)
	defer func() { l.Close() }()
	model := fillAll(t, l, 74)
	rng := rand.New(rand.NewPCG(74, 2))

	// Leg b fails and misses writes to regions 1 and 5.
	l.failLeg(1, l.legs[1].dev, errors.New("a disk error"))
	if err := l.persist(); err != nil {
		t.Fatal(err)
	}
	write(t, l, model, randBytes(rng, region), 1*region)
	write(t, l, model, randBytes(rng, region), 5*region)
	l.clearDelay.Store(0)
	for range 2 {
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	// The rebuild copies region 1 onto leg b, checkpoints it and waits at
	// region 5.
	l.checkpointEvery.Store(1)
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	writeHooks.Store(id, func(off int64) {
		if off == 5*region {
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

	// A user's write into region 2 (not stale for leg b), which leg b
	// takes into its cache.
	write(t, l, model, randBytes(rng, region), 2*region)

	// The checkpoint's flush of leg b is refused: its writeback drops the
	// copies and the user's write.
	refuse.Store(true)
	close(release)
	if err := <-repaired; !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("repair whose checkpoint flush is refused: %v, want ENOSPC", err)
	}
	refuse.Store(false)

	// Space is back: the users' flushes succeed (the error went to the
	// checkpoint's), and may let region 2's intent bit go.
	for range 2 {
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Repair(t.Context(), nil); err != nil {
		t.Fatalf("repair: %v", err)
	}
	if s := legStates(l); s[0] != legOK || s[1] != legOK {
		t.Fatalf("legs %v after the repair, want both ok", s)
	}
	checkCopies(t, l, model)
}
