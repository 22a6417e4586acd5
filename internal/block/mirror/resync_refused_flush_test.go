package mirror

import (
	"errors"
	"syscall"
	"testing"
)

// TestResyncRegionRefusedFlushDuringCopy: a region waiting to be copied
// across the ok legs (a leg refused a flush) is being copied onto leg b
// when a user's flush, which leg b refuses for want of space, drops what
// leg b had cached of the copy. The region was unsynced already, so the
// refusal changed nothing visible; the copy must not then mark it synced,
// or the next flush lets its intent bit go and the ok legs differ there.
func TestResyncRegionRefusedFlushDuringCopy(t *testing.T) {
	const region = 2 << 20 // two chunks of the copy buffer
	f := newFixture(t, region, 4*region, 76, "hook", "volatile")
	f.settle()

	// Leg b caches a write into region 1, and refuses the flush: region 1
	// is unsynced.
	f.write(1)
	refused := func() {
		t.Helper()
		f.refuse.Store(true)
		if err := f.Flush(); !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("flush leg b refuses: %v, want ENOSPC", err)
		}
		f.refuse.Store(false)
	}
	refused()

	// The next flush succeeds and starts the copy across; hold it at its
	// second chunk (the first is in leg b's cache).
	reached, release := f.holdWrite(1*region + (1 << 20))
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	<-reached

	// A user's flush leg b refuses: the cached first chunk is gone.
	refused()
	close(release)
	f.bg.Wait()

	f.flushes(2)
	f.wantOK()
	f.mu.Lock()
	unsynced := f.unsynced
	f.mu.Unlock()
	a, b := make([]byte, f.Size()), make([]byte, f.Size())
	if err := f.ReadCopy(0, a, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.ReadCopy(1, b, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(a, b); i >= 0 {
		t.Fatalf("ok legs differ at byte %d (region %d); %d regions left to copy across", i, int64(i)/region, unsynced)
	}
}
