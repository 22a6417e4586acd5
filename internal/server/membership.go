package server

// How this node belongs to its cluster: bootstrapping a new one, joining
// one (--join), keeping its registration and liveness, promoting its
// learner, stepping up from client to voter when the cluster lacks one,
// and leaving when an operator removes it.
//
// DATA/cluster.json records a join once it is granted, before the etcd
// member starts, so that a node that crashes mid-join resumes with the
// same answer (a join asked again is idempotent on the serving side too).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/failpoint"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/pki"
)

// joinState is DATA/cluster.json.
type joinState struct {
	ClusterID string `json:"cluster_id"`
	// Role at the last update: learner, voter or client.
	Role           string   `json:"role"`
	InitialCluster string   `json:"initial_cluster,omitempty"`
	Endpoints      []string `json:"endpoints"`
}

func (n *Node) joinStatePath() string { return filepath.Join(n.cfg.Data, "cluster.json") }

// registeredPath marks that a node without a join state — the cluster's
// first, or one started on --meta-endpoints — has registered once: its
// record missing at a later start means it was removed (checkNotRemoved).
func (n *Node) registeredPath() string { return filepath.Join(n.cfg.Data, "registered") }

func (n *Node) loadJoinState() (*joinState, error) {
	b, err := os.ReadFile(n.joinStatePath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	st := &joinState{}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("%s: %w", n.joinStatePath(), err)
	}
	return st, nil
}

func (n *Node) saveJoinState(st *joinState) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	return pki.WriteFileAtomic(n.joinStatePath(), append(b, '\n'), 0o600)
}

// advertised is the host and port of a listen address as other nodes and
// clients reach it: --advertise, else the listen host, else (a wildcard
// address) the host name.
func (n *Node) advertised(listen string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(listen)
	if err != nil {
		return "", "", err
	}
	if n.cfg.Advertise != "" {
		host = n.cfg.Advertise
	} else if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host, _ = os.Hostname()
	}
	return host, port, nil
}

// advertisedURL is https://host:port of a listen address (advertised).
func (n *Node) advertisedURL(listen string) string {
	host, port, err := n.advertised(listen)
	if err != nil {
		return ""
	}
	return "https://" + net.JoinHostPort(host, port)
}

// join asks the cluster at cfg.Join to let this node in, unless an earlier
// start already did; it returns the join state (nil: not a joining node).
func (n *Node) join(ctx context.Context, pkiDir string) (*joinState, error) {
	st, err := n.loadJoinState()
	if err != nil || st != nil {
		if st != nil && n.cfg.Join != "" {
			n.log.Info("already joined; --join ignored", "cluster", st.ClusterID, "role", st.Role)
		}
		return st, err
	}
	if n.cfg.Join == "" {
		return nil, nil
	}
	if _, err := os.Stat(filepath.Join(n.cfg.Data, "meta")); err == nil {
		return nil, errs.Conflict("AlreadyInCluster", "%s already holds the metadata of a cluster of its own; give a new --data directory to join another", n.cfg.Data)
	}
	// Before the cluster counts this node in: its --store must be a
	// store already, and the cluster checks that its marker names the
	// cluster's (identifyStore checks again once the metadata can be
	// read: a store laid out before markers has none to send).
	marker, err := n.storeBeforeJoin()
	if err != nil {
		return nil, err
	}
	req := n.joinRequest(n.advertisedURL(n.cfg.API))
	req.StoreID, req.StoreCluster = marker.ID, marker.Cluster
	n.log.Info("joining", "via", n.cfg.Join)
	resp, err := cluster.Enter(ctx, cluster.EnterParams{
		Via: n.cfg.Join, Identity: n.cfg.JoinIdentity, Token: n.cfg.JoinToken,
		Request: req,
	})
	if err != nil {
		return nil, err
	}
	ca, err := pki.ParseCA([]byte(resp.CACert), []byte(resp.CAKey))
	if err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	if err := ca.Save(pkiDir); err != nil {
		return nil, err
	}
	st = &joinState{ClusterID: resp.ClusterID, Role: resp.Role, InitialCluster: resp.InitialCluster, Endpoints: resp.Endpoints}
	if err := n.saveJoinState(st); err != nil {
		return nil, err
	}
	n.log.Info("joined", "cluster", resp.ClusterID, "role", resp.Role, "voters", resp.Endpoints)
	return st, nil
}

// checkNotRemoved refuses to start a node that joined (st, its join
// state), or registered once without joining (registeredPath), and has
// been taken out with `basalt node remove` since, or is being taken out:
// the serving node records a joining node before it answers, so a joined
// node without a record (or with one marked removing) was removed. Without this check a removed client
// node restarted on its data directory (by a supervisor, say) would
// register itself again and serve — and keep its liveness key, resume
// and adopt workflows — as if it had never been removed. Only a
// linearizable answer counts: a local copy may lag behind the join.
func (n *Node) checkNotRemoved(ctx context.Context, st *joinState) error {
	known := n.knownIn(st)
	if known == "" {
		return nil // never registered in this cluster: its first start here
	}
	rctx, ri := meta.WithReadInfo(ctx)
	rec, err := n.meta.Node(rctx, n.cfg.Name)
	if (errs.IsCode(err, errs.CodeNotFound) || err == nil && rec.Removing) && !ri.Local {
		return cluster.NodeRemoved(n.cfg.Name, known)
	}
	return nil // other errors: registering the node reports them (Register checks again)
}

// checkNameFree refuses the first start of a data directory in the
// cluster (never joined, never registered: a node on --meta-endpoints,
// which no join checks) under the name of a node running now. Two live
// nodes of one name would share its liveness key and its records — each
// taking the other's write leases and workflows for its own previous
// run's — and the second's registration would overwrite the first's
// addresses. A name whose node is not running may be taken over (a
// node rebuilt on a new disk under its old name), as before; that is
// logged. A node that crashed after registering but before recording it
// (registeredPath) and starts again within its liveness TTL (seconds) is
// refused too, and starts at the next try.
func (n *Node) checkNameFree(ctx context.Context, st *joinState) error {
	if n.knownIn(st) != "" {
		return nil // this data directory is the node of that name
	}
	rec, err := n.meta.Node(ctx, n.cfg.Name)
	if errs.IsCode(err, errs.CodeNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check node name %s: %w", n.cfg.Name, err)
	}
	alive, err := n.meta.Alive(ctx)
	if err != nil {
		return fmt.Errorf("check node name %s: %w", n.cfg.Name, err)
	}
	if !alive[n.cfg.Name] {
		n.log.Warn("taking over the name of a registered node that is not running", "node", n.cfg.Name, "its_api", rec.API)
		return nil
	}
	return errs.Conflict(cluster.CodeNodeExists,
		"node name %s is taken: a running node is registered under it (API %s); start this node with another --name, or stop that node first",
		n.cfg.Name, rec.API)
}

// knownIn returns the cluster this node was recorded in before this
// start — the one it joined (st, its join state), or the one it
// registered in once (registeredPath) — or "" if none: its first start
// in the cluster.
func (n *Node) knownIn(st *joinState) string {
	if st != nil {
		return st.ClusterID
	}
	if b, err := os.ReadFile(n.registeredPath()); err == nil && strings.TrimSpace(string(b)) == n.clusterID {
		return n.clusterID
	}
	return ""
}

// joinRequest is how this node describes itself to join (or step up),
// with api its API URL.
func (n *Node) joinRequest(api string) cluster.JoinRequest {
	return cluster.JoinRequest{
		Name: n.cfg.Name, Peer: n.advertisedURL(n.cfg.EtcdPeer), Client: n.advertisedURL(n.cfg.EtcdClient),
		API: api, S3: n.s3URL(),
	}
}

// metaConfig adapts the metadata configuration to a joined node.
func (n *Node) metaConfig(c meta.Config, st *joinState) meta.Config {
	if st == nil {
		return c
	}
	c.Endpoints = st.Endpoints
	if st.Role == meta.RoleClient {
		c.ExternalTLS = c.ClientTLS // the voters trust the cluster CA
		return c
	}
	c.Embed.InitialCluster = st.InitialCluster
	if st.Role == meta.RoleVoter {
		// Its own member answers too (a learner's would refuse).
		c.Endpoints = append([]string{n.advertisedURL(n.cfg.EtcdClient)}, c.Endpoints...)
	}
	return c
}

// promote turns this node's learner into a voter once etcd says it has
// caught up, then records the role.
func (n *Node) promote(ctx context.Context, st *joinState) {
	id := n.meta.MemberID()
	for ctx.Err() == nil {
		err := n.meta.Promote(ctx, id)
		if err == nil {
			break
		}
		if !errors.Is(err, meta.ErrNotCaughtUp) {
			n.log.Warn("promotion to voter failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	n.log.Info("promoted to voter", "member", fmt.Sprintf("%x", id))
	if err := n.meta.Sync(ctx); err != nil {
		n.log.Warn("endpoint sync after promotion", "err", err)
	}
	st.Role = meta.RoleVoter
	n.refreshJoinState(ctx, st)
}

// stepUpEvery is how often a client node looks whether the cluster wants
// a voter; stepUpRetry how long it waits after its member failed to start.
var (
	stepUpEvery = 3 * time.Second
	stepUpRetry = time.Minute
)

// stepUp makes this client node a voter when the cluster has fewer voters
// than its target (cluster.Service.StepUp decides, one node at a time):
// its learner is added, the join state records the new role before the
// member starts — a node that crashes from then on restarts as a learner
// and promotes itself, as a joining node does — then the member starts in
// this process, beside the services already running, and is promoted
// once it has caught up. Nothing the node serves stops meanwhile.
func (n *Node) stepUp(ctx context.Context, st *joinState, api string) {
	req := n.joinRequest(api)
	for range ticks(ctx, stepUpEvery) {
		resp, err := n.cluster.StepUp(ctx, req)
		if err != nil {
			if !errs.IsCode(err, meta.CodeJoinInProgress) && ctx.Err() == nil {
				n.log.Warn("stepping up to voter", "err", err)
			}
			continue
		}
		if resp == nil {
			continue
		}
		failpoint.Crash("step-up-learner-added")
		up := *st
		up.Role, up.InitialCluster, up.Endpoints = meta.RoleLearner, resp.InitialCluster, resp.Endpoints
		err = n.saveJoinState(&up)
		if err == nil {
			failpoint.Crash("step-up-state-saved")
			n.log.Info("the cluster wants a voter: starting an etcd member", "initial_cluster", up.InitialCluster)
			err = n.meta.StartMember(ctx, n.metaConfig(n.metaCfg, &up))
		}
		if err != nil {
			if ctx.Err() != nil {
				return // the node stops
			}
			n.log.Error("cannot become a voter; staying a client", "err", err)
			// No member ran: what it left in its directory would make
			// the next attempt's new member start as this one.
			if err := os.RemoveAll(n.metaCfg.Embed.Dir); err != nil {
				n.log.Warn("cannot remove the failed member's directory", "err", err)
			}
			if err := n.saveJoinState(st); err != nil {
				n.log.Warn("cannot record cluster state", "err", err)
			}
			if err := n.cluster.StepDown(ctx, req); err != nil {
				n.log.Warn("removing this node's learner", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(stepUpRetry):
			}
			continue
		}
		n.promote(ctx, &up)
		return
	}
}

// refreshJoinState records the current voters, for the next start.
func (n *Node) refreshJoinState(ctx context.Context, st *joinState) {
	members, err := n.meta.Members(ctx)
	if err != nil {
		return
	}
	var eps []string
	for _, m := range members {
		if !m.Learner && m.Name != "" {
			eps = append(eps, m.Clients...)
		}
	}
	if len(eps) > 0 {
		st.Endpoints = eps
	}
	if err := n.saveJoinState(st); err != nil {
		n.log.Warn("cannot record cluster state", "err", err)
	}
}

// single reports whether this node is the whole cluster: then it may
// adopt workflows any node name recorded (a renamed node's, say).
func (n *Node) single(ctx context.Context) bool {
	if !n.meta.Embedded() {
		return false
	}
	members, err := n.meta.Members(ctx)
	if err != nil || len(members) != 1 {
		return false
	}
	nodes, err := n.meta.Nodes(ctx)
	return err == nil && len(nodes) <= 1 && (len(nodes) == 0 || nodes[0].Name == n.cfg.Name)
}

// belong registers the node, finishes a learner's promotion, and stops the
// node when it is removed from the cluster by `basalt node remove`
// (watchRemoval). (Its liveness key is kept from before the volume service
// starts.)
func (n *Node) belong(ctx context.Context, st *joinState) error {
	rec := &meta.Node{Name: n.cfg.Name, API: n.advertisedURL(n.apiAddr), S3: n.s3URL(), NBD: n.nbdURI}
	if n.meta.Embedded() {
		rec.Peer, rec.Client = n.advertisedURL(n.cfg.EtcdPeer), n.advertisedURL(n.cfg.EtcdClient)
	}
	// A removal may have run since checkNotRemoved: Register checks
	// again, in the transaction that records the node.
	if err := n.cluster.Register(ctx, rec, n.knownIn(st)); err != nil {
		return fmt.Errorf("register node: %w", err)
	}
	if st == nil {
		if err := pki.WriteFileAtomic(n.registeredPath(), []byte(n.clusterID+"\n"), 0o600); err != nil {
			return fmt.Errorf("register node: %w", err)
		}
	}
	switch {
	case st != nil && st.Role == meta.RoleLearner:
		go n.promote(ctx, st)
	case st != nil && st.Role == meta.RoleClient:
		go func() {
			n.refreshJoinState(ctx, st)
			n.stepUp(ctx, st, rec.API)
		}()
	case st != nil:
		go n.refreshJoinState(ctx, st)
	}
	go n.watchRemoval(ctx)
	return nil
}

// watchRemoval stops the node when it leaves its cluster: its embedded
// member stopped — etcd stops a member the cluster removed — or its
// registration disappeared (a client node runs no member). Either closes
// n.done; n.err is set when the member stopped without being removed.
func (n *Node) watchRemoval(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.meta.MemberStopped():
			if err := n.meta.MemberErr(); !errors.Is(err, meta.ErrMemberRemoved) {
				n.log.Error("this node's etcd member stopped; stopping", "err", err)
				n.err = err
			} else {
				n.log.Error("this node was removed from the cluster; stopping")
				n.leaveCluster()
			}
			close(n.done)
			return
		case <-t.C:
		}
		// Only a linearizable answer counts: one from a local copy
		// (served while the quorum is lost) may lag behind this node's
		// registration, and would stop a node nobody removed.
		rctx, ri := meta.WithReadInfo(ctx)
		_, err := n.meta.Node(rctx, n.cfg.Name)
		if errs.IsCode(err, errs.CodeNotFound) && !ri.Local {
			n.log.Error("this node was removed from the cluster; stopping")
			n.leaveCluster()
			close(n.done)
			return
		}
	}
}

// refusedMember handles a start whose etcd member the other members no
// longer have (meta.ErrMemberRemoved, err): the node was removed while it
// was down. It leaves the cluster as a node that learns of its removal
// running does (leaveCluster), and says it was removed (NodeRemoved).
func (n *Node) refusedMember(st *joinState, err error) error {
	// The metadata never opened: the cluster's id is the one this node
	// last knew itself in (knownIn, without the metadata to compare).
	if st != nil {
		n.clusterID = st.ClusterID
	} else if b, rerr := os.ReadFile(n.registeredPath()); rerr == nil {
		n.clusterID = strings.TrimSpace(string(b))
	}
	n.log.Error("this node was removed from the cluster while it was down; not starting", "err", err)
	n.leaveCluster()
	return cluster.NodeRemoved(n.cfg.Name, n.clusterID)
}

// removedPath marks a data directory whose node was removed from its
// cluster (it holds the cluster's id): a start on it is refused at once.
func (n *Node) removedPath() string { return filepath.Join(n.cfg.Data, "removed") }

// leaveCluster, once this node knows itself removed, marks its data
// directory so (removedPath), then deletes its copy of the cluster CA's
// private key: a removed node's disk — decommissioned, reused, handed
// back — must not keep a key that signs identities the cluster trusts.
// The marker comes first: a start on the directory then says the node
// was removed rather than that the key is missing.
func (n *Node) leaveCluster() {
	if err := pki.WriteFileAtomic(n.removedPath(), []byte(n.clusterID+"\n"), 0o600); err != nil {
		n.log.Error("removed: cannot mark the data directory; the CA key stays", "err", err)
		return
	}
	pkiDir := filepath.Join(n.cfg.Data, "pki")
	if err := os.Remove(filepath.Join(pkiDir, "ca-key.pem")); err != nil && !errors.Is(err, os.ErrNotExist) {
		n.log.Error("removed: cannot delete the cluster CA's key", "err", err)
		return
	}
	if d, err := os.Open(pkiDir); err == nil {
		d.Sync() // the deletion, durable
		d.Close()
	}
	n.log.Info("removed: the cluster CA's key is deleted from this node's data directory", "dir", pkiDir)
}

// refuseRemoved refuses a start on the data directory of a node that was
// removed from its cluster (leaveCluster).
func (n *Node) refuseRemoved() error {
	b, err := os.ReadFile(n.removedPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removal marker: %w", err)
	}
	return cluster.NodeRemoved(n.cfg.Name, strings.TrimSpace(string(b)))
}

// Done is closed when the node stops by itself: removed from its cluster
// (Err nil), or its etcd member failed (Err says how). The process should
// stop.
func (n *Node) Done() <-chan struct{} { return n.done }

// Err is why the node stopped by itself, once Done is closed: nil when it
// was removed from its cluster.
func (n *Node) Err() error {
	select {
	case <-n.done:
		return n.err
	default:
		return nil
	}
}

// attachmentURI is the NBD URI of attachment a on the node that serves it
// (volume.Service.ServingNode).
func (n *Node) attachmentURI(ctx context.Context, a *meta.Attachment) string {
	node, err := n.volumes.ServingNode(ctx, a)
	if err != nil || node == n.cfg.Name {
		if err != nil {
			n.log.Warn("serving node of an attachment", "attachment", a.ID, "err", err)
		}
		return n.nbdURI + a.Export
	}
	rec, err := n.meta.Node(ctx, node)
	if err != nil || rec.NBD == "" {
		n.log.Warn("serving node's NBD address unknown", "node", node, "err", err)
		return n.nbdURI + a.Export
	}
	return rec.NBD + a.Export
}
