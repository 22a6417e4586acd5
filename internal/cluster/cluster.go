// Package cluster is basalt's membership: nodes joining a running cluster,
// the node list with roles and health, node removal and join tokens.
//
// A cluster starts as one node (the first `basalt server`, whose embedded
// etcd member is the only voter). `basalt server --join https://PEER:8443`
// asks any node to let a new one in (Join, on the serving side; Enter, on
// the joining side). Joins are serialized by a lock in etcd. While the
// cluster has fewer voters than its target (Cluster.Voters: 3, or 5), the
// new node's member is added as a learner — it catches up without counting
// towards quorum — and promotes itself once etcd says it is in sync; beyond
// the target, the node runs no member and is an etcd client of the voters.
// Should the cluster lose a voter to `node remove`, a client node steps up
// (StepUp, stepup.go): it is added as a learner and starts a member in its
// running process.
// Voter counts stay odd once grown: 2 or 4 voters tolerate no more failures
// than 1 or 3 (a majority of 2 is 2), they only cost latency.
//
// Invariants:
//   - at most one join or step-up is in flight (the lock; etcd also
//     refuses a second learner);
//   - the cluster runs its own etcd unless its record says External (the
//     first node was started with --meta-endpoints): only then are etcd's
//     members basalt's nodes, to list, join or remove;
//   - a join is idempotent: the same name and peer URL asked again (a node
//     that crashed mid-join) gets the same answer, never a second member —
//     while that member has not started: a node records its answer before
//     its member starts, so one asking for a started member again lost its
//     data directory, and is refused (its empty Raft log would pass for a
//     lost one);
//   - node names are unique: a join under the name of a registered node is
//     refused unless it comes with that node's addresses — its API URL,
//     and its etcd peer URL if it runs a member. Two live processes cannot
//     serve one address, so equal addresses mean the node itself, asking
//     again after a crash mid-join; other addresses mean another node.
//     The volume service relies on this: a node revokes the write leases
//     its name holds on an older etcd lease as its own previous run's;
//   - every node has a nodes/<name> record; alive/<name> exists while the
//     node keeps its lease, so health needs no probe of the node itself.
//
// Callers: the API (join, node list/remove, join tokens) and the server
// package (a joining node, and every node's registration).
package cluster

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/pki"
)

// Error codes of membership calls. Stable: add, never rename.
const (
	CodeNodeExists      = "NodeExists"       // 409: a node or member of that name has other addresses
	CodeJoinTokenBad    = "InvalidJoinToken" // 401: unknown or expired join token
	CodeExternalMeta    = "ExternalMetadata" // 409: the cluster runs on an external etcd
	CodeNodeIsSelf      = "NodeIsSelf"       // 409: a node cannot remove itself
	CodeLastVoter       = "LastVoter"        // 409: removing the only voter
	CodeWouldLoseQuorum = "WouldLoseQuorum"  // 409: removing that voter leaves too few live voters for a quorum
	CodeStoreMismatch   = "StoreMismatch"    // 409: the joining node's --store is not the cluster's store
	CodeJoinInProgress  = meta.CodeJoinInProgress
	DefaultJoinTokenTTL = 24 * time.Hour
)

// JoinRequest is what a joining node tells about itself.
type JoinRequest struct {
	Name string `json:"name"`
	// Peer and Client are the URLs its etcd member would use (advertised).
	Peer   string `json:"peer"`
	Client string `json:"client"`
	API    string `json:"api"`
	S3     string `json:"s3,omitempty"`
	NBD    string `json:"nbd,omitempty"`
	// StoreID and StoreCluster are what the marker of the joining node's
	// --store says (store.Marker), empty when it has none: a store of
	// another cluster is refused before this one counts the node in.
	StoreID      string `json:"store_id,omitempty"`
	StoreCluster string `json:"store_cluster,omitempty"`
}

// JoinResponse is what a joining node needs to start.
type JoinResponse struct {
	ClusterID string `json:"cluster_id"`
	// Role is learner (start a member, then promote it) or client.
	Role string `json:"role"`
	// InitialCluster is etcd's "name=peerURL,..." of every member,
	// the joining node included (learner only).
	InitialCluster string `json:"initial_cluster,omitempty"`
	// Endpoints are the voters' etcd client URLs.
	Endpoints []string `json:"endpoints"`
	// The cluster CA, certificate and key: every node issues its own
	// certificate and user identities with it.
	CACert string `json:"ca_cert"`
	CAKey  string `json:"ca_key"`
}

// NodeInfo is a node as `basalt node list` shows it.
type NodeInfo struct {
	Name   string `json:"name"`
	Role   string `json:"role"`   // voter, learner, client
	Health string `json:"health"` // healthy, unhealthy
	API    string `json:"api"`
	S3     string `json:"s3"`
	NBD    string `json:"nbd"`
}

// Health values.
const (
	Healthy   = "healthy"
	Unhealthy = "unhealthy"
)

// Service is the membership service of one node.
type Service struct {
	meta *meta.Store
	ca   *pki.CA
	self string
	log  *slog.Logger
	// revoke revokes the credentials issued to a node (its local admin
	// identity); nil: none to revoke.
	revoke func(ctx context.Context, node string) error
}

// SetRevoker makes Remove revoke the credentials issued to the node it
// removes with f (the server passes the user service's RevokeNode). Call
// it before the service answers requests.
func (s *Service) SetRevoker(f func(ctx context.Context, node string) error) { s.revoke = f }

// New makes the service of node self.
func New(m *meta.Store, ca *pki.CA, self string, log *slog.Logger) *Service {
	return &Service{meta: m, ca: ca, self: self, log: log}
}

// Join lets a node in (see the package comment). The caller has
// authenticated the request (an admin certificate or a join token).
func (s *Service) Join(ctx context.Context, req JoinRequest) (*JoinResponse, error) {
	if err := checkRequest(req); err != nil {
		return nil, err
	}
	cl, err := s.meta.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	if cl.External {
		return nil, errs.Conflict(CodeExternalMeta, "this cluster keeps its metadata in an external etcd: start the node with --meta-endpoints instead of --join")
	}
	if err := s.checkStore(ctx, cl.ID, req); err != nil {
		return nil, err
	}
	resp := &JoinResponse{ClusterID: cl.ID, CACert: string(s.ca.CertPEM), CAKey: string(s.ca.KeyPEM)}
	err = s.withJoinLock(ctx, func(ctx context.Context) error {
		if err := s.checkName(ctx, req); err != nil {
			return err
		}
		members, err := s.meta.Members(ctx)
		if err != nil {
			return err
		}
		mine, err := s.memberFor(ctx, members, req)
		if err != nil {
			return err
		}
		voters, learners := 0, 0
		for i, m := range members {
			if i != mine && m.Name == req.Name {
				return errs.Conflict(CodeNodeExists, "a member named %s already exists with peer URLs %v; remove it first (basalt node remove %s)", req.Name, m.Peers, req.Name)
			}
			if m.Learner {
				learners++
			} else {
				voters++
			}
		}
		switch {
		case mine >= 0:
			// Asked again (the node crashed mid-join): same answer.
			resp.Role = meta.RoleLearner
			if !members[mine].Learner {
				resp.Role = meta.RoleVoter
			}
		case voters < cl.Voters:
			if learners > 0 {
				// Name it, and the way out: a learner whose node died for
				// good before it started blocks voter joins until removed.
				// Named as `node list` names it — by its node's record when
				// one has its peer URL (a member is nameless until it
				// starts) — so that removing that name takes out the
				// record with the member; removing the member alone by
				// its unstarted-<id> name would leave the record behind.
				nodes, err := s.meta.Nodes(ctx)
				if err != nil {
					return err
				}
				var who []string
				for _, m := range members {
					if m.Learner {
						who = append(who, fmt.Sprintf("%s (peer %s)", listedName(m, nodes), strings.Join(m.Peers, ",")))
					}
				}
				return errs.Conflict(CodeJoinInProgress, "another node is joining: learner %s is catching up; retry — or, if that node is gone for good, remove it (basalt node remove NAME)",
					strings.Join(who, ", "))
			}
			if _, err := s.meta.AddLearner(ctx, req.Peer); err != nil {
				if !errors.Is(err, meta.ErrVotersNotConnected) {
					return err
				}
				// etcd takes no member, not even a learner, while a
				// voter is down (too few would be connected): waiting
				// for it could take for ever. The node joins as a
				// client instead, and steps up (StepUp) once etcd
				// takes a member again. A voter merely promoted moments
				// ago — all of them alive — is waited for as before.
				down, derr := s.downVoters(ctx, members)
				if derr != nil {
					return derr
				}
				if len(down) == 0 {
					return err
				}
				s.log.Info("a voter is down: the node joins as a client and steps up later", "node", req.Name, "down", down)
				resp.Role = meta.RoleClient
				break
			}
			if members, err = s.meta.Members(ctx); err != nil {
				return err
			}
			resp.Role = meta.RoleLearner
		default:
			resp.Role = meta.RoleClient
		}
		for _, m := range members {
			if !m.Learner && m.Name != "" {
				resp.Endpoints = append(resp.Endpoints, m.Clients...)
			}
		}
		if resp.Role != meta.RoleClient {
			resp.InitialCluster = initialCluster(members, req)
		}
		return s.meta.PutNode(ctx, nodeRecord(req, resp.Role))
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("node joined", "node", req.Name, "role", resp.Role, "peer", req.Peer)
	return resp, nil
}

// memberFor is the index in members of req's etcd member, found by its
// peer URL (-1: none yet). A member with that peer URL that another node
// started, or that was added for another registered node and has not
// started yet, is not req's: two nodes given one peer URL (two hosts left
// at the default --etcd-peer 127.0.0.1:2380, say) would otherwise have
// the second told it is the first's member, and `node remove` of either
// take out the other's.
func (s *Service) memberFor(ctx context.Context, members []meta.Member, req JoinRequest) (int, error) {
	for i, m := range members {
		if !slices.Contains(m.Peers, req.Peer) {
			continue
		}
		owner := m.Name
		if owner == "" {
			nodes, err := s.meta.Nodes(ctx)
			if err != nil {
				return -1, err
			}
			for _, n := range nodes {
				if n.Peer == req.Peer && n.Name != req.Name {
					owner = n.Name
				}
			}
		}
		if owner != "" && owner != req.Name {
			return -1, errs.Conflict(CodeNodeExists,
				"etcd peer URL %s is node %s's; give this node its own --etcd-peer (or --advertise)", req.Peer, owner)
		}
		if m.Name != "" {
			// The member has started (etcd names it then), and a node
			// records its answer before its member starts: asking
			// again is no crash mid-join but a node that lost its data
			// directory, or another with its addresses. Told to start
			// that member, it would start it with an empty Raft log,
			// which etcd takes for a lost one (it panics; a voter that
			// forgot what it acknowledged voids the quorum's promise).
			return -1, errs.Conflict(CodeNodeExists,
				"node %s's etcd member (peer %s) has run already: a node that lost its data directory cannot take it again; remove the node first (basalt node remove %s), then join with a new --data",
				req.Name, req.Peer, req.Name)
		}
		return i, nil
	}
	return -1, nil
}

// downVoters names the voting members whose nodes keep no liveness key
// (or that are no registered node).
func (s *Service) downVoters(ctx context.Context, members []meta.Member) ([]string, error) {
	nodes, err := s.meta.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	alive, err := s.meta.Alive(ctx)
	if err != nil {
		return nil, err
	}
	var down []string
	for _, m := range members {
		if name := listedName(m, nodes); !m.Learner && !alive[name] {
			down = append(down, name)
		}
	}
	return down, nil
}

// withJoinLock runs fn under the cluster's join lock, or fails at once
// with 503 MetadataUnavailable when no quorum answers: taking the lock
// grants a lease, which waits for a quorum as long as ctx lets it — a
// `node remove` or a join would hang until its caller gave up (the CLI
// after 60 s, reporting the node unreachable) instead of failing like
// any other write. The read first finds out (it notes a lost quorum).
//
// fn's reads (through the ctx it is given) are linearizable or fail: a
// read that fell back on this node's copy, lagging behind the quorum,
// would count members or see names as they were, and the change fn then
// commits would rest on that (a learner added beyond the voters wanted).
func (s *Service) withJoinLock(ctx context.Context, fn func(ctx context.Context) error) error {
	if _, err := s.meta.Cluster(ctx); err != nil {
		return err
	}
	if s.meta.QuorumLost() {
		return errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"no quorum of the metadata cluster answers: membership cannot change until a majority of the voters is up")
	}
	lctx := meta.Linear(ctx)
	return s.meta.WithJoinLock(lctx, func() error { return fn(lctx) })
}

// checkName refuses a join under the name of another registered node (see
// the package comment: the same addresses are the same node).
func (s *Service) checkName(ctx context.Context, req JoinRequest) error {
	n, err := s.meta.Node(ctx, req.Name)
	if errs.IsCode(err, errs.CodeNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("join %s: %w", req.Name, err)
	}
	if n.Removing {
		// A removal stopped half way (Remove): the join would write the
		// record unmarked, and hand the CA to a node being removed.
		return errs.Conflict(CodeNodeExists,
			"node %s is being removed (an earlier basalt node remove %s did not finish): run it again, then join", req.Name, req.Name)
	}
	if n.API == req.API && (n.Peer == "" || n.Peer == req.Peer) {
		return nil
	}
	return errs.Conflict(CodeNodeExists,
		"a node named %s is already registered, with API %s; give this node another --name, or remove that node first (basalt node remove %s) if it is gone for good",
		req.Name, n.API, req.Name)
}

func checkRequest(req JoinRequest) error {
	if err := meta.CheckNodeName(req.Name); err != nil {
		return err
	}
	for what, u := range map[string]string{"peer": req.Peer, "client": req.Client, "api": req.API} {
		if !strings.HasPrefix(u, "https://") {
			return errs.Invalid(errs.CodeInvalidRequest, "%s URL %q: an https:// URL is required", what, u)
		}
	}
	return nil
}

// checkStore refuses a joining node whose --store is marked as another
// store than the cluster's (of cluster clusterID): the node would refuse
// to start once joined (its own check, server.identifyStore, which this
// one follows), after the cluster had added its member and record — a
// half-joined node to remove by hand. With the cluster's store id
// recorded, the marker must name that id; before, the cluster. A store
// without a marker is the joining node's to check.
func (s *Service) checkStore(ctx context.Context, clusterID string, req JoinRequest) error {
	if req.StoreID == "" {
		return nil
	}
	recorded, err := s.meta.StoreID(ctx, "")
	if err != nil {
		return err
	}
	switch {
	case recorded == "" && req.StoreCluster != clusterID:
		return errs.Conflict(CodeStoreMismatch, "node %s's --store is store %s of cluster %q, not of this cluster (%s): it names another cluster's store",
			req.Name, req.StoreID, req.StoreCluster, clusterID)
	case recorded != "" && req.StoreID != recorded:
		return errs.Conflict(CodeStoreMismatch, "node %s's --store is store %s, not this cluster's store %s: it names another store (or another file system)",
			req.Name, req.StoreID, recorded)
	}
	return nil
}

// initialCluster is etcd's --initial-cluster for the joining node: every
// member by name (the new one has none until it starts: req's).
func initialCluster(members []meta.Member, req JoinRequest) string {
	var parts []string
	for _, m := range members {
		name := m.Name
		if slices.Contains(m.Peers, req.Peer) {
			name = req.Name
		}
		if name == "" {
			continue // another unstarted member: not ours to name
		}
		for _, p := range m.Peers {
			parts = append(parts, name+"="+p)
		}
	}
	return strings.Join(parts, ",")
}

func nodeRecord(req JoinRequest, role string) *meta.Node {
	n := &meta.Node{Name: req.Name, API: req.API, S3: req.S3, NBD: req.NBD, JoinedAt: time.Now().UTC()}
	if role != meta.RoleClient {
		n.Peer, n.Client = req.Peer, req.Client
	}
	return n
}

// CodeNodeRemoved: the node was taken out of the cluster (`basalt node
// remove`) and may not serve in it again.
const CodeNodeRemoved = "NodeRemoved"

// NodeRemoved is the refusal of node name, removed from cluster id.
func NodeRemoved(name, id string) error {
	return errs.Conflict(CodeNodeRemoved, "node %s was removed from cluster %s (basalt node remove); to join it again, start it with a new --data directory and --join (or --meta-endpoints)", name, id)
}

// Register records this node (at every start: its URLs may change), in
// one transaction with the read of its record. A node registered before
// in cluster known (it joined — the serving node recorded it — or
// registered once; "": neither) must still be: if it was removed meanwhile (its record gone, or marked
// removing), even after its start checked, it is refused (NodeRemoved)
// rather than recorded again, or the mark overwritten — a removed node
// would then serve on, with no removal left to stop it.
func (s *Service) Register(ctx context.Context, n *meta.Node, known string) error {
	return s.meta.Update(ctx, func(tx *meta.Tx) error {
		old, err := tx.Node(n.Name)
		if err != nil {
			return err
		}
		switch {
		case known != "" && (old == nil || old.Removing):
			return NodeRemoved(n.Name, known)
		case old != nil:
			n.JoinedAt, n.Removing = old.JoinedAt, old.Removing
		default:
			n.JoinedAt = time.Now().UTC()
		}
		return tx.PutNode(n)
	})
}

// Nodes lists every node with its role and health, and every etcd member
// that is no registered node (a stale learner, say).
func (s *Service) Nodes(ctx context.Context) ([]NodeInfo, error) {
	nodes, err := s.meta.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	alive, err := s.meta.Alive(ctx)
	if err != nil {
		return nil, err
	}
	cl, err := s.meta.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	var members []meta.Member
	if !cl.External {
		// Asked of any node, a client node's included: the member list
		// is the cluster's.
		if members, err = s.meta.Members(ctx); err != nil {
			return nil, err
		}
	}
	seen := map[uint64]bool{}
	out := make([]NodeInfo, 0, len(nodes))
	for _, n := range nodes {
		ni := NodeInfo{Name: n.Name, Role: meta.RoleClient, Health: Unhealthy, API: n.API, S3: n.S3, NBD: n.NBD}
		if alive[n.Name] {
			ni.Health = Healthy
		}
		if m, ok := memberOf(members, n); ok {
			seen[m.ID] = true
			ni.Role = meta.RoleVoter
			if m.Learner {
				ni.Role = meta.RoleLearner
			}
		}
		out = append(out, ni)
	}
	for _, m := range members {
		if !seen[m.ID] {
			role := meta.RoleVoter
			if m.Learner {
				role = meta.RoleLearner
			}
			name := m.Name
			if name == "" {
				name = unstartedName(m.ID)
			}
			out = append(out, NodeInfo{Name: name, Role: role, Health: Unhealthy})
		}
	}
	return out, nil
}

// listedName is the name `node list` shows member m under: its node's,
// the registered node with its name or peer URL (memberOf), else its
// own, else unstartedName.
func listedName(m meta.Member, nodes []*meta.Node) string {
	for _, n := range nodes {
		if _, ok := memberOf([]meta.Member{m}, n); ok {
			return n.Name
		}
	}
	if m.Name != "" {
		return m.Name
	}
	return unstartedName(m.ID)
}

// unstartedName names a member that never started (a join interrupted
// for good) in the node list, so that `node remove` can take it out.
func unstartedName(id uint64) string { return fmt.Sprintf("unstarted-%x", id) }

func memberOf(members []meta.Member, n *meta.Node) (meta.Member, bool) {
	for _, m := range members {
		if m.Name == n.Name || n.Peer != "" && slices.Contains(m.Peers, n.Peer) {
			return m, true
		}
	}
	return meta.Member{}, false
}

// Remove takes node name out: its etcd member (if any) leaves the voters,
// the credentials issued to it are revoked (SetRevoker: its local admin
// identity) and its registration goes. A running node that is removed
// stops (it watches its own record). The cluster keeps at least one voter.
//
// The revocation comes after the checks that may refuse the removal and
// before the registration goes: a removal whose revocation failed leaves
// the node registered, and asked again completes.
func (s *Service) Remove(ctx context.Context, name string) error {
	if name == s.self {
		return errs.Conflict(CodeNodeIsSelf, "node %s cannot remove itself; ask another node", name)
	}
	return s.withJoinLock(ctx, func(ctx context.Context) error {
		n, err := s.meta.Node(ctx, name)
		if err != nil && !errs.IsCode(err, errs.CodeNotFound) {
			return err
		}
		cl, err := s.meta.Cluster(ctx)
		if err != nil {
			return err
		}
		var members []meta.Member
		if !cl.External {
			// (An external etcd's members are not basalt's to remove,
			// whatever their names.)
			if members, err = s.meta.Members(ctx); err != nil {
				return err
			}
		}
		var target *meta.Member
		voters := 0
		for i, m := range members {
			if !m.Learner {
				voters++
			}
			if m.Name == name || m.Name == "" && unstartedName(m.ID) == name ||
				n != nil && n.Peer != "" && slices.Contains(m.Peers, n.Peer) {
				target = &members[i]
			}
		}
		if n == nil && target == nil {
			return errs.NotFound("node", name)
		}
		if target != nil {
			if !target.Learner && voters == 1 {
				return errs.Conflict(CodeLastVoter, "node %s is the cluster's only voter", name)
			}
			if err := s.meta.RemoveMember(ctx, target.ID); err != nil {
				// etcd refuses to remove a voter when the live voters
				// left would be no majority (another voter is down, or
				// not connected long enough yet). The cluster has its
				// quorum: say why, rather than the 503 "no quorum
				// answered" its error would otherwise become.
				if msg := err.Error(); strings.Contains(msg, "unhealthy cluster") || strings.Contains(msg, "not enough started members") {
					return errs.Conflict(CodeWouldLoseQuorum,
						"removing voter %s now would leave too few live voters for a quorum (another voter is down, or joined moments ago); bring the voters up, or remove a voter that is down first, then retry", name)
				}
				return err
			}
		}
		// Once the member is out, the cluster may be electing a leader
		// (the removed member led it) for a few seconds: the steps that
		// follow, each idempotent, are tried again while the metadata is
		// unavailable, so that a removal the member's answer reported done
		// is not left half done (registered, its identity valid).
		again := func(step func() error) error {
			if target == nil {
				return step()
			}
			return retryUnavailable(ctx, removalSettle, step)
		}
		if s.revoke != nil {
			// Marked first, so that the node, if it runs, cannot give
			// itself a new identity between the revocation and the
			// record's deletion (user.Service.RenewNodeIdentity).
			if n != nil && !n.Removing {
				n.Removing = true
				if err := again(func() error { return s.meta.PutNode(ctx, n) }); err != nil {
					return err
				}
			}
			if err := again(func() error { return s.revoke(ctx, name) }); err != nil {
				return err
			}
		}
		if err := again(func() error { return s.meta.DeleteNode(ctx, name) }); err != nil {
			return err
		}
		s.log.Info("node removed", "node", name, "was_member", target != nil)
		return nil
	})
}

// removalSettle bounds how long Remove waits for the metadata after the
// member's removal: an election takes a second or two; a cluster that
// has lost its quorum answers 503 after it.
const removalSettle = 30 * time.Second

// retryUnavailable runs step until it succeeds, fails otherwise than for
// want of the metadata (MetadataUnavailable), ctx ends or within has
// passed; step must be safe to run again.
func retryUnavailable(ctx context.Context, within time.Duration, step func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := step()
		if err == nil || !errs.IsCode(err, errs.CodeMetadataUnavailable) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// NewJoinToken issues a join token valid for ttl. Its form is
// "basalt-join.<secret>.<sha256 of the CA certificate, hex>": the secret
// authenticates the joining node, the CA hash lets it authenticate the
// cluster before it trusts anything it says (as kubeadm's discovery hash).
func (s *Service) NewJoinToken(ctx context.Context, ttl time.Duration) (string, time.Time, error) {
	// Zero is "not given" (the API's default); a negative TTL is asked
	// for, and must not become a token valid for the default 24 h.
	if ttl == 0 {
		ttl = DefaultJoinTokenTTL
	}
	if ttl < time.Minute || ttl > 30*24*time.Hour {
		return "", time.Time{}, errs.Invalid(errs.CodeInvalidRequest, "ttl %v: between 1m and 720h", ttl)
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", time.Time{}, err
	}
	secret := hex.EncodeToString(b)
	if err := s.meta.PutJoinToken(ctx, secret, ttl); err != nil {
		return "", time.Time{}, err
	}
	return "basalt-join." + secret + "." + CAHash(s.ca.CertPEM), time.Now().Add(ttl).UTC(), nil
}

// CheckJoinToken verifies a token presented by a joining node.
func (s *Service) CheckJoinToken(ctx context.Context, token string) error {
	secret, hash, err := ParseJoinToken(token)
	if err != nil {
		return err
	}
	if hash != CAHash(s.ca.CertPEM) {
		return errs.New(errs.KindUnauthenticated, CodeJoinTokenBad, "the join token was issued by another cluster")
	}
	ok, err := s.meta.JoinTokenValid(ctx, secret)
	if err != nil {
		return err
	}
	if !ok {
		return errs.New(errs.KindUnauthenticated, CodeJoinTokenBad, "unknown or expired join token; issue one with `basalt node join-token`")
	}
	return nil
}

// RevokeJoinToken makes token unusable before it expires (a token that
// leaked, or was issued for a node that will not come). Nodes joined with
// it stay.
func (s *Service) RevokeJoinToken(ctx context.Context, token string) error {
	secret, hash, err := ParseJoinToken(token)
	if err != nil {
		return err
	}
	found := false
	if hash == CAHash(s.ca.CertPEM) {
		if found, err = s.meta.RevokeJoinToken(ctx, secret); err != nil {
			return err
		}
	}
	if !found {
		return errs.New(errs.KindNotFound, errs.CodeNotFound, "no such join token: expired, revoked already, or issued by another cluster")
	}
	return nil
}

// ParseJoinToken splits a join token into its secret and CA hash.
func ParseJoinToken(token string) (secret, caHash string, err error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] != "basalt-join" || len(parts[1]) != 48 || len(parts[2]) != 64 {
		return "", "", errs.New(errs.KindUnauthenticated, CodeJoinTokenBad, "malformed join token (want basalt-join.<secret>.<ca hash>)")
	}
	return parts[1], parts[2], nil
}

// CAHash is the hex SHA-256 of the first certificate in a PEM bundle's DER.
func CAHash(certPEM []byte) string {
	c, err := pki.ParseCertPEM(certPEM)
	if err != nil {
		return ""
	}
	h := sha256.Sum256(c.Raw)
	return hex.EncodeToString(h[:])
}
