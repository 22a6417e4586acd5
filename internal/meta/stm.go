package meta

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Software transactional memory over etcd: what Update runs a Tx on.
//
// A transaction reads keys one at a time, buffers its writes, and commits
// them in one etcd Txn whose comparisons require every key it read to be
// unchanged (same mod revision, or still absent) — so a committed
// transaction is equivalent to running whole at its commit revision, which
// is later than every write acknowledged before it started: serializable
// and linearizable whatever revision its reads came from.
//
// That freedom is what the first attempt uses: it reads from the node's own
// member without asking the leader (serializable reads, no ReadIndex round
// through a quorum), betting that the local copy is current — it almost
// always is, by milliseconds. When the bet loses, the commit's comparisons
// fail and nothing is written. What the bet cannot decide alone is an
// error: a transaction that finds a volume missing, or a name taken, may
// have read a copy that lags a write acknowledged a moment ago through
// another node. So an attempt that fails — an error from fn or a failed
// commit — is run again in the careful mode of etcd's own STM: the first
// read linearizable (it waits for the leader's commit index), every later
// read at that read's revision (one snapshot), and the function's verdict
// from that run is final.
//
// On a follower's node the first attempt also starts a linearizable read
// of its own (the barrier) and commits only once that read has answered.
// A follower's commit is a proposal it forwards to the leader: right after
// the leader dies, and before the followers notice (an election timeout),
// such a proposal is lost and its request fails after etcd's request
// timeout, outcome unknown. A linearizable read instead waits out the
// election (etcd retries a ReadIndex until a leader answers), so a commit
// that follows it goes to a live leader — as in careful mode, where the
// first read plays that part, but here the barrier's round trip overlaps
// the transaction's own reads. On the leader's node reads and proposals are
// local and need no barrier; a node without a voting member of its own
// (a learner or an etcd client) runs careful attempts only.
//
// Invariants:
//   - A transaction commits only if every key it read is unchanged at the
//     commit revision and every prefix it found empty is still empty; keys
//     written without being read must not have changed since the oldest
//     read (as in etcd's SerializableSnapshot).
//   - An error returned by fn reaches the caller only from a careful run.
//   - Reads fail by panicking with stmError (fn's signature has no error
//     for them); attempt recovers it.

// attemptMode is how a transaction's first attempt reads (later ones are
// careful).
type attemptMode int

const (
	modeCareful    attemptMode = iota // linearizable first read, then one snapshot
	modeOptimistic                    // local reads (the leader's node)
	modeBarrier                       // local reads; the commit waits for a linearizable read (a follower's node)
)

// stm is one attempt of a transaction.
type stm struct {
	ctx     context.Context
	cli     *clientv3.Client
	careful bool
	gate    <-chan error                // barrier: the commit waits for it (nil: none)
	rev     int64                       // careful: the revision every read after the first is at
	first   int64                       // the oldest header revision among the reads (0: none yet)
	rset    map[string]*mvccpb.KeyValue // nil value: read as absent
	wset    map[string]clientv3.Op
	wval    map[string]string // what Get returns for a written key ("" deleted)
	empty   []string          // prefixes found empty, required empty at commit
	// committed is the revision of a successful commit; changed, the
	// keys it changed (every put, every deletion of a key that existed):
	// those a watch reports at that revision.
	committed int64
	changed   []string
}

type stmError struct{ err error }

func newSTM(ctx context.Context, cli *clientv3.Client, careful bool) *stm {
	return &stm{ctx: ctx, cli: cli, careful: careful, rset: map[string]*mvccpb.KeyValue{},
		wset: map[string]clientv3.Op{}, wval: map[string]string{}}
}

// Get returns key's value ("" when absent), this transaction's own write
// first.
func (s *stm) Get(key string) string {
	if v, ok := s.wval[key]; ok {
		return v
	}
	if kv, ok := s.rset[key]; ok {
		return kvValue(kv)
	}
	resp := s.read(key)
	var kv *mvccpb.KeyValue
	if len(resp.Kvs) > 0 {
		kv = resp.Kvs[0]
	}
	s.rset[key] = kv
	return kvValue(kv)
}

// CreateRevision returns the revision that created key (0 when absent),
// recorded as a read like Get: the commit then requires the key unchanged.
// key must not be one the transaction writes.
func (s *stm) CreateRevision(key string) int64 {
	s.Get(key)
	if kv := s.rset[key]; kv != nil {
		return kv.CreateRevision
	}
	return 0
}

// Empty reports whether no key starts with prefix; if none does, the
// commit requires that none does then either.
func (s *stm) Empty(prefix string) bool {
	if resp := s.read(prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); resp.Count > 0 {
		return false
	}
	s.empty = append(s.empty, prefix)
	return true
}

// read is one Get in the attempt's mode.
func (s *stm) read(key string, opts ...clientv3.OpOption) *clientv3.GetResponse {
	switch {
	case !s.careful:
		opts = append(opts, clientv3.WithSerializable())
	case s.rev != 0:
		opts = append(opts, clientv3.WithRev(s.rev), clientv3.WithSerializable())
	}
	resp, err := s.cli.Get(s.ctx, key, opts...)
	if err != nil {
		panic(stmError{err})
	}
	if s.careful && s.rev == 0 {
		s.rev = resp.Header.Revision
	}
	if s.first == 0 || resp.Header.Revision < s.first {
		s.first = resp.Header.Revision
	}
	return resp
}

func kvValue(kv *mvccpb.KeyValue) string {
	if kv == nil {
		return ""
	}
	return string(kv.Value)
}

// Put buffers a write.
func (s *stm) Put(key, val string) {
	s.wset[key], s.wval[key] = clientv3.OpPut(key, val), val
}

// Del buffers a deletion.
func (s *stm) Del(key string) {
	s.wset[key], s.wval[key] = clientv3.OpDelete(key), ""
}

// commit applies the writes if the reads still hold; false when they did
// not (nothing was written).
func (s *stm) commit() (bool, error) {
	cmps := make([]clientv3.Cmp, 0, len(s.rset)+len(s.wset))
	for k, kv := range s.rset {
		var mod int64
		if kv != nil {
			mod = kv.ModRevision
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", mod))
	}
	for _, p := range s.empty {
		// Over a range, etcd requires every key to compare true: no key
		// has a create revision of 0, and an empty range passes.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(p), "=", 0).WithPrefix())
	}
	ops := make([]clientv3.Op, 0, len(s.wset))
	keys := make([]string, 0, len(s.wset)) // keys[i] is the key of ops[i]
	for k, op := range s.wset {
		if _, read := s.rset[k]; !read && s.first != 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "<", s.first+1))
		}
		ops, keys = append(ops, op), append(keys, k)
	}
	if s.gate != nil {
		if err := <-s.gate; err != nil {
			return false, err
		}
	}
	resp, err := s.cli.Txn(s.ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, err
	}
	if resp.Succeeded {
		s.committed = resp.Header.Revision
		for i, r := range resp.Responses {
			// Deleting an absent key changes nothing.
			if d := r.GetResponseDeleteRange(); d == nil || d.Deleted > 0 {
				s.changed = append(s.changed, keys[i])
			}
		}
	}
	return resp.Succeeded, nil
}

// attempt runs fn once and commits. It returns fn's own error, or etcd's
// (a read or the commit failed), or committed false when the commit found
// a read no longer current (nothing was written).
func (s *stm) attempt(fn func(*Tx) error) (committed bool, fnErr, etcdErr error) {
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(stmError)
			if !ok {
				panic(r)
			}
			committed, fnErr, etcdErr = false, nil, e.err
		}
	}()
	if err := fn(&Tx{stm: s}); err != nil {
		return false, err, nil
	}
	committed, etcdErr = s.commit()
	return committed, nil, etcdErr
}

// runSTM runs fn until it commits, or a careful attempt returns fn's error,
// or etcd fails. The first attempt runs in mode, the others carefully.
func runSTM(ctx context.Context, cli *clientv3.Client, mode attemptMode, fn func(*Tx) error) error {
	for attempt := 0; ; attempt++ {
		s := newSTM(ctx, cli, attempt > 0 || mode == modeCareful)
		if attempt == 0 && mode == modeBarrier {
			gate := make(chan error, 1)
			go func() {
				_, err := cli.Get(ctx, keyCluster, clientv3.WithCountOnly())
				gate <- err
			}()
			s.gate = gate
		}
		committed, fnErr, etcdErr := s.attempt(fn)
		switch {
		case committed:
			return nil
		case fnErr != nil && s.careful:
			return fnErr
		case etcdErr != nil && !errors.Is(etcdErr, rpctypes.ErrFutureRev) && !errors.Is(etcdErr, rpctypes.ErrCompacted):
			// Unavailable, timed out, cancelled: the caller's timeout and
			// quorum tracking deal with it. (A read at a revision the
			// member has not applied yet, which only a client node without
			// a member of its own meets, is worth another attempt; so is
			// one at a revision compacted away since the attempt's first
			// read — a defrag compacts up to the current revision — as
			// the next attempt reads at a new one.)
			return etcdErr
		case ctx.Err() != nil:
			return ctx.Err()
		}
	}
}
