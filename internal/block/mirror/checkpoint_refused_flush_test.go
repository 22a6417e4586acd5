package mirror

import (
	"errors"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// TestCheckpointWaitsForRefusedFlush: a flush refused by the rebuilding
// leg (its writeback found no space) may have dropped the rebuild's
// copies, and the file reports that to the one sync that asked — here
// the user's flush. A checkpoint whose own flush ran after the refusal,
// but before the mirror had heard of it, succeeded and cleared the copies'
// stale bits, and the leg was made ok without the data. Checkpoints now
// wait for flushes under way to record their refusals.
func TestCheckpointWaitsForRefusedFlush(t *testing.T) {
	const region = 65536
	id := t.Name() + "/b.img"
	refuse := volatileSwitch(id)
	legB := `{"type":"mirrortest-hook","params":{"id":"` + id + `"},"children":[` +
		`{"type":"mirrortest-volatile","params":{"id":"` + id + `"},"children":[{"type":"file","params":{"path":"b.img"}}]}]}`
	spec := `{"type":"mirror","params":{"region":65536},"children":[{"type":"file","params":{"path":"a.img"}},` + legB + `]}`
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := openMirror(t, env, spec)
	defer func() { l.Close() }()
	model := fillAll(t, l, 73)
	rng := rand.New(rand.NewPCG(73, 2))

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

	// The rebuild copies region 1 onto leg b (into its cache) and waits
	// at region 5.
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

	// The user's flush: leg b's writeback fails and drops region 1's
	// copy; the mirror hears of it only once letOn is closed.
	refusedAt, letOn := make(chan struct{}), make(chan struct{})
	refusedHooks.Store(id, func() {
		refuse.Store(false) // the next sync of the file succeeds
		close(refusedAt)
		<-letOn
	})
	defer refusedHooks.Delete(id)
	refuse.Store(true)
	flushed := make(chan error, 1)
	go func() { flushed <- l.Flush() }()
	<-refusedAt
	close(release)                     // the rebuild goes on to its checkpoint
	time.Sleep(300 * time.Millisecond) // which, not waiting, clears region 1 now
	close(letOn)
	if err := <-flushed; !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("flush the rebuilding leg refuses: %v, want ENOSPC", err)
	}
	if err := <-repaired; err != nil {
		t.Fatalf("repair: %v", err)
	}
	if s := legStates(l); s[0] != legOK || s[1] != legOK {
		t.Fatalf("legs %v after the repair, want both ok", s)
	}
	checkCopies(t, l, model)
}
