package meta

import (
	"context"
	"sync/atomic"
	"time"
)

// Quorum tracking: once a request finds that no quorum answers, the store
// says so at once instead of making every request wait out its timeout —
// reads are served from the local copy (serializable) and writes fail
// after lostWriteTimeout — until a background probe sees a quorum again.

// lostWriteTimeout bounds a write while the quorum is known lost: long
// enough for a leader election to end, short enough not to hang clients.
const lostWriteTimeout = 3 * time.Second

type quorum struct {
	lost atomic.Bool
}

// quorumLost records that a request found no quorum, and starts the probe
// that clears it — unless this node's own voting member follows a leader
// (leaderSeen): then the request was slow, not unanswered, and the flag
// would only turn every other request on this node stale or short for
// nothing. It reports whether the quorum counts as lost.
func (s *Store) quorumLost() bool {
	if s.leaderSeen() {
		s.log.Debug("a metadata request ran out of time while a leader serves: slow, not without quorum")
		return false
	}
	if s.q.lost.CompareAndSwap(false, true) {
		s.log.Warn("metadata quorum lost: reads are served from the local copy, writes fail")
		go s.probeQuorum()
	}
	return true
}

// leaderSeen reports whether this node's own member is a voter that knows
// a leader now. etcd runs Raft with CheckQuorum (a leader that has not
// heard from a quorum for an election timeout steps down) and PreVote (a
// follower that has not heard from its leader for an election timeout
// forgets it), so a voter that knows a leader at the end of a request that
// waited longer than an election timeout (linearTimeout, writeTimeout) is
// in a cluster whose quorum stands: under load — a burst of deletes, a
// slow disk — requests time out with the quorum intact. A learner never
// forgets its leader and a client node has no member: for them a timeout
// still counts as no quorum.
func (s *Store) leaderSeen() bool {
	m, serves, learner := s.ownMember()
	return serves && !learner && m.e.Server.Leader() != 0
}

// probeQuorum asks this node's own member when there is one: the shared
// client may sit in a reconnection backoff towards members it could not
// reach, and would notice the healed quorum seconds late.
func (s *Store) probeQuorum() {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := s.txnClient().Get(ctx, keyCluster)
		cancel()
		if err == nil {
			s.q.lost.Store(false)
			s.log.Info("metadata quorum back")
			return
		}
		select {
		case <-s.closed:
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// QuorumLost reports whether this node last found no quorum of the
// metadata cluster answering (and has not seen one since): writes will
// fail, so a caller about to wait on etcd for something else (a workflow
// lock) can say so at once.
func (s *Store) QuorumLost() bool { return s.q.lost.Load() }

// NoQuorum is quorum tracking for calls made on Client() directly (the
// workflow locks): it reports whether err, from such a call made under
// ctx, says that no quorum answered — the call ran out of time while ctx
// itself was live, lost its connection, or etcd said Unavailable, and this
// node's member sees no leader (leaderSeen) — and if so records the quorum lost as the store's own calls do, so that the
// next requests say so at once. The call must have been bounded only by
// how long etcd may take to answer, not by a wait for something else (a
// lock's holder): its deadline would read as no quorum.
func (s *Store) NoQuorum(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || !unavailable(err) {
		return false
	}
	return s.quorumLost()
}

// writeTimeout bounds a write.
func (s *Store) writeTimeout() time.Duration {
	if s.q.lost.Load() {
		return lostWriteTimeout
	}
	return requestTimeout
}
