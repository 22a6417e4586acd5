package mirror

import (
	"errors"
	"syscall"
	"testing"
	"time"
)

// TestCheckpointWaitsForRefusedFlush: a flush refused by the rebuilding
// leg (its writeback found no space) may have dropped the rebuild's
// copies, and the file reports that to the one sync that asked — here
// the user's flush. A checkpoint whose own flush ran after the refusal,
// but before the mirror had heard of it, succeeded and cleared the copies'
// stale bits, and the leg was made ok without the data. Checkpoints now
// wait for flushes under way to record their refusals.
func TestCheckpointWaitsForRefusedFlush(t *testing.T) {
	f := newFixture(t, 65536, 1<<20, 73, "hook", "volatile")
	f.failB(1, 5)
	f.settle()

	// The rebuild copies region 1 onto leg b (into its cache) and waits
	// at region 5.
	reached, release := f.holdWrite(5 * f.region)
	repaired := f.repair()
	<-reached

	// The user's flush: leg b's writeback fails and drops region 1's
	// copy; the mirror hears of it only once letOn is closed.
	refusedAt, letOn := f.holdRefusal()
	f.refuse.Store(true)
	flushed := make(chan error, 1)
	go func() { flushed <- f.Flush() }()
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
	f.wantOK()
	checkCopies(t, f.Layer, f.model)
}
