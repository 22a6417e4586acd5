package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// cleanupTimeout bounds the etcd calls that undo a request after its context
// ended (withdrawing a waiter, reverting an upgrade).
const cleanupTimeout = 5 * time.Second

// watchRetry spaces re-reads after a watch failure other than ctx, so that a
// watch that keeps failing does not spin.
const watchRetry = 100 * time.Millisecond

// Held is a granted lock. Token, Resource and Key may be called at any time;
// Upgrade, TryUpgrade and Release are serialised.
type Held struct {
	l        *Locker
	resource string
	prefix   string
	key      string
	token    int64

	mu       sync.Mutex
	mode     Mode
	released bool
}

// Resource is the locked resource's name.
func (h *Held) Resource() string { return h.resource }

// Key is the holder's etcd key.
func (h *Held) Key() string { return h.key }

// Token is the fencing token: the etcd revision that created the holder's
// key. Storage written under the lock rejects a token older than the newest
// it has seen for the resource, so a holder that lost its lock without
// knowing (paused, partitioned) cannot overwrite its successor's work.
func (h *Held) Token() int64 { return h.token }

// Mode is the mode currently held (Write after a successful Upgrade).
func (h *Held) Mode() Mode {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mode
}

// IsOwner is an etcd comparison true while this holder's key exists: a
// metadata transaction guarded by it commits only under the lock.
func (h *Held) IsOwner() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.token)
}

// Lost is closed when the session the lock lives on has ended (its lease
// expired or was revoked): the lock is gone or about to be, and the holder
// must stop acting under it.
func (h *Held) Lost() <-chan struct{} { return h.l.sess.Done() }

// Release gives the lock up. Releasing twice is a no-op. If the key was
// already gone (session expired) the lock is released all the same and the
// error wraps ErrLost, because the holder was at some point unprotected.
// If etcd cannot be reached, Release returns the error and goes on trying
// in the background (see deleteLater): the holder must consider the lock
// given up either way.
func (h *Held) Release(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return nil
	}
	h.released = true
	resp, err := h.l.cli.Txn(ctx).If(h.IsOwner()).Then(clientv3.OpDelete(h.key)).Commit()
	if err != nil {
		h.l.deleteLater(err, h.resource, h.key, h.IsOwner())
		return fmt.Errorf("lock %q: release: %w (retried in the background)", h.resource, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("lock %q: release %s (token %d): %w", h.resource, h.mode, h.token, ErrLost)
	}
	h.l.log.Debug("lock: released", "resource", h.resource, "mode", h.mode, "token", h.token)
	return nil
}

// Background cleanup: a release or withdrawal that fails during a fault is
// retried until etcd answers or the session ends (when the lease deletes the
// key anyway). Without it, a lock whose release met a leader election would
// block every workflow on its resource until the node's session ended —
// never, for a live node. The first retry waits retryFirst, later ones back
// off to retryMax.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 2 * time.Second
)

// deleteLater deletes key, if cmps hold, in the background.
func (l *Locker) deleteLater(cause error, resource, key string, cmps ...clientv3.Cmp) {
	l.log.Warn("lock: release failed; retrying in the background", "resource", resource, "key", key, "err", cause)
	go func() {
		for delay := retryFirst; ; delay = min(2*delay, retryMax) {
			select {
			case <-l.sess.Done():
				return // the lease took the key with it
			case <-time.After(delay):
			}
			ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
			_, err := l.cli.Txn(ctx).If(cmps...).Then(clientv3.OpDelete(key)).Commit()
			cancel()
			if err == nil {
				l.log.Info("lock: released after retrying", "resource", resource, "key", key)
				return
			}
		}
	}()
}

// lateSweeps are the delays, one after another, at which sweepLate deletes
// a request key once more.
var lateSweeps = []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second}

// sweepLate deletes request key again and again in the background, for a
// minute or until the session ends: its enqueue failed with its outcome
// unknown, and the put may yet be applied after the withdrawal's delete.
// The robustness test once found such a key left for good after a request
// timed out while the leader changed; how the put was delayed is not
// known (a proposal forwarded to a leader that died and delivered when its
// peer came back would do it). The key is unique and never reused, so
// deleting it is always safe.
func (l *Locker) sweepLate(resource, key string) {
	sweeps := lateSweeps
	go func() {
		for _, d := range sweeps {
			select {
			case <-l.sess.Done():
				return // the lease takes the key with it
			case <-time.After(d):
			}
			ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
			resp, err := l.cli.Delete(ctx, key)
			cancel()
			if err == nil && resp.Deleted > 0 {
				l.log.Warn("lock: removed a request key that appeared after its request failed", "resource", resource, "key", key)
			}
		}
	}()
}

// sleep returns when key changes after rev (any event: a deletion frees the
// way, a rewrite may change a mode), when ctx is done or the session ends.
func (l *Locker) sleep(ctx context.Context, key string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	// etcd's client opens a watch only over a connection, and its Watch
	// call does not return until then (or until wctx ends): cut off from
	// etcd, a sleep would miss its session's end for the whole outage.
	// The session's end ends the watch, opened or not.
	go func() {
		select {
		case <-l.sess.Done():
			cancel()
		case <-wctx.Done():
		}
	}()
	wch := l.cli.Watch(wctx, key, clientv3.WithRev(rev+1))
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.sess.Done():
			return ErrLost
		case wr, ok := <-wch:
			if !ok || wr.Canceled || wr.Err() != nil {
				if err := ctx.Err(); err != nil {
					return err
				}
				select {
				case <-l.sess.Done():
					return ErrLost // it ended the watch
				default:
				}
				// Compacted past rev, leader lost, ...: read the queue
				// again; the read reports a real outage.
				if !errors.Is(wr.Err(), rpctypes.ErrCompacted) {
					select {
					case <-time.After(watchRetry):
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return nil
			}
			if len(wr.Events) > 0 {
				return nil
			}
		}
	}
}
