package mirror

import (
	"errors"
	"syscall"
	"testing"
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
	f := newFixture(t, region, 4*region, 77, "hook", "volatile")
	// Leg b fails and misses a write to region 1.
	f.failB(1)
	f.settle()

	// Hold the rebuild's copy of region 1 at its second chunk: the first
	// is in leg b's cache.
	reached, release := f.holdWrite(1*region + (1 << 20))
	repaired := f.repair()
	<-reached

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
