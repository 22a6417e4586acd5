package meta

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/basalt-storage/basalt/internal/pki"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EmbedConfig configures the embedded etcd member.
type EmbedConfig struct {
	Name string
	Dir  string // DATA/meta
	// ClientAddr and PeerAddr are host:port to listen on.
	ClientAddr, PeerAddr string
	// HTTPAddr is host:port for the member's HTTP endpoints (/metrics,
	// /health, /version), with the same TLS as the client port; empty
	// means a free loopback port. They are kept off the client port so
	// that it serves gRPC alone: sharing it, etcd hands every gRPC call
	// to net/http first (grpc.Server.ServeHTTP), which costs each Range
	// and Txn 0.1-0.2 ms more here (bench/RESULTS.md, session 22).
	HTTPAddr string
	// AdvertiseHost replaces the listen host in advertised URLs when set.
	AdvertiseHost string
	// TLS material: the node's certificate and the cluster CA. Both client
	// and peer traffic are TLS and require a certificate from the CA, so a
	// local user cannot reach the metadata (which holds the CA key and S3
	// secrets) by connecting to the loopback port.
	CertFile, KeyFile, CAFile string
	// QuotaBytes is etcd's space quota; beyond it etcd raises NOSPACE and
	// refuses writes until compacted and defragmented.
	QuotaBytes int64
	// CompactionRetention is how much history periodic auto-compaction keeps.
	CompactionRetention time.Duration
	// InitialCluster, when set, makes the member join an existing cluster
	// (as the learner it was added as): "name=peerURL,..." of every
	// member, itself included. Empty: a new single-member cluster. Once
	// the member has data in Dir, etcd ignores both.
	InitialCluster string
}

// MaxTxnOps is the most comparisons, and the most writes, one transaction
// may have: the embedded member's setting, which an external etcd needs
// too (its --max-txn-ops).
const MaxTxnOps = 1024

// DefaultQuotaBytes is the embedded member's space quota (etcd recommends at
// most 8 GiB; basalt's metadata is small).
const DefaultQuotaBytes = 4 << 30

// startEmbedded starts the member of mc.Embed and waits until it is ready.
// A member the cluster removed while it was down (`basalt node remove` of
// a dead node) stops within moments, its peers refusing it: that is
// reported as ErrMemberRemoved (memberRefused), so that the node can say
// it was removed rather than that etcd would not start.
func startEmbedded(mc Config, log *slog.Logger) (*embed.Etcd, string, error) {
	c := mc.Embed
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newZapLogger(log))
	clientURL := url.URL{Scheme: "https", Host: c.ClientAddr}
	peerURL := url.URL{Scheme: "https", Host: c.PeerAddr}
	cfg.ListenClientUrls = []url.URL{clientURL}
	httpURL := url.URL{Scheme: "https", Host: c.HTTPAddr}
	if httpURL.Host == "" {
		httpURL.Host = "127.0.0.1:0"
	}
	cfg.ListenClientHttpUrls = []url.URL{httpURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertiseClientUrls = []url.URL{advertised(clientURL, c.AdvertiseHost)}
	cfg.AdvertisePeerUrls = []url.URL{advertised(peerURL, c.AdvertiseHost)}
	cfg.InitialCluster = cfg.InitialClusterFromName(c.Name)
	cfg.ClusterState = embed.ClusterStateFlagNew
	if c.InitialCluster != "" {
		cfg.InitialCluster = c.InitialCluster
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.InitialClusterToken = "basalt"
	cfg.ListenMetricsUrls = nil
	cfg.GRPCAdditionalServerOptions = []grpc.ServerOption{grpc.ChainUnaryInterceptor(answerStatusPanic)}
	// Clients and peers alike must present a node's certificate: the CA
	// also signs users' certificates (for the API), and a user must not
	// reach etcd (pki.MemberName).
	tls := transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CAFile, ClientCertAuth: true,
		AllowedHostnames: []string{pki.MemberName}}
	cfg.ClientTLSInfo = tls
	cfg.PeerTLSInfo = tls
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	ret := c.CompactionRetention
	if ret == 0 {
		ret = time.Hour
	}
	cfg.AutoCompactionRetention = ret.String()
	// A transaction commits with a comparison per key it read (stm.go):
	// attaching a volume reads each of its attachments, of which a
	// read-only volume may have hundreds. etcd's default refuses a
	// transaction of more than 128.
	cfg.MaxTxnOps = MaxTxnOps
	cfg.QuotaBackendBytes = c.QuotaBytes
	if cfg.QuotaBackendBytes == 0 {
		cfg.QuotaBackendBytes = DefaultQuotaBytes
	}
	// Reclaim space at start when at least 64 MiB would be freed: the
	// offline half of the defrag path (the online half is Store.Defrag).
	cfg.BootstrapDefragThresholdMegabytes = 64
	if err := os.MkdirAll(filepath.Dir(c.Dir), 0o700); err != nil {
		return nil, "", err
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return nil, "", stoppedBeforeReady(e, mc, fmt.Errorf("embedded etcd: %w", err), log)
	case <-e.Server.StoppingNotify():
		return nil, "", stoppedBeforeReady(e, mc, errors.New("embedded etcd stopped before it was ready (see etcd's log)"), log)
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		e.Close()
		return nil, "", fmt.Errorf("embedded etcd not ready after 60s")
	}
	// Say where the HTTP endpoints are when their port was left to the
	// kernel: the listener on a port other than the client one.
	if _, port, _ := net.SplitHostPort(httpURL.Host); port == "0" {
		_, clientPort, _ := net.SplitHostPort(c.ClientAddr)
		for _, l := range e.Clients {
			if _, p, _ := net.SplitHostPort(l.Addr().String()); p != clientPort {
				httpURL.Host = l.Addr().String()
			}
		}
	}
	log.Info("embedded etcd ready", "name", c.Name, "client", clientURL.String(), "http", httpURL.String(), "dir", c.Dir)
	if len(e.Server.Cluster().Members()) > 1 {
		// Only a member with peers has peer streams: a node that starts
		// alone is not warned (the nodes joining it are, at their start,
		// and it is at its next).
		checkPeerRetransmit(log, rtoMaxPath)
	}
	return e, clientURL.String(), nil
}

// stoppedBeforeReady closes e, whose start failed with cause, and returns
// the error to report: ErrMemberRemoved when its server stopped because
// the cluster no longer has it as a member, else cause. etcd does not say
// why its server stopped (a peer's refusal only goes to its log), so the
// other members are asked, as stopCause does for a running member.
func stoppedBeforeReady(e *embed.Etcd, c Config, cause error, log *slog.Logger) error {
	select {
	case <-e.Server.StoppingNotify():
	default:
		e.Close() // the server runs: cause is not about membership
		return cause
	}
	id, cid := e.Server.MemberID(), e.Server.Cluster().ID()
	peers := otherClientURLs(e, c.Endpoints)
	e.Close()
	if len(peers) == 0 {
		return cause // no one to ask: the cluster's only member
	}
	if !memberRefused(uint64(id), uint64(cid), peers, c.ClientTLS) {
		return cause
	}
	log.Warn("the other etcd members no longer list this node's member: it was removed from the cluster", "member", id.String(), "cause", cause)
	return fmt.Errorf("%w (member %s; asked %v)", ErrMemberRemoved, id, peers)
}

// otherClientURLs are the client URLs of the members e knows other than
// itself (its own view, as of its last run), then the endpoints this node
// was configured with (a joined node's voters) not its own.
func otherClientURLs(e *embed.Etcd, configured []string) []string {
	own := map[string]bool{}
	for _, u := range e.Config().AdvertiseClientUrls {
		own[u.String()] = true
	}
	id := e.Server.MemberID()
	var urls []string
	add := func(u string) {
		if !own[u] && !slices.Contains(urls, u) {
			urls = append(urls, u)
		}
	}
	for _, m := range e.Server.Cluster().Members() {
		if m.ID != id {
			for _, u := range m.ClientURLs {
				add(u)
			}
		}
	}
	for _, u := range configured {
		add(u)
	}
	return urls
}

// memberRefused reports whether the etcd cluster of id cid, reached at
// endpoints, answers (linearizably) with a member list that lacks member
// id: the member was removed. No answer, or one from another cluster,
// is not taken for a removal: what the node does on a removal (it deletes
// its copy of the CA key) must rest on the cluster's own word.
func memberRefused(id, cid uint64, endpoints []string, tlsCfg *tls.Config) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second,
		TLS: tlsCfg, Context: ctx, Logger: zapNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(retryStopped)}})
	if err != nil {
		return false
	}
	defer cli.Close()
	r, err := cli.MemberList(ctx)
	if err != nil || r.Header == nil || r.Header.ClusterId != cid {
		return false
	}
	for _, m := range r.Members {
		if m.ID == id {
			return false
		}
	}
	return true
}

// statusMethod is etcd's Status RPC (etcdctl endpoint status).
const statusMethod = "/etcdserverpb.Maintenance/Status"

// answerStatusPanic turns a panic of etcd's Status handler into an error
// answer. The handler asks whether the member is a learner, which panics
// from the moment a member applies its own removal until it stops — a
// second in which any node or tool asking it for its status (a client
// node's remoteStatus, read from a member list taken a moment before)
// would take this whole node down with it. Other handlers' panics are
// etcd's own verdicts and are left alone.
func answerStatusPanic(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	if info.FullMethod != statusMethod {
		return handler(ctx, req)
	}
	defer func() {
		if r := recover(); r != nil {
			resp, err = nil, status.Errorf(codes.Unavailable, "this etcd member is leaving the cluster: %v", r)
		}
	}()
	return handler(ctx, req)
}

func advertised(u url.URL, host string) url.URL {
	if host == "" {
		return u
	}
	_, port, _ := splitHostPort(u.Host)
	u.Host = joinHostPort(host, port)
	return u
}

// ErrMemberRemoved: the cluster removed this node's etcd member (`basalt
// node remove`), which has stopped — while it ran (MemberErr), or before
// this start (Open and StartMember: the other members refused it).
var ErrMemberRemoved = errors.New("this node's etcd member was removed from the metadata cluster")

// startMember starts the embedded member of c.Embed and a client of it
// alone.
func startMember(ctx context.Context, c Config, log *slog.Logger) (*member, string, error) {
	e, url, err := startEmbedded(c, log)
	if err != nil {
		return nil, "", err
	}
	local, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second,
		TLS: c.ClientTLS, Context: ctx, Logger: zapNop()})
	if err != nil {
		e.Close()
		return nil, "", fmt.Errorf("connect to the embedded member: %w", err)
	}
	return &member{e: e, local: local, stopped: make(chan struct{})}, url, nil
}

// StartMember gives a node that runs no etcd member one: a client node
// that was added to the cluster as a learner (c.Embed.InitialCluster names
// every member, this one included). From then on the Store serves reads
// from that member once it votes, as if it had been started with it.
func (s *Store) StartMember(ctx context.Context, c Config) error {
	if s.mem.Load() != nil {
		return errors.New("this node runs an etcd member already")
	}
	// The member's client lives as long as the store, not as ctx.
	m, _, err := startMember(context.WithoutCancel(ctx), c, s.log)
	if err != nil {
		return err
	}
	if !s.mem.CompareAndSwap(nil, m) {
		m.local.Close()
		m.close()
		return errors.New("this node runs an etcd member already")
	}
	select {
	case <-s.closed: // Close may have run before the swap: it missed m
		m.local.Close()
		m.close()
		return errors.New("metadata store closed")
	default:
	}
	go s.watchMember(m)
	return nil
}

// ownMember returns the embedded member (nil without one) and whether it
// still serves this node — it runs and is in the member list by its own
// account — and whether it is a learner. Never etcd's IsLearner: it
// panics once the member is no longer in its own member list, which a
// removed member is from the moment it applies its removal until it
// stops, a second later.
func (s *Store) ownMember() (m *member, serves, learner bool) {
	m = s.mem.Load()
	if m == nil {
		return nil, false, false
	}
	select {
	case <-m.e.Server.StoppingNotify():
		return m, false, false
	default:
	}
	mm := m.e.Server.Cluster().Member(m.e.Server.MemberID())
	return m, mm != nil, mm != nil && mm.IsLearner
}

// localCopy is the client that serves serializable reads from a copy of
// the metadata near this node: its own member while that serves, else the
// cluster client (a client node, or a member removed or stopped).
func (s *Store) localCopy() *clientv3.Client {
	if m, serves, _ := s.ownMember(); serves {
		return m.local
	}
	return s.cli
}

// watchMember waits for the embedded member to stop by itself: etcd stops
// a member the cluster removed, and one that met a fatal error. Then it
// starts closing the member's listeners (etcd's own status handlers panic
// on a removed member; closing takes seconds, as etcd first tries to hand
// its leadership over), points the cluster client at the other members
// so that the node can still release what it holds while it shuts down
// (the first node's client may know no other endpoint yet), records why
// the member stopped and closes m.stopped.
func (s *Store) watchMember(m *member) {
	select {
	case <-s.closed:
		return
	case <-m.e.Server.StoppingNotify():
	}
	select {
	case <-s.closed:
		return // Close stopped it
	default:
	}
	id := m.e.Server.MemberID()
	s.log.Warn("embedded etcd member stopped", "member", id.String())
	go m.close()
	listed := false
	var others, learners []string
	for _, mm := range m.e.Server.Cluster().Members() {
		switch {
		case mm.ID == id:
			listed = true
		case mm.IsLearner:
			learners = append(learners, mm.ClientURLs...)
		default:
			others = append(others, mm.ClientURLs...)
		}
	}
	// The voters, as in RemoveMember: a learner refuses what the node
	// still has to write. Learners only when the member's view, which
	// may be stale (it was cut off), names no voter: one of them may
	// have been promoted since.
	if len(others) == 0 {
		others = learners
	}
	if len(others) > 0 {
		s.cli.SetEndpoints(others...)
	}
	m.err = s.stopCause(uint64(id), listed)
	close(m.stopped)
}

// stopCause says why the member stopped: ErrMemberRemoved when it is no
// longer a member, else an error saying it failed. It asks the other
// members (a member removed while it was cut off learns it from their
// refusals and never applies its removal itself): their linearizable
// answer also means they have a leader again — the removed member may
// have been theirs — so that what the node releases next goes through at
// once. Without their answer, its own view decides.
func (s *Store) stopCause(id uint64, listed bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := s.cli.MemberList(ctx)
	if err != nil {
		if !listed {
			return ErrMemberRemoved
		}
		return fmt.Errorf("embedded etcd member %x stopped (see etcd's log); the other members cannot say whether it was removed: %w", id, err)
	}
	for _, m := range r.Members {
		if m.ID == id {
			return fmt.Errorf("embedded etcd member %x stopped while still a member of the cluster (see etcd's log)", id)
		}
	}
	return ErrMemberRemoved
}

// MemberStopped is closed when the embedded member stopped by itself
// rather than by Close: removed from the cluster or failed, as MemberErr
// says. Without an embedded member it is nil (never closed); a caller
// that waits for it must ask again after StartMember.
func (s *Store) MemberStopped() <-chan struct{} {
	if m := s.mem.Load(); m != nil {
		return m.stopped
	}
	return nil
}

// MemberErr is why the embedded member stopped (ErrMemberRemoved: it was
// removed), once MemberStopped is closed; nil before.
func (s *Store) MemberErr() error {
	m := s.mem.Load()
	if m == nil {
		return nil
	}
	select {
	case <-m.stopped:
		return m.err
	default:
		return nil
	}
}

// close stops the member and its listeners, once (a second embed.Close
// panics).
func (m *member) close() {
	m.closeOnce.Do(m.e.Close)
}
