package meta

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// countingWatcher counts the watches opened through it: each relist of a
// mirror opens one.
type countingWatcher struct {
	clientv3.Watcher
	opened atomic.Int64
}

func (w *countingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.opened.Add(1)
	return w.Watcher.Watch(ctx, key, opts...)
}

// TestMirrorQuietStoreKeepsItsWatch: on a store nobody writes to, a
// mirror's watch hears progress notifications and is never taken for
// stalled, even with another watch of the same client waiting for a
// revision the store has not reached. etcd sends a stream's progress
// notification only when every watch on the stream has reached the
// store's revision; a watch started at the revision after its list's
// would get none until the next write anywhere, and relist forever on an
// idle cluster (unsynced for a second each time).
func TestMirrorQuietStoreKeepsItsWatch(t *testing.T) {
	beat, stall := mirrorHeartbeat, mirrorStall
	mirrorHeartbeat, mirrorStall = 50*time.Millisecond, 750*time.Millisecond
	defer func() { mirrorHeartbeat, mirrorStall = beat, stall }()
	openTestStore(t)
	ctx := ctxT(t)
	s := clientStore(t)
	w := &countingWatcher{Watcher: s.cli.Watcher}
	s.cli.Watcher = w

	// Another watch of this client, as the volume lease watch is: from
	// the revision after the current one, so behind nothing yet ahead of
	// the store until someone writes.
	cur, err := s.cli.Get(ctx, "basalt-test-none")
	if err != nil {
		t.Fatal(err)
	}
	s.cli.Watch(clientv3.WithRequireLeader(ctx), "basalt-test-none", clientv3.WithRev(cur.Header.Revision+1))

	m := s.MirrorUsersByName(ctx)
	eventually(t, "the mirror synced", func() bool {
		m.mu.RLock()
		defer m.mu.RUnlock()
		return m.synced
	})
	opened := w.opened.Load()
	for end := time.Now().Add(4 * mirrorStall); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		m.mu.RLock()
		synced := m.synced
		m.mu.RUnlock()
		if !synced || w.opened.Load() != opened {
			t.Fatalf("the mirror of a quiet store took its watch for stalled and listed again (watches opened: %d, then %d)", opened, w.opened.Load())
		}
	}
}
