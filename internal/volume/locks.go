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
// fails with 409 VolumeBusy naming the holder — or with 503
// MetadataUnavailable once this node finds that no quorum of the metadata
// cluster answers (see lockFor). The locks live on this node's etcd
// session: a node that dies frees them after the session TTL.
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

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/lock"
	"github.com/basalt-storage/basalt/internal/meta"
)

// lockWait bounds how long a workflow waits for a conflicting one.
var lockWait = 10 * time.Second

// queueTimeout bounds the read of a lock's queue that names the holders a
// wait timed out behind: as long as the store waits for a linearizable
// read before it calls the quorum lost.
const queueTimeout = 3 * time.Second

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
		s.meta.NoQuorum(ctx, err) // the grant is bounded only by etcd's answer
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

// quorumPoll is how often a lock wait looks whether this node has found
// the metadata quorum lost meanwhile.
const quorumPoll = 200 * time.Millisecond

// lockFor takes kind/id (e.g. "volume", "vol-…") in mode for a workflow.
//
// The lock package talks to etcd on the raw client, so a wait for a
// holder does not itself tell the store that no quorum answers: the watch
// it sleeps on may stay quiet (or end with the leader, and the read that
// follows waits out the deadline), and its withdrawal from the queue waits
// out its own timeout. The wait therefore also ends, with 503 MetadataUnavailable, as
// soon as the store finds the quorum lost (QuorumLost, set by any request
// of this node); Acquire runs on in the background until it has left the
// queue, and a lock it was granted meanwhile is released.
func (s *Service) lockFor(ctx context.Context, kind, id string, mode lock.Mode) (*workflowLock, error) {
	noQuorum := func(cause error) error {
		why := ""
		if cause != nil {
			why = " (" + cause.Error() + ")"
		}
		return errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"workflow lock on %s %s: no quorum of the metadata cluster answers%s; retry when a majority of the voters is up", kind, id, why)
	}
	if s.meta.QuorumLost() {
		return nil, noQuorum(nil) // taking a lock is a write
	}
	resource := kind + "/" + id
	wctx, cancel := context.WithTimeout(ctx, lockWait)
	defer cancel() // also ends an Acquire left behind
	var l *lock.Locker
	var h *lock.Held
	var err error
	for attempt := 0; ; attempt++ {
		if l, err = s.locker(ctx); err != nil {
			return nil, err
		}
		var quorumLost bool
		if h, quorumLost, err = s.acquire(wctx, l, resource, mode); quorumLost {
			return nil, noQuorum(nil)
		}
		// A session that ended while this node was cut off or paused
		// for longer than its TTL is found out by its keepalives only
		// a while later: until then every request queued on it is
		// refused (its lease is gone), and a workflow was answered 503
		// MetadataUnavailable although the metadata cluster was fine.
		// Nothing was queued then: queue again, once, on a new session.
		if err != nil && attempt == 0 && ctx.Err() == nil && sessionGone(l, err) {
			s.dropLocker(l)
			continue
		}
		break
	}
	if err != nil {
		switch {
		case s.meta.QuorumLost():
			return nil, noQuorum(nil) // the wait was etcd's, not a holder's
		case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			return nil, s.busy(ctx, l, kind, id)
		case s.meta.NoQuorum(ctx, err):
			return nil, noQuorum(err)
		}
		return nil, errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable, "workflow lock on %s %s: %v", kind, id, err)
	}
	if testHookLocked != nil {
		testHookLocked(h)
	}
	return &workflowLock{what: kind + " " + id, held: h}, nil
}

// acquire takes resource in mode through l, waiting until wctx ends,
// and returns the lock or Acquire's error — or quorumLost, when this node
// found the metadata quorum lost meanwhile: Acquire then runs on in the
// background until it has left the queue, and a lock it was granted
// meanwhile is released.
func (s *Service) acquire(wctx context.Context, l *lock.Locker, resource string, mode lock.Mode) (h *lock.Held, quorumLost bool, err error) {
	type result struct {
		h   *lock.Held
		err error
	}
	res := make(chan result, 1)
	go func() {
		h, err := l.Acquire(wctx, resource, mode)
		res <- result{h, err}
	}()
	// leave hands the Acquire over to the background: its withdrawal from
	// the queue may take its own timeout while etcd does not answer.
	leave := func() {
		go func() {
			if r := <-res; r.err == nil {
				(&workflowLock{held: r.h}).unlock()
			}
		}()
	}
	tick := time.NewTicker(quorumPoll)
	defer tick.Stop()
	for {
		select {
		case r := <-res:
			return r.h, false, r.err
		case <-wctx.Done():
			select {
			case r := <-res: // Acquire finished meanwhile: its answer stands
				return r.h, false, r.err
			default:
				leave()
				return nil, false, wctx.Err()
			}
		case <-tick.C:
			if s.meta.QuorumLost() {
				leave()
				return nil, true, nil
			}
		}
	}
}

// sessionGone reports whether err, the failure of a request queued on l,
// says that l's session has ended: its lease is gone from the metadata
// cluster (expired while this node was cut off or paused), or l found its
// session ended (lock.ErrLost, Done closed). Nothing of the request is
// left in the queue then.
func sessionGone(l *lock.Locker, err error) bool {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || strings.Contains(err.Error(), "requested lease not found") {
		return true
	}
	select {
	case <-l.Done():
		return errors.Is(err, lock.ErrLost)
	default:
		return false
	}
}

// dropLocker forgets l, whose session has ended, so that the next lock is
// taken on a new session, and closes it (its keepalives stop; the revoke
// of its lease, already gone, is not waited for).
func (s *Service) dropLocker(l *lock.Locker) {
	s.lockMu.Lock()
	if s.lockr == l {
		s.lockr = nil
	}
	s.lockMu.Unlock()
	go l.Close()
}

// busy is the answer to a lock wait that ran out: 409 VolumeBusy naming the
// holders. The queue is read under queueTimeout (the caller's context may
// have no deadline); when etcd does not answer that read either, the wait
// was most likely etcd's too, and the answer is 503 MetadataUnavailable.
func (s *Service) busy(ctx context.Context, l *lock.Locker, kind, id string) error {
	qctx, cancel := context.WithTimeout(ctx, queueTimeout)
	q, err := l.Queue(qctx, kind+"/"+id)
	cancel()
	if err != nil {
		if s.meta.NoQuorum(ctx, err) {
			return errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
				"workflow lock on %s %s: waited %v, and then no quorum of the metadata cluster answered the read of who holds it (%v); retry when a majority of the voters is up",
				kind, id, lockWait, err)
		}
		return errs.Conflict(errs.CodeVolumeBusy, "%s %s is busy with another workflow (holders unknown: %v); retry", kind, id, err)
	}
	var who []string
	for _, b := range q {
		if !b.Waiting {
			who = append(who, b.String())
		}
	}
	return errs.Conflict(errs.CodeVolumeBusy, "%s %s is busy with another workflow (%s); retry", kind, id, strings.Join(who, ", "))
}
