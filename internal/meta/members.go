package meta

// Cluster membership: the etcd members (voters and learners) and basalt's
// own node registry, which also holds the nodes that run no member (etcd
// clients of the voters).
//
//	nodes/<name>        Node: how to reach the node (api, s3, nbd, etcd urls)
//	alive/<name>        present while the node's lease is kept alive
//	jointokens/<sha256> a join token's hash, attached to a lease (its expiry)
//
// Why a registry beside etcd's member list: client nodes are no members,
// and a member's list entry says nothing about basalt's own endpoints.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

const (
	prefixNodes      = Prefix + "nodes/"
	prefixAlive      = Prefix + "alive/"
	prefixJoinTokens = Prefix + "jointokens/"
)

// Node roles.
const (
	RoleVoter   = "voter"   // a voting etcd member
	RoleLearner = "learner" // an etcd member catching up before its promotion
	RoleClient  = "client"  // no member: an etcd client of the voters
)

// Node is a basalt node of the cluster.
type Node struct {
	Schema int    `json:"schema"`
	Name   string `json:"name"`
	API    string `json:"api"` // https://host:port
	S3     string `json:"s3,omitempty"`
	NBD    string `json:"nbd,omitempty"`
	// Peer and Client are its etcd member's URLs (none for a client node).
	Peer     string    `json:"peer,omitempty"`
	Client   string    `json:"client,omitempty"`
	JoinedAt time.Time `json:"joined_at"`
	// Removing: `node remove` is taking the node out (its record goes
	// last); it is not to be given credentials again (Tx.Registered).
	Removing bool `json:"removing,omitempty"`
}

// Member is an etcd member as the member list shows it.
type Member struct {
	ID      uint64
	Name    string // empty until the member first starts
	Peers   []string
	Clients []string
	Learner bool
}

// Members lists the etcd members.
func (s *Store) Members(ctx context.Context) ([]Member, error) {
	var r *clientv3.MemberListResponse
	var err error
	only := wantsLinear(ctx)
	if only || !s.q.lost.Load() && !wantsStale(ctx) {
		timeout := linearTimeout
		if only {
			timeout = requestTimeout // no local answer to fall back on
		}
		lctx, cancel := context.WithTimeout(ctx, timeout)
		r, err = s.txnClient().MemberList(lctx)
		cancel()
		if err != nil && ctx.Err() == nil && unavailable(err) && !only {
			s.quorumLost()
		}
	}
	if r == nil && !only && (err == nil || unavailable(err)) {
		// No quorum (or a stale read asked for): this member's view.
		lctx, cancel := context.WithTimeout(ctx, requestTimeout)
		r, err = s.localCopy().MemberList(lctx, clientv3.WithSerializable())
		cancel()
		if err == nil {
			markLocal(ctx)
		}
	}
	if err != nil {
		return nil, wrap("member list", err)
	}
	out := make([]Member, 0, len(r.Members))
	for _, m := range r.Members {
		out = append(out, Member{ID: m.ID, Name: m.Name, Peers: m.PeerURLs, Clients: m.ClientURLs, Learner: m.IsLearner})
	}
	return out, nil
}

// AddLearner adds a non-voting member that will join with peerURL.
func (s *Store) AddLearner(ctx context.Context, peerURL string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	r, err := s.cli.MemberAddAsLearner(ctx, []string{peerURL})
	if errors.Is(err, rpctypes.ErrMemberNotFound) {
		// etcd derives a new member's id from its peer URLs and the
		// current second, and refuses an id it removed ("member not
		// found"): a member of this peer URL was removed within this
		// second (a half-joined node's, the node now asking again).
		// The next second gives another id.
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(time.Now().Truncate(time.Second).Add(time.Second))):
			r, err = s.cli.MemberAddAsLearner(ctx, []string{peerURL})
		}
	}
	if err != nil {
		if errors.Is(err, rpctypes.ErrTooManyLearners) || errors.Is(err, rpctypes.ErrGRPCTooManyLearners) {
			return 0, errs.Conflict(CodeJoinInProgress, "another node is joining (a learner is catching up); retry")
		}
		if errors.Is(err, rpctypes.ErrUnhealthy) || errors.Is(err, rpctypes.ErrGRPCUnhealthy) || strings.Contains(err.Error(), "unhealthy cluster") {
			// etcd adds a member only while enough voters are connected
			// (a voter promoted a moment ago may not be yet; one that is
			// down never will be: ErrVotersNotConnected tells callers).
			return 0, fmt.Errorf("%w: %w", ErrVotersNotConnected,
				errs.Conflict(CodeJoinInProgress, "the metadata cluster is not ready for a new member (a voter is not connected yet); retry"))
		}
		return 0, wrap("add learner", err)
	}
	return r.Member.ID, nil
}

// ErrVotersNotConnected: etcd refused a new member because too few voters
// have been connected for a while (AddLearner). A voter promoted moments
// ago soon is; a voter that is down is not until it is back or removed.
var ErrVotersNotConnected = errors.New("too few voters connected to add a member")

// ErrNotCaughtUp: a learner is not in sync with the leader yet.
var ErrNotCaughtUp = errors.New("learner has not caught up with the leader yet")

// Promote makes learner id a voter; ErrNotCaughtUp until it is in sync.
// A member that is a voter already is a success: the node was promoted
// but crashed before it recorded that, and asks again at its next start.
// (The client hands etcd's errors back as rpctypes.EtcdError values, which
// errors.Is tells apart; their texts are prefixes of one another.)
func (s *Store) Promote(ctx context.Context, id uint64) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, err := s.cli.MemberPromote(ctx, id)
	switch {
	case errors.Is(err, rpctypes.ErrMemberNotLearner):
		return nil
	case errors.Is(err, rpctypes.ErrMemberLearnerNotReady):
		return ErrNotCaughtUp
	}
	return wrap("promote", err)
}

// RemoveMember removes etcd member id.
func (s *Store) RemoveMember(ctx context.Context, id uint64) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := s.cli.MemberRemove(ctx, id)
	if err != nil {
		return wrap("remove member", err)
	}
	// The requests that follow (the node's registration, its identity)
	// should not meet the removed member, which answers "raft: stopped"
	// until it shuts down: the answer lists the members left. Their
	// voters, as the client's own endpoint sync picks them: a learner
	// (a node joining) refuses writes, watches and linearizable reads,
	// and serves serializable ones from a copy that may lag far behind;
	// a member not started yet (no name) has no client URL.
	var urls []string
	for _, m := range resp.Members {
		if m.Name != "" && !m.IsLearner {
			urls = append(urls, m.ClientURLs...)
		}
	}
	if len(urls) > 0 {
		s.cli.SetEndpoints(urls...)
	}
	return nil
}

// Sync refreshes the client's endpoints from the member list (after a
// promotion or a removal).
func (s *Store) Sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	return wrap("sync endpoints", s.cli.Sync(ctx))
}

// CodeJoinInProgress: a join is already under way (409); retry.
const CodeJoinInProgress = "JoinInProgress"

// CheckNodeName refuses a node name that cannot be one: empty, or with a
// character that a metadata key ('/', NUL) or etcd's member list ("name=
// peerURL,...": ',', '=', white space) cannot hold.
func CheckNodeName(name string) error {
	if !validKeyPart(name) || strings.ContainsAny(name, ",= \t\n") {
		return errs.Invalid(errs.CodeInvalidName, "node name %q: required, without '/', ',', '=' or spaces", name)
	}
	return nil
}

// PutNode registers (or updates) a node.
func (s *Store) PutNode(ctx context.Context, n *Node) error {
	if err := CheckNodeName(n.Name); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	n.Schema = SchemaVersion
	_, err := s.cli.Put(ctx, prefixNodes+n.Name, encode(n))
	return wrap("register node", err)
}

// Registered reports whether node name has a record (nodes/<name>) that
// is not being removed; the commit requires the record still as read.
func (tx *Tx) Registered(name string) (bool, error) {
	n := &Node{}
	ok, err := txGet(tx, prefixNodes+name, n)
	return ok && !n.Removing, err
}

// Node reads a node's record; nil when absent.
func (tx *Tx) Node(name string) (*Node, error) {
	n := &Node{}
	ok, err := txGet(tx, prefixNodes+name, n)
	if !ok || err != nil {
		return nil, err
	}
	return n, nil
}

// PutNode writes a node's record.
func (tx *Tx) PutNode(n *Node) error {
	if err := CheckNodeName(n.Name); err != nil {
		return err
	}
	n.Schema = SchemaVersion
	tx.stm.Put(prefixNodes+n.Name, encode(n))
	return nil
}

// Node returns a node, or a NotFound error.
func (s *Store) Node(ctx context.Context, name string) (*Node, error) {
	n := &Node{}
	if err := s.get(ctx, prefixNodes+name, n); err != nil {
		if errors.Is(err, errAbsent) {
			return nil, errs.NotFound("node", name)
		}
		return nil, err
	}
	return n, nil
}

// Nodes lists the registered nodes by name.
func (s *Store) Nodes(ctx context.Context) ([]*Node, error) {
	return list(ctx, s, prefixNodes, func() *Node { return &Node{} })
}

// DeleteNode removes a node's registration and liveness key.
func (s *Store) DeleteNode(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, err := s.cli.Txn(ctx).Then(clientv3.OpDelete(prefixNodes+name), clientv3.OpDelete(prefixAlive+name)).Commit()
	return wrap("delete node", err)
}

// aliveTTL is how long a node counts as alive after its last lease renewal.
const aliveTTL = 5

// KeepAlive keeps node name's liveness key until ctx ends: a lease of
// aliveTTL seconds, renewed by the client, re-created after it expired
// (a partition longer than the TTL).
func (s *Store) KeepAlive(ctx context.Context, name string) {
	for ctx.Err() == nil {
		if err := s.keepAlive(ctx, name); ctx.Err() == nil {
			s.log.Warn("liveness lease lost; renewing", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (s *Store) keepAlive(ctx context.Context, name string) error {
	cli := s.leaseClient()
	gctx, cancel := context.WithTimeout(ctx, requestTimeout)
	lease, err := cli.Grant(gctx, aliveTTL)
	if err == nil {
		_, err = cli.Put(gctx, prefixAlive+name, time.Now().UTC().Format(time.RFC3339), clientv3.WithLease(lease.ID))
	}
	cancel()
	if err != nil {
		return err
	}
	ch, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		return err
	}
	for range ch {
		// Renewals; the channel closes when the lease is lost.
	}
	if ctx.Err() != nil {
		// Shutting down: let the others know at once.
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s.cli.Revoke(rctx, lease.ID)
		cancel()
	}
	return errors.New("keepalive channel closed")
}

// Alive returns the names of the nodes whose liveness key exists.
func (s *Store) Alive(ctx context.Context) (map[string]bool, error) {
	r, err := s.read(ctx, prefixAlive, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, wrap("liveness", err)
	}
	out := map[string]bool{}
	for _, kv := range r.Kvs {
		out[strings.TrimPrefix(string(kv.Key), prefixAlive)] = true
	}
	return out, nil
}

// WatchNodesGone calls fn with the name of every node whose liveness key
// is deleted — its lease expired, it stopped, or it was removed — until
// ctx ends. A deletion while the watch is broken is missed: callers also
// look at Alive now and then.
func (s *Store) WatchNodesGone(ctx context.Context, fn func(name string)) {
	for ctx.Err() == nil {
		wch := s.cli.Watch(clientv3.WithRequireLeader(ctx), prefixAlive, clientv3.WithPrefix(), clientv3.WithFilterPut())
		for resp := range wch {
			for _, ev := range resp.Events {
				fn(strings.TrimPrefix(string(ev.Kv.Key), prefixAlive))
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func tokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// PutJoinToken stores a join token's hash, valid for ttl.
func (s *Store) PutJoinToken(ctx context.Context, token string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	lease, err := s.cli.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return wrap("join token", err)
	}
	_, err = s.cli.Put(ctx, prefixJoinTokens+tokenHash(token), time.Now().Add(ttl).UTC().Format(time.RFC3339), clientv3.WithLease(lease.ID))
	return wrap("join token", err)
}

// RevokeJoinToken deletes token before it expires; false if it was not
// there (never issued, expired or revoked already).
func (s *Store) RevokeJoinToken(ctx context.Context, token string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	r, err := s.cli.Delete(ctx, prefixJoinTokens+tokenHash(token), clientv3.WithPrevKV())
	if err != nil {
		return false, wrap("revoke join token", err)
	}
	// A key past its expiry (kept by a lease that a leader change
	// renewed: JoinTokenValid) is a token expired already.
	return len(r.PrevKvs) == 1 && joinTokenLive(r.PrevKvs[0].Value, time.Now()), nil
}

// JoinTokenValid reports whether token was issued and has not expired.
//
// The key's lease is not enough to tell: etcd restarts the TTL of every
// lease at each leader change (and at a restart of the cluster), so a
// token's key outlives its expiry by up to a whole TTL per election —
// a 1 h token could be used for days. The expiry recorded in the key is
// the one the token was issued with, and it decides.
func (s *Store) JoinTokenValid(ctx context.Context, token string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	r, err := s.cli.Get(ctx, prefixJoinTokens+tokenHash(token))
	if err != nil {
		return false, wrap("join token", err)
	}
	if len(r.Kvs) != 1 {
		return false, nil
	}
	return joinTokenLive(r.Kvs[0].Value, time.Now()), nil
}

// joinTokenLive reports whether a join token key's value, the token's
// expiry (RFC 3339), is still ahead of now. A value that is no time
// counts as expired: a token is refused rather than trusted for ever.
func joinTokenLive(value []byte, now time.Time) bool {
	exp, err := time.Parse(time.RFC3339, string(value))
	return err == nil && now.Before(exp)
}

// MemberID is the id of this node's embedded member (0: none).
func (s *Store) MemberID() uint64 {
	m := s.mem.Load()
	if m == nil {
		return 0
	}
	return uint64(m.e.Server.MemberID())
}

func (n *Node) schema() int { return n.Schema }

// Cluster returns the cluster record.
func (s *Store) Cluster(ctx context.Context) (*Cluster, error) {
	c := &Cluster{}
	if err := s.get(ctx, keyCluster, c); err != nil {
		if errors.Is(err, errAbsent) {
			return nil, errs.NotFound("cluster", "record")
		}
		return nil, err
	}
	if c.Voters == 0 {
		c.Voters = 3
	}
	return c, nil
}

// WithJoinLock runs fn while holding the cluster's join lock, so that joins
// (member additions and promotions decisions) happen one at a time. The
// lock lives on a lease: a node that dies holding it frees it. A lock
// that another change holds for longer than a request waits fails with
// CodeJoinInProgress (409, retry).
func (s *Store) WithJoinLock(ctx context.Context, fn func() error) error {
	// The session's lease is granted here, under the write timeout: left
	// to NewSession, the grant waits as long as ctx lets it, which for a
	// caller without a deadline is for ever while no quorum answers.
	gctx, cancel := context.WithTimeout(ctx, s.writeTimeout())
	lease, err := s.cli.Grant(gctx, 10)
	cancel()
	if err != nil {
		if ctx.Err() == nil && unavailable(err) {
			s.quorumLost()
		}
		return wrap("join lock", err)
	}
	sess, err := concurrency.NewSession(s.cli, concurrency.WithLease(lease.ID), concurrency.WithContext(ctx))
	if err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s.cli.Revoke(rctx, lease.ID)
		cancel()
		return wrap("join lock", err)
	}
	defer sess.Close()
	mu := concurrency.NewMutex(sess, Prefix+"joinlock")
	lctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if err := mu.Lock(lctx); err != nil {
		// Out of time while the quorum answers: the wait was for another
		// holder (a removal retrying its steps through an election, a
		// slow join), not for etcd. Say so — a joining node waits a
		// join in progress out — rather than that no quorum answered.
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && s.Health(ctx) == nil {
			return errs.Conflict(CodeJoinInProgress, "another membership change (a join, a step-up or a removal) still holds the join lock; retry")
		}
		return wrap("join lock", err)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		mu.Unlock(uctx)
		cancel()
	}()
	return fn()
}
