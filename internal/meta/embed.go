package meta

import (
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
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
