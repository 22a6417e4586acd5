package lock

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DESIGN NOTES: why readers record their admission.
//
// An update holder U at create revision u upgrades by rewriting its own key
// to write mode at revision m. From then on every request that looks at the
// queue sees a writer at u and, if it is newer than u, waits. The readers
// that were granted before m must all be gone before U may write; which are
// they?
//
//   - Readers older than u: nothing ahead of them conflicts (U was granted,
//     so everything ahead of u is a reader). They hold the lock or are about
//     to take it (woken, not yet looked). Either way they are ahead of U in
//     the queue, and the upgrade waits for them all.
//   - Readers newer than u: granted only if nothing between u and them
//     conflicted when they last looked. That is a fact about the past; the
//     queue at m cannot tell it reliably. A reader R blocked by a writer W
//     (u < W < R) might have seen W leave at some revision before m and be
//     about to take the grant, or be about to look again after m and see the
//     writer at u. If the upgrade guessed "granted" and R then waited, the
//     two would wait for each other for ever; if it guessed "waiting" and R
//     had been granted, a reader and the writer would both hold the lock.
//
// So the fact is recorded: a reader newer than an update key is granted only
// by a transaction that writes Admitted into its own key and checks that
// every update key before it still has the modification revision the reader
// saw. The upgrade's rewrite changes that revision. Either the admission
// committed before m (the upgrade reads it and waits for that reader) or it
// fails and the reader, reading again, sees a writer at u and waits. Readers
// older than every update key, the common case, pay nothing extra.
//
// Cancelling an upgrade rewrites the key back to update mode; readers that
// waited only for it watch that key, wake up and admit themselves. A crash
// in the middle leaves a write-mode key on a lease that is about to expire.

// Upgrade turns an update lock into a write lock: it stops new readers at
// once, keeps its place ahead of every queued update or write request, and
// returns when the readers holding the lock beside it, or queued ahead of
// it, have released it. If
// ctx ends first, the lock goes back to update mode (still held) and the
// error is returned.
func (h *Held) Upgrade(ctx context.Context) error { return h.upgrade(ctx, true) }

// TryUpgrade upgrades only if no reader holds the lock; otherwise the lock
// stays in update mode and the answer is a *ConflictError naming the readers.
func (h *Held) TryUpgrade(ctx context.Context) error { return h.upgrade(ctx, false) }

func (h *Held) upgrade(ctx context.Context, wait bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.released:
		return fmt.Errorf("lock %q: upgrade: %w", h.resource, ErrReleased)
	case h.mode != Update:
		return fmt.Errorf("lock %q: upgrade %s: %w", h.resource, h.mode, ErrNotUpdate)
	}
	u, err := h.beginUpgrade(ctx)
	if err != nil {
		return fmt.Errorf("lock %q: upgrade: %w", h.resource, err)
	}
	for err == nil && !u.done {
		if !wait {
			u.revert(ctx)
			return u.conflict()
		}
		h.l.log.Debug("lock: upgrade waits for readers", "resource", h.resource, "token", h.token,
			"readers", len(u.drain))
		if err = h.l.sleep(ctx, u.watchKey, u.watchRev); err == nil {
			err = u.poll(ctx)
		}
	}
	if err != nil {
		u.revert(ctx)
		return fmt.Errorf("lock %q: upgrade: %w", h.resource, err)
	}
	h.mode = Write
	h.l.log.Debug("lock: upgraded", "resource", h.resource, "token", h.token)
	return nil
}

// upgrader is an upgrade in progress: the key is in write mode, the readers
// in drain may still hold the lock.
type upgrader struct {
	h        *Held
	drain    []entry
	done     bool
	watchKey string
	watchRev int64
}

// beginUpgrade rewrites the key to write mode and reads, in the same
// transaction, which readers were admitted before that.
func (h *Held) beginUpgrade(ctx context.Context) (*upgrader, error) {
	rec := record{Mode: Write.String(), Owner: h.l.owner, Upgraded: true}
	resp, err := h.l.cli.Txn(ctx).If(h.IsOwner()).
		Then(clientv3.OpPut(h.key, rec.encode(), clientv3.WithIgnoreLease()),
			clientv3.OpGet(h.prefix, clientv3.WithPrefix())).
		Commit()
	if err != nil {
		// The rewrite may have happened: put the key back to update mode.
		(&upgrader{h: h}).revert(ctx)
		return nil, err
	}
	if !resp.Succeeded {
		return nil, ErrLost
	}
	q, err := parseQueue(resp.Responses[1].GetResponseRange().Kvs)
	if err != nil {
		(&upgrader{h: h}).revert(ctx)
		return nil, err
	}
	u := &upgrader{h: h}
	for _, e := range q {
		if e.key != h.key && e.mode == Read && (e.create < h.token || e.rec.Admitted) {
			u.drain = append(u.drain, e)
		}
	}
	if err := u.settle(resp.Responses[1].GetResponseRange().Kvs, resp.Header.Revision); err != nil {
		u.revert(ctx)
		return nil, err
	}
	return u, nil
}

// settle drops the readers that are gone from a snapshot of the queue taken
// at rev; done when none is left, else watch the newest one.
func (u *upgrader) settle(kvs []*mvccpb.KeyValue, rev int64) error {
	present := make(map[string]int64, len(kvs))
	for _, kv := range kvs {
		present[string(kv.Key)] = kv.CreateRevision
	}
	if present[u.h.key] != u.h.token {
		return ErrLost
	}
	keep := u.drain[:0]
	for _, e := range u.drain {
		if present[e.key] == e.create {
			keep = append(keep, e)
		}
	}
	u.drain = keep
	u.done = len(keep) == 0
	if !u.done {
		u.watchKey, u.watchRev = keep[len(keep)-1].key, rev
	}
	return nil
}

// poll reads the queue again and settles.
func (u *upgrader) poll(ctx context.Context) error {
	resp, err := u.h.l.cli.Get(ctx, u.h.prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("read queue: %w", err)
	}
	return u.settle(resp.Kvs, resp.Header.Revision)
}

// revert puts the key back to update mode, even when ctx is done. Readers
// waiting only for this key see the rewrite and admit themselves.
func (u *upgrader) revert(ctx context.Context) {
	h := u.h
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	rec := record{Mode: Update.String(), Owner: h.l.owner}
	if _, err := h.l.cli.Txn(cctx).If(h.IsOwner()).
		Then(clientv3.OpPut(h.key, rec.encode(), clientv3.WithIgnoreLease())).Commit(); err != nil {
		// The key stays in write mode: new readers wait until Release or
		// the end of the session. Safe, but slow.
		h.l.log.Warn("lock: could not revert a cancelled upgrade; readers wait until release",
			"resource", h.resource, "key", h.key, "err", err)
	}
}

func (u *upgrader) conflict() *ConflictError {
	e := &ConflictError{Resource: u.h.resource, Mode: Write}
	for _, r := range u.drain {
		e.Blockers = append(e.Blockers, r.holder(false))
	}
	return e
}
