package metatest

import (
	"context"
	"sync"

	"github.com/basalt-storage/basalt/internal/meta"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Watcher stands in for a Store's etcd watcher: it hands out real
// watches, which the test can break (as a leader loss or a reset
// connection does) and keep from being re-established for a while.
type Watcher struct {
	clientv3.Watcher

	mu      sync.Mutex
	cancels []context.CancelFunc
	gate    chan struct{} // while open, new watches wait
	held    chan struct{} // closed once a new watch waits at gate
}

// BreakableWatches puts a Watcher under m's watches. m should be a Store
// of the test's own (Env.Connect).
func BreakableWatches(m *meta.Store) *Watcher {
	cli := m.Client()
	w := &Watcher{Watcher: cli.Watcher}
	cli.Watcher = w
	return w
}

// Watch implements clientv3.Watcher.
func (w *Watcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.mu.Lock()
	gate, held := w.gate, w.held
	if gate != nil && held != nil {
		close(held)
		w.held = nil
	}
	w.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	w.mu.Lock()
	w.cancels = append(w.cancels, cancel)
	w.mu.Unlock()
	return w.Watcher.Watch(wctx, key, opts...)
}

// BreakAndHold ends every open watch; new ones wait until release is
// called. held is closed when the first new watch starts waiting: for a
// Mirror, its relist after the break is then done.
func (w *Watcher) BreakAndHold() (release func(), held <-chan struct{}) {
	gate, h := make(chan struct{}), make(chan struct{})
	w.mu.Lock()
	w.gate, w.held = gate, h
	for _, c := range w.cancels {
		c()
	}
	w.cancels = nil
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.gate, w.held = nil, nil
		w.mu.Unlock()
		close(gate)
	}, h
}
