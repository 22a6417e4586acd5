package mirror

import (
	"errors"
	"syscall"
	"testing"
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
	f := newFixture(t, 65536, 1<<20, 74, "hook", "volatile")
	// Leg b fails and misses writes to regions 1 and 5.
	f.failB(1, 5)
	f.settle()

	// The rebuild copies region 1 onto leg b, checkpoints it and waits at
	// region 5.
	f.checkpointEvery.Store(1)
	reached, release := f.holdWrite(5 * f.region)
	repaired := f.repair()
	<-reached

	// A user's write into region 2 (not stale for leg b), which leg b
	// takes into its cache.
	f.write(2)

	// The checkpoint's flush of leg b is refused: its writeback drops the
	// copies and the user's write.
	f.refuse.Store(true)
	close(release)
	if err := <-repaired; !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("repair whose checkpoint flush is refused: %v, want ENOSPC", err)
	}
	f.refuse.Store(false)

	// Space is back: the users' flushes succeed (the error went to the
	// checkpoint's), and may let region 2's intent bit go.
	f.flushes(2)
	if err := <-f.repair(); err != nil {
		t.Fatalf("repair: %v", err)
	}
	f.wantOK()
	checkCopies(t, f.Layer, f.model)
}
