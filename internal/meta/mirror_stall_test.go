package meta

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// stallingWatcher passes a watch's responses on until stalled, then
// withholds them: a stream whose connection died unnoticed.
type stallingWatcher struct {
	clientv3.Watcher
	stalled atomic.Bool
}

func (w *stallingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := w.Watcher.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for r := range in {
			if w.stalled.Load() {
				continue
			}
			select {
			case out <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// TestMirrorStalledWatchRelists: a mirror whose watch goes silent without
// an error lists again within its stall bound, so a user deleted through
// another node stops authenticating here; a quiet but live watch (nothing
// changes under its prefix) is not taken for stalled.
func TestMirrorStalledWatchRelists(t *testing.T) {
	beat, stall := mirrorHeartbeat, mirrorStall
	mirrorHeartbeat, mirrorStall = 50*time.Millisecond, 1500*time.Millisecond // 30 beats: a loaded host delays some
	defer func() { mirrorHeartbeat, mirrorStall = beat, stall }()
	other := openTestStore(t)
	ctx := ctxT(t)
	s := clientStore(t)
	w := &stallingWatcher{Watcher: s.cli.Watcher}
	s.cli.Watcher = w
	m := s.MirrorUsersByName(ctx)
	name := uniq("stall")
	if err := other.Update(ctx, func(tx *Tx) error { tx.PutUser(&User{Name: name, ID: "id-" + name}); return nil }); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the user in the mirror", func() bool { _, ok := m.Get(name); return ok })
	// Quiet, not stalled: progress notifications keep it listening (a
	// relist would leave it unsynced for a second).
	for end := time.Now().Add(3 * mirrorStall); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if _, ok := m.Get(name); !ok {
			t.Fatal("a quiet watch was taken for stalled: the mirror stopped answering")
		}
	}
	w.stalled.Store(true)
	if err := other.Update(ctx, func(tx *Tx) error { tx.DeleteUser(&User{Name: name, ID: "id-" + name}); return nil }); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted user gone from the mirror of a stalled watch", func() bool { _, ok := m.Get(name); return !ok })
}
