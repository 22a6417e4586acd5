package lock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// unopenableWatcher opens no watch: its Watch waits until its context
// ends and then returns a closed channel, as etcd's client does while it
// has no connection to open the watch over (a node cut off from etcd).
type unopenableWatcher struct {
	clientv3.Watcher
	once    sync.Once
	waiting chan struct{} // closed when a Watch first waits
}

func (w *unopenableWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.once.Do(func() { close(w.waiting) })
	<-ctx.Done()
	ch := make(chan clientv3.WatchResponse)
	close(ch)
	return ch
}

// TestSleepEndsWithSessionWhileWatchCannotOpen: a waiter whose session
// ends while its watch cannot be opened fails at once with ErrLost, as
// sleep promises, instead of waiting for its context: etcd's client does
// not return from Watch without a connection, so a sleep that looked at
// the session only once its watch was open hung for the whole outage.
func TestSleepEndsWithSessionWhileWatchCannotOpen(t *testing.T) {
	cli := testClient(t)
	prefix := testPrefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	holder := New(newSession(t, cli, 5), prefix, Options{Owner: "holder", Log: quiet})
	defer holder.Close()
	if _, err := holder.Acquire(ctx, "r", Write); err != nil {
		t.Fatal(err)
	}

	// The waiter's reads and writes reach etcd; its watches cannot open.
	sess := newSession(t, cli, 5)
	w := &unopenableWatcher{Watcher: cli.Watcher, waiting: make(chan struct{})}
	wc := clientv3.NewCtxClient(context.Background())
	wc.KV, wc.Lease, wc.Watcher = cli.KV, cli.Lease, w
	l := &Locker{cli: wc, sess: sess, prefix: prefix, owner: "waiter", log: quiet}
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, "r", Write)
		done <- err
	}()
	select {
	case <-w.waiting:
	case err := <-done:
		t.Fatalf("the waiter did not wait: %v", err)
	}
	sess.Orphan() // the session ends: its keepalives gave up
	select {
	case err := <-done:
		if !errors.Is(err, ErrLost) {
			t.Fatalf("acquire after the session ended: %v, want ErrLost", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a waiter whose session ended went on waiting for its watch to open")
	}
}
