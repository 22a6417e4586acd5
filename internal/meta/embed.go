package meta

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
)

// EmbedConfig configures the embedded etcd member.
type EmbedConfig struct {
	Name string
	Dir  string // DATA/meta
	// ClientAddr and PeerAddr are host:port to listen on.
	ClientAddr, PeerAddr string
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

// DefaultQuotaBytes is the embedded member's space quota (etcd recommends at
// most 8 GiB; basalt's metadata is small).
const DefaultQuotaBytes = 4 << 30

func startEmbedded(c EmbedConfig, log *slog.Logger) (*embed.Etcd, string, error) {
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newZapLogger(log))
	clientURL := url.URL{Scheme: "https", Host: c.ClientAddr}
	peerURL := url.URL{Scheme: "https", Host: c.PeerAddr}
	cfg.ListenClientUrls = []url.URL{clientURL}
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
	tls := transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CAFile, ClientCertAuth: true}
	cfg.ClientTLSInfo = tls
	cfg.PeerTLSInfo = tls
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	ret := c.CompactionRetention
	if ret == 0 {
		ret = time.Hour
	}
	cfg.AutoCompactionRetention = ret.String()
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
		e.Close()
		return nil, "", fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		e.Close()
		return nil, "", fmt.Errorf("embedded etcd not ready after 60s")
	}
	log.Info("embedded etcd ready", "name", c.Name, "client", clientURL.String(), "dir", c.Dir)
	return e, clientURL.String(), nil
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
// node remove`), which has stopped.
var ErrMemberRemoved = errors.New("this node's etcd member was removed from the metadata cluster")

// ownMember reports whether the embedded member still serves this node —
// it runs and is in the member list by its own account — and whether it is
// a learner. Never etcd's IsLearner: it panics once the member is no
// longer in its own member list, which a removed member is from the moment
// it applies its removal until it stops, a second later.
func (s *Store) ownMember() (serves, learner bool) {
	if s.local == nil {
		return false, false
	}
	select {
	case <-s.embedded.Server.StoppingNotify():
		return false, false
	default:
	}
	m := s.embedded.Server.Cluster().Member(s.embedded.Server.MemberID())
	return m != nil, m != nil && m.IsLearner
}

// localCopy is the client that serves serializable reads from a copy of
// the metadata near this node: its own member while that serves, else the
// cluster client (a client node, or a member removed or stopped).
func (s *Store) localCopy() *clientv3.Client {
	if serves, _ := s.ownMember(); serves {
		return s.local
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
// the member stopped and closes memberStopped.
func (s *Store) watchMember() {
	select {
	case <-s.closed:
		return
	case <-s.embedded.Server.StoppingNotify():
	}
	select {
	case <-s.closed:
		return // Close stopped it
	default:
	}
	id := s.embedded.Server.MemberID()
	s.log.Warn("embedded etcd member stopped", "member", id.String())
	go s.closeMember()
	listed := false
	var others []string
	for _, m := range s.embedded.Server.Cluster().Members() {
		if m.ID == id {
			listed = true
		} else {
			others = append(others, m.ClientURLs...)
		}
	}
	if len(others) > 0 {
		s.cli.SetEndpoints(others...)
	}
	s.memberErr = s.stopCause(uint64(id), listed)
	close(s.memberStopped)
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
// says. Without an embedded member it is never closed.
func (s *Store) MemberStopped() <-chan struct{} { return s.memberStopped }

// MemberErr is why the embedded member stopped (ErrMemberRemoved: it was
// removed), once MemberStopped is closed; nil before.
func (s *Store) MemberErr() error {
	select {
	case <-s.memberStopped:
		return s.memberErr
	default:
		return nil
	}
}

// closeMember stops the embedded member and its listeners, once (a second
// embed.Close panics).
func (s *Store) closeMember() {
	s.closeMemberOnce.Do(s.embedded.Close)
}
