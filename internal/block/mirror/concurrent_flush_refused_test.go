package mirror

import (
	"errors"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// TestConcurrentFlushWaitsForRefusal: two flushes run at once. Leg b's
// writeback finds no space and drops a write it had taken; the file
// reports that to one of the flushes only, and the other's flush of leg b
// succeeds. That one must not clear the write's intent bit before the
// refusal is recorded (the region marked unsynced), or the ok legs are
// left differing there for good: reads return one version or the other
// depending on the leg.
func TestConcurrentFlushWaitsForRefusal(t *testing.T) {
	const region = 65536
	id := t.Name() + "/b.img"
	refuse := volatileSwitch(id)
	legB := `{"type":"mirrortest-volatile","params":{"id":"` + id + `"},"children":[{"type":"file","params":{"path":"b.img"}}]}`
	spec := `{"type":"mirror","params":{"region":65536},"children":[{"type":"file","params":{"path":"a.img"}},` + legB + `]}`
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := openMirror(t, env, spec)
	defer func() { l.Close() }()
	model := fillAll(t, l, 78)
	rng := rand.New(rand.NewPCG(78, 2))
	l.clearDelay.Store(0)
	for range 2 {
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	// Acknowledged; in leg b's cache.
	write(t, l, model, randBytes(rng, region), 1*region)

	// The first flush: leg b's writeback drops the write; the mirror
	// hears of it only once letOn is closed.
	refusedAt, letOn := make(chan struct{}), make(chan struct{})
	refusedHooks.Store(id, func() {
		refuse.Store(false) // the next sync of the file succeeds
		close(refusedAt)
		<-letOn
	})
	defer refusedHooks.Delete(id)
	refuse.Store(true)
	first := make(chan error, 1)
	go func() { first <- l.Flush() }()
	<-refusedAt

	// The second flush, meanwhile: leg b's flush succeeds.
	second := make(chan error, 1)
	go func() { second <- l.Flush() }()
	var err2 error
	done := false
	select {
	case err2 = <-second:
		done = true
	case <-time.After(300 * time.Millisecond): // it waits for the first
	}
	close(letOn)
	if err := <-first; !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("flush leg b refuses: %v, want ENOSPC", err)
	}
	if !done {
		err2 = <-second
	}
	if err2 != nil {
		t.Fatalf("second flush: %v", err2)
	}
	l.bg.Wait()
	for range 2 {
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
		l.bg.Wait()
	}
	if s := legStates(l); s[0] != legOK || s[1] != legOK {
		t.Fatalf("legs %v, want both ok", s)
	}
	checkCopies(t, l, model)
}
