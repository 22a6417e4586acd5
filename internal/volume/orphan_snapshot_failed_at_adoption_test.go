package volume

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
)

// An orphaned snapshot that can no longer be taken exact is failed in the
// commit that adopts it. Adopted in one commit and failed in a second, it
// was recorded in between as creating on the adopting node — that node's
// to take (delegate.go), and for good had the second commit failed.
func TestOrphanedSnapshotFailedInItsAdoption(t *testing.T) {
	e := newPrivateEnv(t)
	a := e.started(Config{Node: uniq("a")}) // adopts nothing
	e.alive(a.cfg.Node)
	alice := caller("alice")
	v, _ := e.filledVolume(a, alice, 1<<20, 7)
	b, handed, res := e.writerDiesWithSnapshot(a, alice, v.ID)
	// A live node takes the volume for writing, the snapshot still
	// recorded as under way (as when that node's failPassedSnapshots did
	// not commit): only the adoption can fail it.
	writer := uniq("c")
	e.alive(writer)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	id, err := e.meta.GrantLease(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.meta.AcquireVolumeLease(ctx, v.ID, writer, id); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var seen []meta.Snapshot
	go e.meta.WatchSnapshots(ctx, 0, func(sn *meta.Snapshot) {
		if sn.ID == handed.ID {
			mu.Lock()
			seen = append(seen, *sn)
			mu.Unlock()
		}
	})
	time.Sleep(100 * time.Millisecond) // the watch is set up
	if sn := e.snapshot(handed.ID); sn.Status != meta.StatusCreating {
		t.Fatalf("before the adoption the snapshot is %s: %s", sn.Status, sn.StatusMessage)
	}

	e.adopting(Config{})
	for deadline := time.Now().Add(10 * time.Second); e.snapshot(handed.ID).Status == meta.StatusCreating; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the orphaned snapshot is still being created")
		}
	}
	if r := <-res; r.sn == nil || r.sn.Status != meta.StatusError {
		t.Fatalf("the create call that handed the snapshot over returned %+v, %v", r.sn, r.err)
	}
	time.Sleep(200 * time.Millisecond) // the watch delivers the last writes
	mu.Lock()
	defer mu.Unlock()
	for _, sn := range seen {
		if sn.Status == meta.StatusCreating && sn.Node != b.cfg.Node {
			t.Fatalf("the snapshot was recorded as creating on node %s after its node %s died (writes: %+v)", sn.Node, b.cfg.Node, seen)
		}
	}
	if len(seen) == 0 || seen[len(seen)-1].Status != meta.StatusError {
		t.Fatalf("the snapshot's writes seen: %+v", seen)
	}
}
