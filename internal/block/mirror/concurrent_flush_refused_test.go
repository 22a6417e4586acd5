package mirror

import (
	"errors"
	"syscall"
	"testing"
	"time"
)

// TestConcurrentFlushWaitsForRefusal: two flushes run at once. Leg b's
// writeback finds no space and drops a write it had taken; the file
// reports that to one of the flushes only, and the other's flush of leg b
// succeeds. That one must not clear the write's intent bit before the
// refusal is recorded (the region marked unsynced), or the ok legs are
// left differing there for good: reads return one version or the other
// depending on the leg.
func TestConcurrentFlushWaitsForRefusal(t *testing.T) {
	f := newFixture(t, 65536, 1<<20, 78, "volatile")
	f.settle()

	// Acknowledged; in leg b's cache.
	f.write(1)

	// The first flush: leg b's writeback drops the write; the mirror
	// hears of it only once letOn is closed.
	refusedAt, letOn := f.holdRefusal()
	f.refuse.Store(true)
	first := make(chan error, 1)
	go func() { first <- f.Flush() }()
	<-refusedAt

	// The second flush, meanwhile: leg b's flush succeeds.
	second := make(chan error, 1)
	go func() { second <- f.Flush() }()
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
	f.bg.Wait()
	f.flushes(2)
	f.wantOK()
	checkCopies(t, f.Layer, f.model)
}
