// Package server assembles one basalt node: it lays out the data directory,
// brings up the PKI and the metadata store (embedded etcd or external),
// bootstraps the admin identity, starts the services and the API listener,
// and shuts all of it down in reverse order.
//
// Start order (each step needs the previous ones):
//
//	data dir → service ports bound (ports.go) → CA + node certificate → metadata (etcd, TLS with those certs)
//	→ cluster bootstrap (one CA for the cluster) → store → admin identity
//	→ owned index (what versions without it wrote, indexed)
//	→ volume service (resumes interrupted workflows) → API listener → ready
//
// Callers: cmd/basalt's `server` command and nothing else.
package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/keys"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/metrics"
	"github.com/basalt-storage/basalt/internal/nbd"
	"github.com/basalt-storage/basalt/internal/objects"
	"github.com/basalt-storage/basalt/internal/pki"
	"github.com/basalt-storage/basalt/internal/store"
	"github.com/basalt-storage/basalt/internal/user"
	"github.com/basalt-storage/basalt/internal/volume"
	"github.com/versity/versitygw/s3api"
)

// Version is the build's version, set by the Makefile.
var Version = "dev"

// Config is everything `basalt server` is told.
type Config struct {
	Data  string
	Store string
	API   string
	S3    string // S3 listen address
	// S3TrustFile is where a uid vouches for the S3 user mapped to it
	// (objects.Config.TrustFile; empty: the default).
	S3TrustFile string
	S3TLSConfig // HTTPS of the S3 gateway (s3_tls.go)
	NBD         string
	// NBDInsecure allows NBD without TLS on a non-loopback address.
	NBDInsecure bool
	// NBDMaxInFlight bounds the NBD payload in flight across all
	// connections (0: nbd's default).
	NBDMaxInFlight int64
	// NBDMaxHandshakes bounds the NBD connections in the handshake at
	// once (0: nbd's default).
	NBDMaxHandshakes int
	EtcdClient       string
	EtcdPeer         string
	EtcdHTTP         string // the embedded member's /metrics and /health ("": a free loopback port)
	Metrics          string // basalt's /metrics, plain HTTP ("": not served, nothing counted)
	Name             string
	Advertise        string
	MetaEndpoints    []string
	Overcommit       float64
	ImageGrace       time.Duration
	MetaQuota        int64
	// Join is a running node's API URL: join its cluster (membership.go),
	// authenticated by the admin identity in JoinIdentity or by JoinToken.
	Join, JoinIdentity, JoinToken string
	// Voters is how many voters a new cluster grows to (3 or 5).
	Voters int
}

// Node is a running basalt node.
type Node struct {
	cfg  Config
	log  *slog.Logger
	meta *meta.Store
	// metaCfg is the metadata configuration before a join adapted it
	// (metaConfig): what a client node's member starts with (stepUp).
	metaCfg   meta.Config
	volumes   *volume.Service
	users     *user.Service
	api       *api.Server
	http      *http.Server
	apiAddr   string
	clusterID string
	started   time.Time
	store     *store.Store
	ports     ports // bound first, until each service takes its own (ports.go)
	nbd       *nbd.Server
	nbdURI    string                            // scheme://host:port/ without the export name
	s3        atomic.Pointer[s3api.S3ApiServer] // the gateway serving now (superviseS3 may start another)
	objects   *objects.Backend
	s3Stop    context.CancelFunc // ends the S3 gateway's metadata mirrors
	s3Closing atomic.Bool        // set before the S3 server is shut down: its serving then ends as asked
	// usersByName mirrors the user records (API authentication, S3
	// bucket owners) until stopMirror.
	usersByName *meta.Mirror[*meta.User]
	stopMirror  context.CancelFunc
	cancel      context.CancelFunc
	cluster     *cluster.Service
	// done is closed, err set, when the node stops by itself (see
	// watchRemoval).
	done chan struct{}
	err  error
	// stopBelonging ends registration upkeep (liveness, promotion) and
	// returns once the liveness key is revoked.
	stopBelonging func()
	AdminDir      string
	// metrics holds the node's series (nil without --metrics); served
	// by metricsHTTP (metrics.go).
	metrics     *metrics.Registry
	metricsHTTP *http.Server
	// dataLock is DATA/lock, flocked while the node runs (lockData).
	dataLock *os.File
	// cert is the node certificate the API, NBD and the etcd client
	// present, replaced when renewed (certrenew.go).
	cert atomic.Pointer[tls.Certificate]
	// reloadS3Cert has the S3 gateway present its certificate as now on
	// disk, renewed first when it is the cluster CA's (nil: plain HTTP).
	reloadS3Cert func() error
	// ca is the cluster CA, once openMeta has settled it.
	ca *pki.CA
}

// Start brings a node up and returns once it serves. Stop it with Close.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Node, error) {
	n := &Node{cfg: cfg, log: log, started: time.Now().UTC(), done: make(chan struct{})}
	if err := n.start(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

func (n *Node) start(ctx context.Context) error {
	cfg := n.cfg
	log := n.log
	var err error
	if cfg.Name == "" {
		cfg.Name, _ = os.Hostname()
	}
	// Before anything starts: etcd would take the name as it is and the
	// registration refuse it only afterwards.
	if err := meta.CheckNodeName(cfg.Name); err != nil {
		return fmt.Errorf("--name: %w", err)
	}
	// So are the S3 gateway's TLS settings: refused only once the gateway
	// starts, they would leave a cluster made, or a join granted (a
	// learner whose member never comes back), for a typo.
	if err := n.checkS3TLS(); err != nil {
		return err
	}
	if cfg.Store == "" {
		cfg.Store = filepath.Join(cfg.Data, "store")
	}
	n.cfg = cfg
	if err := os.MkdirAll(cfg.Data, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	// Before anything in the directory is read or written: a second
	// server on it must change nothing.
	if n.dataLock, err = lockData(cfg.Data); err != nil {
		return err
	}
	if err := n.refuseRemoved(); err != nil {
		return err
	}
	if err := n.bindPorts(); err != nil {
		return err
	}
	cfg = n.cfg // with the S3 port bound
	if cfg.Metrics != "" {
		n.metrics = metrics.New()
		n.registerNodeMetrics()
	}
	pkiDir := filepath.Join(cfg.Data, "pki")
	joined, err := n.join(ctx, pkiDir)
	if err != nil {
		return err
	}
	ca, cert, err := n.openMeta(ctx, pkiDir, joined)
	if errors.Is(err, meta.ErrMemberRemoved) {
		// A voter removed while it was down: its member's peers refuse
		// it, so no metadata opens for checkNotRemoved to ask.
		return n.refusedMember(joined, err)
	}
	if err != nil {
		return err
	}
	n.ca = ca
	n.cluster = cluster.New(n.meta, ca, n.cfg.Name, log)
	if err := n.checkNotRemoved(ctx, joined); err != nil {
		if errs.IsCode(err, cluster.CodeNodeRemoved) {
			n.leaveCluster() // removed while it was down
		}
		return err
	}
	if err := n.checkNameFree(ctx, joined); err != nil {
		return err
	}
	storeID, err := n.identifyStore(ctx)
	if err != nil {
		return err
	}
	if n.store, err = store.Open(n.cfg.Store); err != nil {
		return err
	}
	n.store.ID = storeID
	mctx, stop := context.WithCancel(context.Background())
	n.stopMirror, n.usersByName = stop, n.meta.MirrorUsersByName(mctx)
	n.users = user.New(n.meta, ca)
	n.users.SetMirror(n.usersByName)
	// Removing a node revokes its local admin identity (bootstrapAdmin).
	n.cluster.SetRevoker(n.users.RevokeNode)
	n.users.SetS3(n.s3URL(), s3Region)
	if n.AdminDir, err = filepath.Abs(filepath.Join(cfg.Data, "identities", user.Admin)); err != nil {
		return err
	}
	if err := n.bootstrapAdmin(ctx, joined != nil); err != nil {
		return fmt.Errorf("admin identity: %w", err)
	}
	dataKey, err := n.meta.DataKey(ctx, keys.Generate())
	if err != nil {
		return fmt.Errorf("cluster data key: %w", err)
	}
	wrapper, err := keys.New(dataKey)
	if err != nil {
		return err
	}
	// Lists read the metadata's owned index: what versions without it
	// (or without its all-owners keys) wrote is indexed here
	// (meta.ReconcileOwnedIndex).
	if _, err := n.meta.ReconcileOwnedIndex(ctx); err != nil {
		return fmt.Errorf("owned index: %w", err)
	}
	grace := cfg.ImageGrace
	if grace == 0 {
		grace = -1 // explicitly none (the service's zero means the default)
	}
	if err := n.startS3(); err != nil {
		return err
	}
	var objs volume.Objects
	if n.objects != nil {
		objs = n.objects
	}
	// The liveness key first: while a node has none, the others adopt
	// the workflows recorded for it — those its Start resumes now.
	bg, cancel := context.WithCancel(context.Background())
	alive := make(chan struct{})
	n.stopBelonging = func() { cancel(); <-alive }
	go func() {
		defer close(alive)
		n.meta.KeepAlive(bg, n.cfg.Name)
	}()
	n.volumes = volume.New(n.meta, n.store, volume.Config{
		Node: n.cfg.Name, Overcommit: cfg.Overcommit, Keys: wrapper, ImageGrace: grace,
		AdoptAll: n.single(ctx), AdoptOrphans: true, Objects: objs,
	}, log)
	if err := n.volumes.Start(ctx); err != nil {
		return err
	}
	if err := n.startNBD(ca); err != nil {
		return err
	}
	n.api = api.New(api.Deps{
		Volumes: n.volumes, Users: n.users, Status: n.status, Healthy: n.meta.Health,
		Defrag: n.meta.Defrag, Log: log, NBDURI: n.attachmentURI,
		Objects: n.objects, Bucket: n.meta.Bucket, Cluster: n.cluster, CACert: ca.CertPEM,
		Metrics: n.metrics,
	})
	ln := n.ports.api
	n.ports.api = nil
	n.apiAddr = ln.Addr().String()
	n.http = &http.Server{
		Handler:           n.api,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	apiTLS := api.TLSConfig(cert)
	apiTLS.Certificates, apiTLS.GetCertificate = nil, n.serverCert // renewed while running
	go func() {
		if err := n.http.Serve(tls.NewListener(ln, apiTLS)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("api server stopped", "err", err)
		}
	}()
	n.serveMetrics()
	if err := n.belong(bg, joined); err != nil {
		return err
	}
	go n.keepAdminIdentity(bg)
	go n.keepCertificates(bg, ca)
	n.api.SetReady(true)
	log.Info("node ready", "name", n.cfg.Name, "api", "https://"+n.apiAddr, "store", n.store.Root,
		"admin_identity", n.AdminDir, "cluster", n.clusterID)
	return nil
}

// startNBD serves attachments over NBD. On loopback TLS is offered; beyond
// loopback it is required (the spec's FORCEDTLS) unless NBDInsecure.
// Clients authenticate with certificates from the cluster CA.
func (n *Node) startNBD(ca *pki.CA) error {
	ln := n.ports.nbd
	n.ports.nbd = nil
	addr := ln.Addr().(*net.TCPAddr)
	requireTLS := !addr.IP.IsLoopback() && !n.cfg.NBDInsecure
	host, port, _ := n.advertised(addr.String()) // the bound port, for --nbd :0
	scheme := "nbd"
	if requireTLS {
		scheme = "nbds"
	}
	n.nbdURI = fmt.Sprintf("%s://%s/", scheme, net.JoinHostPort(host, port))
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	exports := n.volumes.NewExports(n.users.Authenticate)
	if n.metrics != nil {
		exports.CountRequests()
	}
	go exports.Run(ctx) // Open waits until it watches detaches
	n.nbd = &nbd.Server{
		Exports: exports,
		TLS: &tls.Config{
			GetCertificate: n.serverCert, // renewed while running
			ClientAuth:     tls.RequireAndVerifyClientCert,
			ClientCAs:      ca.Pool(),
			MinVersion:     tls.VersionTLS12,
		},
		RequireTLS:            requireTLS,
		MaxInFlightBytesTotal: n.cfg.NBDMaxInFlight,
		MaxHandshakes:         n.cfg.NBDMaxHandshakes,
		Log:                   n.log.With("component", "nbd"),
	}
	if n.metrics != nil {
		n.metrics.MustRegister(newNBDCollector(exports, n.nbd))
	}
	go func() {
		if err := n.nbd.Serve(ln); err != nil {
			n.log.Error("nbd server stopped", "err", err)
		}
	}()
	n.log.Info("nbd serving", "addr", addr.String(), "uri", n.nbdURI, "tls_required", requireTLS)
	return nil
}

// openMeta starts or connects to the metadata store and settles the cluster
// CA. With the embedded member the local CA comes first (etcd's own TLS
// needs it); with an external cluster the CA stored there wins, so every
// node sharing it trusts the same users.
func (n *Node) openMeta(ctx context.Context, pkiDir string, joined *joinState) (*pki.CA, tls.Certificate, error) {
	var ca *pki.CA
	var err error
	if joined != nil {
		if ca, err = pki.LoadCA(filepath.Join(pkiDir, "ca.pem"), filepath.Join(pkiDir, "ca-key.pem")); err != nil {
			return nil, tls.Certificate{}, fmt.Errorf("the cluster CA this node joined with: %w", err)
		}
	} else if len(n.cfg.MetaEndpoints) == 0 {
		if ca, err = pki.LoadOrCreateCA(pkiDir); err != nil {
			return nil, tls.Certificate{}, err
		}
	} else if ca, err = pki.LoadCA(filepath.Join(pkiDir, "ca.pem"), filepath.Join(pkiDir, "ca-key.pem")); err != nil {
		if ca, err = pki.NewCA(); err != nil {
			return nil, tls.Certificate{}, err
		}
	}
	cert, err := ca.ServerCertificate(pkiDir, n.certNames())
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	n.cert.Store(&cert)
	// The certificate as renewed while running (certrenew.go).
	clientTLS := &tls.Config{GetClientCertificate: n.clientCert, RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	n.metaCfg = meta.Config{
		Endpoints: n.cfg.MetaEndpoints,
		ClientTLS: clientTLS,
		Embed: meta.EmbedConfig{
			Name: n.cfg.Name, Dir: filepath.Join(n.cfg.Data, "meta"),
			ClientAddr: n.cfg.EtcdClient, PeerAddr: n.cfg.EtcdPeer, HTTPAddr: n.cfg.EtcdHTTP, AdvertiseHost: n.cfg.Advertise,
			CertFile: filepath.Join(pkiDir, "server.pem"), KeyFile: filepath.Join(pkiDir, "server-key.pem"),
			CAFile: filepath.Join(pkiDir, "ca.pem"), QuotaBytes: n.cfg.MetaQuota,
		},
	}
	n.meta, err = meta.Open(ctx, n.metaConfig(n.metaCfg, joined), n.log)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	voters := n.cfg.Voters
	if voters == 0 {
		voters = 3
	}
	cl, certPEM, keyPEM, err := n.meta.Bootstrap(ctx, randomID(), voters, ca.CertPEM, ca.KeyPEM)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	n.clusterID = cl.ID
	if string(certPEM) == string(ca.CertPEM) {
		if !n.meta.Embedded() {
			// Our proposal became the cluster CA: keep it for restarts.
			if err := ca.Save(pkiDir); err != nil {
				return nil, tls.Certificate{}, err
			}
		}
		return ca, cert, nil
	}
	if n.meta.Embedded() || joined != nil {
		return nil, tls.Certificate{}, fmt.Errorf("%s holds a different CA than the metadata in %s; restore the pki directory that belongs to this data", pkiDir, filepath.Join(n.cfg.Data, "meta"))
	}
	// Adopt the cluster's CA.
	if ca, err = pki.ParseCA(certPEM, keyPEM); err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("cluster CA: %w", err)
	}
	if err := ca.Save(pkiDir); err != nil {
		return nil, tls.Certificate{}, err
	}
	if cert, err = ca.ServerCertificate(pkiDir, n.certNames()); err != nil {
		return nil, tls.Certificate{}, err
	}
	n.cert.Store(&cert)
	return ca, cert, nil
}

// certNames are the names the node certificate must carry: the host's,
// --advertise, and the host of every address the node listens on that
// names one — clients verify the certificate against the host of the URL
// they were given, and without --advertise an nbds:// URI or an S3
// endpoint names the --nbd or --s3 host, which may differ from --api's;
// a monitoring system scraping --etcd-http (TLS with this certificate)
// names that address's host.
func (n *Node) certNames() []string {
	host, _ := os.Hostname()
	names := []string{"localhost", "127.0.0.1", "::1", host}
	if n.cfg.Advertise != "" {
		names = append(names, n.cfg.Advertise)
	}
	for _, addr := range []string{n.cfg.API, n.cfg.S3, n.cfg.NBD, n.cfg.EtcdClient, n.cfg.EtcdPeer, n.cfg.EtcdHTTP} {
		h, _, err := net.SplitHostPort(addr)
		if err == nil && h != "" && h != "0.0.0.0" && h != "::" && !slices.Contains(names, h) {
			names = append(names, h)
		}
	}
	return names
}

// bootstrapAdmin makes sure the admin user exists and that this node holds
// a valid admin identity in DATA/identities/admin, whose certificate the
// admin record lists as this node's (meta.CertForNode): removing the node
// revokes it (cluster.Service.Remove), and a new one replaces it. A node
// that joined is given one only while it is registered and not being
// removed (RenewNodeIdentity): a removal running while it starts cannot
// leave it a listed certificate.
func (n *Node) bootstrapAdmin(ctx context.Context, joined bool) error {
	issuedFor := meta.CertForNode(n.cfg.Name)
	_, id, err := n.users.Create(ctx, user.Spec{Name: user.Admin, Admin: true, IssuedFor: issuedFor})
	if errs.IsCode(err, errs.CodeUserExists) {
		if c, _ := n.localAdmin(ctx); c != nil {
			// An admin record of a version before certificate lists
			// accepts the certificate by id; recorded, it stays
			// valid once the record lists its certificates.
			return n.users.RecordCertificate(ctx, user.Admin, c, issuedFor)
		}
		if joined {
			id, err = n.users.RenewNodeIdentity(ctx, n.cfg.Name)
		} else {
			id, err = n.users.IssueIdentity(ctx, user.Admin, issuedFor)
		}
	}
	if err != nil {
		return err
	}
	return id.Write(n.AdminDir)
}

// localAdmin returns the certificate of this node's admin identity if it
// authenticates and is valid for 30 more days (or as long as the CA, if
// less: pki.CA.RenewalDue). Else it returns nil, and
// renew says whether a new identity is due — none or a broken one, its
// certificate revoked, expired or about to — rather than the check unable
// to tell (the metadata unavailable).
func (n *Node) localAdmin(ctx context.Context) (c *x509.Certificate, renew bool) {
	id, err := pki.CheckWritten(n.AdminDir) // none, or a write cut short
	if err != nil {
		return nil, true
	}
	if c, err = pki.ParseCertPEM(id.CertPEM); err != nil {
		return nil, true
	}
	if _, err = n.users.Authenticate(ctx, []*x509.Certificate{c}); err != nil {
		e, ok := errs.As(err)
		return nil, ok && e.Kind == errs.KindUnauthenticated
	}
	// Due within 30 days of expiry — unless it expires with the CA: a
	// new one would expire no later, and renewing it at every check
	// would list a certificate a minute in admin's record.
	if n.ca.RenewalDue(c.NotAfter) {
		return nil, true
	}
	return c, false
}

// adminCheckEvery is how often a running node checks its local admin
// identity (keepAdminIdentity).
var adminCheckEvery = time.Minute

// keepAdminIdentity renews this node's local admin identity while the
// node runs, as its start does (bootstrapAdmin): once admin's credentials
// were renewed — which revokes every earlier certificate of admin, this
// node's too — or when it comes within 30 days of expiry. Without it the
// identity the node's CLI uses stays refused until the next restart. A
// node being removed is not given one again (RenewNodeIdentity).
func (n *Node) keepAdminIdentity(ctx context.Context) {
	for range ticks(ctx, adminCheckEvery) {
		if c, renew := n.localAdmin(ctx); c != nil || !renew {
			continue
		}
		id, err := n.users.RenewNodeIdentity(ctx, n.cfg.Name)
		if err == nil {
			err = id.Write(n.AdminDir)
		}
		if err != nil {
			n.log.Warn("local admin identity revoked or about to expire; renewing it failed", "dir", n.AdminDir, "err", err)
			continue
		}
		n.log.Info("local admin identity renewed: it was revoked (new credentials for admin) or about to expire", "dir", n.AdminDir)
	}
}

// Name is the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// APIAddr is the address the API listens on.
func (n *Node) APIAddr() string { return n.apiAddr }

// Close shuts the node down: stop accepting, finish in-flight requests, stop
// jobs (their records resume at next start), close the metadata store.
func (n *Node) Close() {
	n.closePorts()
	if n.api != nil {
		n.api.SetReady(false)
	}
	if n.nbd != nil {
		// Requests already received are answered (nbd.Server.Shutdown)
		// while this node still holds its volumes' write leases.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n.nbd.Shutdown(ctx)
		cancel()
	}
	if n.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n.http.Shutdown(ctx)
		cancel()
	}
	if n.metricsHTTP != nil {
		n.metricsHTTP.Close()
	}
	n.s3Closing.Store(true) // before the load: see superviseS3
	if srv := n.s3.Load(); srv != nil {
		if err := srv.ShutDown(); err != nil {
			n.log.Warn("s3 server shutdown", "err", err)
		}
	}
	if n.s3Stop != nil {
		n.s3Stop()
	}
	if n.stopMirror != nil {
		n.stopMirror()
	}
	if n.cancel != nil {
		n.cancel()
	}
	if n.volumes != nil {
		n.volumes.Stop()
	}
	if n.stopBelonging != nil {
		// The liveness key goes once the volume service has stopped:
		// without it, the other nodes adopt the workflows recorded for
		// this one (volume/orphans.go) at once, and none of them may
		// still run here then.
		n.stopBelonging()
	}
	if n.meta != nil {
		n.meta.Close()
	}
	// Last: the data directory is free once its etcd member is stopped.
	if n.dataLock != nil {
		n.dataLock.Close()
		n.dataLock = nil
	}
}

// storeProbeTimeout bounds the store's check in a status answer: a
// stalled file system is reported, not waited for.
const storeProbeTimeout = 5 * time.Second

func (n *Node) status(ctx context.Context) api.Status {
	st := api.Status{Node: api.NodeStatus{Name: n.cfg.Name, Version: Version, ClusterID: n.clusterID,
		StartedAt: n.started, API: "https://" + n.apiAddr, NBD: n.nbdURI}}
	ms, err := n.meta.Status(ctx)
	if err == nil {
		err = n.meta.Health(ctx)
	}
	st.Metadata = api.MetadataStatus{Healthy: err == nil, Embedded: n.meta.Embedded()}
	if err != nil {
		st.Metadata.Error = err.Error()
	}
	if ms != nil {
		st.Metadata.Endpoints, st.Metadata.Version, st.Metadata.Members = ms.Endpoints, ms.Version, ms.Members
		st.Metadata.DBSize, st.Metadata.Alarms = ms.DBSize, ms.Alarms
	}
	st.Store.Path = n.store.Root
	err = n.store.Probe(storeProbeTimeout)
	if err == nil {
		var c *volume.Capacity
		if c, err = n.volumes.Capacity(ctx); err == nil {
			st.Store.TotalBytes, st.Store.FreeBytes = c.TotalBytes, c.FreeBytes
			st.Store.ProvisionedBytes, st.Store.LimitBytes, st.Store.Overcommit = c.ProvisionedBytes, c.LimitBytes, c.Overcommit
		}
	}
	st.Store.Healthy = err == nil
	if err != nil {
		st.Store.Error = err.Error()
	}
	return st
}

func randomID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}
