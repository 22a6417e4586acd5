package volume

// Workflow locks: the seed's read/update/write modes (package lock), taken
// on a volume or snapshot for the length of a workflow call, so that
// workflows started through different nodes do not interleave:
//
//	snapshot create      update on the volume   (readers go on; no second snapshot,
//	                                             no delete, no extend meanwhile)
//	flatten/repair/scrub update on the volume   (while the job is recorded)
//	volume extend        write on the volume
//	volume delete        write on the volume    (or none when nobody holds or waits
//	                                             for the lock: see DeleteVolume)
//	clone                read on the snapshot
//	snapshot export      read on the snapshot   (while the job is recorded)
//	snapshot delete      write on the snapshot
//
// A call waits up to lockWait for a conflicting workflow to finish, then
// fails with 409 VolumeBusy naming the holder. The locks live on this
// node's etcd session: a node that dies frees them after the session TTL.
//
// Fencing: the transaction that records a workflow's decision (the
// snapshot in creating, the job, the extend, the delete) checks its lock
// (workflowLock.check, meta.Tx.Holds), so it commits only while the lock is
// held. A node whose session expired under it — partitioned, paused longer
// than the TTL — cannot then record a workflow that a successor holding
// the lock now excludes. The later steps of a recorded workflow are steps
// of its persisted state machine (decision 0003), which recovery may run
// without the lock; each checks the record it moves on.

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/lock"
	"github.com/basalt-storage/basalt/internal/meta"
)

// lockWait bounds how long a workflow waits for a conflicting one.
var lockWait = 10 * time.Second

// lockTTL is how long a dead node's workflow locks outlive it.
const lockTTL = 10

// locker returns the node's Locker, on a live session.
func (s *Service) locker(ctx context.Context) (*lock.Locker, error) {
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	if s.lockr != nil {
		select {
		case <-s.lockr.Done():
			s.lockr = nil // expired (partition): a new one
		default:
			return s.lockr, nil
		}
	}
	gctx, cancel := context.WithTimeout(ctx, lockWait)
	defer cancel()
	l, err := lock.Open(gctx, s.meta.Client(), meta.LocksPrefix, lockTTL, lock.Options{Owner: s.cfg.Node, Log: s.log})
	if err != nil {
		return nil, errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable, "workflow locks: %v", err)
	}
	s.lockr = l
	return l, nil
}

// lockedVolume resolves a volume the caller may see and takes its workflow
// lock in mode; call unlock when the workflow call ends.
func (s *Service) lockedVolume(ctx context.Context, c Caller, ref string, mode lock.Mode) (*meta.Volume, *workflowLock, error) {
	v, err := s.resolveVolume(ctx, c, ref)
	if err != nil {
		return nil, nil, err
	}
	wl, err := s.lockFor(ctx, "volume", v.ID, mode)
	if err != nil {
		return nil, nil, err
	}
	return v, wl, nil
}

// lockedSnapshot is lockedVolume for a snapshot.
func (s *Service) lockedSnapshot(ctx context.Context, c Caller, ref string, mode lock.Mode) (*meta.Snapshot, *workflowLock, error) {
	sn, err := s.resolveSnapshot(ctx, c, ref)
	if err != nil {
		return nil, nil, err
	}
	wl, err := s.lockFor(ctx, "snapshot", sn.ID, mode)
	if err != nil {
		return nil, nil, err
	}
	return sn, wl, nil
}

// workflowLock is a workflow's granted lock.
type workflowLock struct {
	what string // "volume vol-…"
	held *lock.Held
}

// check fails unless the lock is still held at the commit of tx (see the
// file comment). A nil lock checks nothing: the delete without a lock
// proves the queue empty instead.
func (wl *workflowLock) check(tx *meta.Tx) error {
	if wl == nil || tx.Holds(wl.held.Key(), wl.held.Token()) {
		return nil
	}
	return errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
		"workflow lock on %s was lost (this node's metadata session ended: a partition or a long pause); nothing was recorded; retry", wl.what)
}

// unlock releases the lock. A failed release is retried by the lock
// package, which logs it.
func (wl *workflowLock) unlock() {
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = wl.held.Release(rctx)
}

// testHookLocked, when set, runs after a workflow lock is granted (tests
// make the lock lost there).
var testHookLocked func(*lock.Held)

// lockFor takes kind/id (e.g. "volume", "vol-…") in mode for a workflow.
func (s *Service) lockFor(ctx context.Context, kind, id string, mode lock.Mode) (*workflowLock, error) {
	noQuorum := func() error {
		return errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"workflow lock on %s %s: no quorum of the metadata cluster answers; retry when a majority of the voters is up", kind, id)
	}
	if s.meta.QuorumLost() {
		return nil, noQuorum() // taking a lock is a write
	}
	l, err := s.locker(ctx)
	if err != nil {
		return nil, err
	}
	resource := kind + "/" + id
	wctx, cancel := context.WithTimeout(ctx, lockWait)
	defer cancel()
	h, err := l.Acquire(wctx, resource, mode)
	if err != nil {
		if s.meta.QuorumLost() {
			return nil, noQuorum() // the wait was etcd's, not a holder's
		}
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			var who []string
			if q, qerr := l.Queue(ctx, resource); qerr == nil {
				for _, b := range q {
					if !b.Waiting {
						who = append(who, b.String())
					}
				}
			}
			return nil, errs.Conflict(errs.CodeVolumeBusy, "%s %s is busy with another workflow (%s); retry", kind, id, strings.Join(who, ", "))
		}
		return nil, errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable, "workflow lock on %s %s: %v", kind, id, err)
	}
	if testHookLocked != nil {
		testHookLocked(h)
	}
	return &workflowLock{what: kind + " " + id, held: h}, nil
}
