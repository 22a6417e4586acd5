package meta

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Config chooses between the embedded member and an external cluster.
type Config struct {
	// Endpoints of an external etcd cluster; empty means run Embed. With
	// Embed.InitialCluster (a member joining a cluster) they are the
	// voters this node talks to until its own member is promoted.
	Endpoints []string
	// TLS for external endpoints (nil: plain http or system roots).
	ExternalTLS *tls.Config
	Embed       EmbedConfig
	// ClientTLS is how this node authenticates to its embedded member.
	ClientTLS *tls.Config
}

// Store is a connection to basalt's metadata.
type Store struct {
	cli *clientv3.Client
	// mem is this node's own etcd member (nil without one). A client
	// node gains one when it becomes a voter (StartMember); it is never
	// replaced after that.
	mem    atomic.Pointer[member]
	log    *slog.Logger
	q      quorum
	closed chan struct{} // closed by Close
	// mirrors are the Mirrors running on this store, told of the writes
	// it commits (mirrorsWrote).
	mirrorsMu sync.Mutex
	mirrors   map[ownWrites]bool
}

// member is an embedded etcd member and what watches it.
type member struct {
	e *embed.Etcd
	// local talks to e alone: serializable reads are answered by this
	// node's own copy.
	local *clientv3.Client
	// closeOnce guards e.Close, which Close and watchMember may both call.
	closeOnce sync.Once
	// stopped is closed, err set, when e stops by itself (watchMember).
	stopped chan struct{}
	err     error
}

// requestTimeout bounds every metadata call so that losing quorum fails
// requests with a clear error instead of hanging them.
const requestTimeout = 10 * time.Second

// Open starts the embedded member (unless Endpoints are given) and connects.
func Open(ctx context.Context, c Config, log *slog.Logger) (*Store, error) {
	s := &Store{log: log, closed: make(chan struct{})}
	endpoints := c.Endpoints
	tlsCfg := c.ExternalTLS
	var m *member
	if len(endpoints) == 0 || c.Embed.InitialCluster != "" {
		var url string
		var err error
		if m, url, err = startMember(ctx, c, log); err != nil {
			return nil, err
		}
		s.mem.Store(m)
		if len(endpoints) == 0 {
			endpoints = []string{url}
		}
		tlsCfg = c.ClientTLS
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints,
		// Follow membership changes (promotions, removals, new voters).
		AutoSyncInterval:     30 * time.Second,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		TLS:                  tlsCfg,
		Context:              ctx,
		Logger:               zapNop(),
		DialOptions:          []grpc.DialOption{grpc.WithChainUnaryInterceptor(retryStopped)},
	})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("connect to etcd %v: %w", endpoints, err)
	}
	s.cli = cli
	if m != nil {
		go s.watchMember(m)
	}
	// Prove the connection works before declaring the store open.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err := cli.Get(cctx, keyCluster)
		if err == nil {
			break
		}
		if cctx.Err() != nil {
			s.Close()
			return nil, fmt.Errorf("etcd %v not reachable: %w", endpoints, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return s, nil
}

// Close disconnects and stops the embedded member, if any.
func (s *Store) Close() {
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	if s.cli != nil {
		s.cli.Close()
	}
	if m := s.mem.Load(); m != nil {
		m.local.Close()
		m.close()
	}
}

// Embedded reports whether this node runs its own etcd member.
func (s *Store) Embedded() bool { return s.mem.Load() != nil }

// Health is a linearizable read: it succeeds only when a quorum answers.
func (s *Store) Health(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err := s.cli.Get(ctx, keyCluster)
	return wrap("health", err)
}

// Status describes the metadata cluster as this node sees it.
type Status struct {
	Embedded  bool     `json:"embedded"`
	Endpoints []string `json:"endpoints"`
	Version   string   `json:"version"`
	Leader    uint64   `json:"leader"`
	Members   int      `json:"members"`
	DBSize    int64    `json:"db_size_bytes"`
	DBInUse   int64    `json:"db_size_in_use_bytes"`
	Alarms    []string `json:"alarms,omitempty"`
	RaftIndex uint64   `json:"raft_index"`
}

// Status reports the metadata cluster as this node sees it: from its own
// member, in process, while that serves; else from the first endpoint
// that answers among those the member list names. Never etcd's Status RPC
// on a member that may have been removed: its handler panics (IsLearner)
// between applying the removal and stopping — which the member list,
// answered by any member, the removed one included, no longer names.
func (s *Store) Status(ctx context.Context) (*Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st := &Status{Embedded: s.Embedded(), Endpoints: s.cli.Endpoints()}
	ml, err := s.cli.MemberList(ctx, clientv3.WithSerializable())
	if err != nil {
		return st, wrap("status", err)
	}
	st.Members = len(ml.Members)
	if m, serves, _ := s.ownMember(); serves {
		srv := m.e.Server
		st.Version, st.Leader, st.RaftIndex = version.Version, uint64(srv.Leader()), srv.CommittedIndex()
		st.DBSize, st.DBInUse = srv.Backend().Size(), srv.Backend().SizeInUse()
	} else if err := s.remoteStatus(ctx, st, ml.Members); err != nil {
		return st, wrap("status", err)
	}
	if a, err := s.cli.AlarmList(ctx); err == nil {
		for _, al := range a.Alarms {
			st.Alarms = append(st.Alarms, al.Alarm.String())
		}
	}
	return st, nil
}

// remoteStatus fills st from the first member that answers: among the
// client's endpoints those the member list names, else the URLs it names
// (a first node's client may still know only its own listen URL) — never
// this node's own member, which no longer serves it (it is removed, or
// stopped: the member list may have been read just before it applied its
// removal). An external etcd, which may advertise other URLs than those
// it is reached by, is asked at its endpoints when neither works.
func (s *Store) remoteStatus(ctx context.Context, st *Status, members []*etcdserverpb.Member) error {
	var urls []string
	for _, m := range members {
		urls = append(urls, m.ClientURLs...)
	}
	eps := slices.DeleteFunc(slices.Clone(s.cli.Endpoints()), func(ep string) bool { return !slices.Contains(urls, ep) })
	if len(eps) == 0 {
		eps = urls
	}
	if m := s.mem.Load(); m == nil {
		eps = append(eps, s.cli.Endpoints()...)
	} else {
		cfg := m.e.Config()
		for _, u := range append(cfg.ListenClientUrls, cfg.AdvertiseClientUrls...) {
			eps = slices.DeleteFunc(eps, func(ep string) bool { return ep == u.String() })
		}
	}
	lastErr := errors.New("no endpoint")
	for _, ep := range eps {
		r, err := s.cli.Status(ctx, ep)
		if err != nil {
			lastErr = err
			continue
		}
		st.Version, st.Leader, st.DBSize, st.DBInUse, st.RaftIndex = r.Version, r.Leader, r.DbSize, r.DbSizeInUse, r.RaftIndex
		return nil
	}
	return lastErr
}

// Defrag compacts history up to the current revision, defragments every
// endpoint and clears a NOSPACE alarm: the online defrag path for an
// operator whose metadata hit its space quota (`basalt meta defrag`).
func (s *Store) Defrag(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	r, err := s.cli.Get(ctx, keyCluster)
	if err != nil {
		return wrap("defrag", err)
	}
	if _, err := s.cli.Compact(ctx, r.Header.Revision, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return wrap("compact", err)
	}
	for _, ep := range s.cli.Endpoints() {
		if _, err := s.cli.Defragment(ctx, ep); err != nil {
			return wrap("defragment "+ep, err)
		}
	}
	if _, err := s.cli.AlarmDisarm(ctx, &clientv3.AlarmMember{}); err != nil {
		return wrap("disarm alarms", err)
	}
	return nil
}

// wrap turns etcd failures into typed errors: an unreachable or quorum-less
// cluster is MetadataUnavailable (503), which clients may retry.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errs.As(err); ok {
		return err
	}
	if errors.Is(err, rpctypes.ErrGRPCNoSpace) || errors.Is(err, context.Canceled) {
		return errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable, "metadata %s failed: %v", op, err)
	}
	if unavailable(err) {
		return errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"metadata %s failed: no quorum of the metadata cluster answered (%v); writes resume when a majority of the voters is up", op, err)
	}
	return fmt.Errorf("metadata %s: %w", op, err)
}

// unavailable reports whether err means no quorum (or no member) answered,
// or the request met a leader change: etcd reports all of these with gRPC's
// Unavailable code. The outcome of such a write is unknown, as after a
// timeout; the caller may retry.
func unavailable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "connection") || memberStopped(err) {
		return true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable || ee.Code() == codes.DeadlineExceeded
	}
	if st, ok := status.FromError(err); ok {
		return st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded
	}
	return false
}

func zapNop() *zap.Logger { return zap.NewNop() }

func splitHostPort(hp string) (string, string, error) { return net.SplitHostPort(hp) }
func joinHostPort(h, p string) string                 { return net.JoinHostPort(h, p) }
