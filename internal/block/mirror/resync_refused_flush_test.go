package mirror

import (
	"errors"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// TestResyncRegionRefusedFlushDuringCopy: a region waiting to be copied
// across the ok legs (a leg refused a flush) is being copied onto leg b
// when a user's flush, which leg b refuses for want of space, drops what
// leg b had cached of the copy. The region was unsynced already, so the
// refusal changed nothing visible; the copy must not then mark it synced,
// or the next flush lets its intent bit go and the ok legs differ there.
func TestResyncRegionRefusedFlushDuringCopy(t *testing.T) {
	const region = 2 << 20 // two chunks of the copy buffer
	id := t.Name() + "/b.img"
	refuse := volatileSwitch(id)
	legB := `{"type":"mirrortest-hook","params":{"id":"` + id + `"},"children":[` +
		`{"type":"mirrortest-volatile","params":{"id":"` + id + `"},"children":[{"type":"file","params":{"path":"b.img"}}]}]}`
	spec := `{"type":"mirror","params":{"region":2097152},"children":[{"type":"file","params":{"path":"a.img"}},` + legB + `]}`
	env := block.Env{Dir: t.TempDir(), Size: 4 * region, Create: true}
	l := openMirror(t, env, spec)
	defer func() { l.Close() }()
	model := fillAll(t, l, 76)
	rng := rand.New(rand.NewPCG(76, 2))
	l.clearDelay.Store(0)
	for range 2 {
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	// Leg b caches a write into region 1, and refuses the flush: region 1
	// is unsynced.
	write(t, l, model, randBytes(rng, region), 1*region)
	refuse.Store(true)
	if err := l.Flush(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("flush leg b refuses: %v, want ENOSPC", err)
	}
	refuse.Store(false)

	// The next flush succeeds and starts the copy across; hold it at its
	// second chunk (the first is in leg b's cache).
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
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	<-reached

	// A user's flush leg b refuses: the cached first chunk is gone.
	refuse.Store(true)
	if err := l.Flush(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("flush leg b refuses: %v, want ENOSPC", err)
	}
	refuse.Store(false)
	close(release)
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
	l.mu.Lock()
	unsynced := l.unsynced
	l.mu.Unlock()
	a, b := make([]byte, l.Size()), make([]byte, l.Size())
	if err := l.ReadCopy(0, a, 0); err != nil {
		t.Fatal(err)
	}
	if err := l.ReadCopy(1, b, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(a, b); i >= 0 {
		t.Fatalf("ok legs differ at byte %d (region %d); %d regions left to copy across", i, int64(i)/region, unsynced)
	}
}
