package meta

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// cutBeforeWatch cuts its proxy once, just before the first watch opens:
// the node loses etcd between a mirror's list and its watch.
type cutBeforeWatch struct {
	clientv3.Watcher
	p    *cutProxy
	once sync.Once
}

func (w *cutBeforeWatch) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.once.Do(w.p.Cut)
	return w.Watcher.Watch(ctx, key, opts...)
}

// TestMirrorWatchThatCannotOpenStopsAnswering: a mirror whose store
// becomes unreachable after its list, before its watch is open, stops
// answering within its stall bound. etcd's client waits for a connection
// to open a watch (its Watch call does not return meanwhile), so a mirror
// that counted silence only from the watch's opening served its list for
// as long as the partition lasted — a user deleted meanwhile would go on
// authenticating on this node.
func TestMirrorWatchThatCannotOpenStopsAnswering(t *testing.T) {
	beat, stall := mirrorHeartbeat, mirrorStall
	mirrorHeartbeat, mirrorStall = 50*time.Millisecond, 750*time.Millisecond
	defer func() { mirrorHeartbeat, mirrorStall = beat, stall }()
	other := openTestStore(t)
	ctx := ctxT(t)
	name := uniq("cut")
	if err := other.Update(ctx, func(tx *Tx) error { tx.PutUser(&User{Name: name, ID: "id-" + name}); return nil }); err != nil {
		t.Fatal(err)
	}
	p := newCutProxy(t)
	s, err := Open(ctx, Config{Endpoints: []string{"https://" + p.addr}, ExternalTLS: testEnv.clientTLS}, testStore.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	s.cli.Watcher = &cutBeforeWatch{Watcher: s.cli.Watcher, p: p}

	m := s.MirrorUsersByName(ctx)
	// The list went through (the cut comes with the watch), so the mirror
	// answered for a moment; it must stop within a few stall bounds.
	eventually(t, "the mirror of an unreachable store stops answering", func() bool {
		m.mu.RLock()
		defer m.mu.RUnlock()
		return m.byKey != nil && !m.synced
	})
	if _, ok := m.Get(name); ok {
		t.Fatal("the mirror of an unreachable store still answers")
	}
}
