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
	// answered is when a request that needs the quorum (a linearizable
	// read, a transaction) last succeeded here, in Unix nanoseconds.
	answered atomic.Int64
}

// quorumAnswered records that a request that needs the quorum succeeded.
func (s *Store) quorumAnswered() { s.q.answered.Store(time.Now().UnixNano()) }

// quorumLost records that a request found no quorum, and starts the probe
// that clears it — unless the quorum is seen to work (quorumSeen): then
// the request was slow, not unanswered, and the flag would only turn
// every other request on this node stale or short for nothing. It
// reports whether the quorum counts as lost.
func (s *Store) quorumLost() bool {
	if s.quorumSeen() {
		s.log.Debug("a metadata request ran out of time while a leader serves: slow, not without quorum")
		return false
	}
	if s.q.lost.CompareAndSwap(false, true) {
		s.log.Warn("metadata quorum lost: reads are served from the local copy, writes fail")
		go s.probeQuorum()
	}
	return true
}

// quorumSeen reports whether the quorum is seen to work although a
// request timed out: this node's own member is a voter that knows a
// leader, and another request that needed the quorum succeeded here
// within linearTimeout. Under load — a burst of deletes — some requests
// time out while others go through; the quorum stands. Both signs are
// needed. A leader known alone is not enough: etcd updates it in the
// member's Raft loop, which a hung disk stops (the old leader stays
// known, nothing commits), and a follower cut off with its leader forgets
// that leader only an election timeout or two after the leader stepped
// down (CheckQuorum), up to about 4 s. Answers alone are not enough either:
// they come from before the request that timed out. A learner never
// forgets its leader and a client node has no member: for them a timeout
// counts as no quorum.
func (s *Store) quorumSeen() bool {
	m, serves, learner := s.ownMember()
	if !serves || learner || m.e.Server.Leader() == 0 {
		return false
	}
	return time.Since(time.Unix(0, s.q.answered.Load())) < linearTimeout
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
// itself was live, lost its connection, or etcd said Unavailable, and the
// quorum is not seen to work (quorumSeen) — and if so records the quorum
// lost as the store's own calls do, so that the next requests say so at
// once. The call must have been bounded only by
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
