package meta

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/pki"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// memberOpener opens stores that run members of one new cluster, each in
// its own directory under base with its own ports, as nodes do.
type memberOpener struct {
	t    *testing.T
	base string
	ca   *pki.CA
}

// open starts member name; endpoints and initial as in Config and
// EmbedConfig (both empty: the first member of a new cluster). It returns
// the store and the member's client URL.
func (o *memberOpener) open(name, peerAddr string, endpoints []string, initial string) (*Store, string) {
	o.t.Helper()
	c, url := o.config(name, peerAddr, endpoints, initial)
	s, err := Open(context.Background(), c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		o.t.Fatalf("open member %s: %v", name, err)
	}
	o.t.Cleanup(s.Close)
	return s, url
}

// config is the configuration of node name's store, and the client URL
// its member would have.
func (o *memberOpener) config(name, peerAddr string, endpoints []string, initial string) (Config, string) {
	o.t.Helper()
	pkiDir := filepath.Join(o.base, name, "pki")
	if err := o.ca.Save(pkiDir); err != nil {
		o.t.Fatal(err)
	}
	cert, err := o.ca.ServerCertificate(pkiDir, []string{"localhost", "127.0.0.1"})
	if err != nil {
		o.t.Fatal(err)
	}
	clientAddr := freeAddr(o.t)
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: o.ca.Pool(), MinVersion: tls.VersionTLS12}
	return Config{
		Endpoints:   endpoints,
		ClientTLS:   tlsCfg,
		ExternalTLS: tlsCfg,
		Embed: EmbedConfig{
			Name: name, Dir: filepath.Join(o.base, name, "meta"),
			ClientAddr: clientAddr, PeerAddr: peerAddr,
			CertFile: filepath.Join(pkiDir, "server.pem"), KeyFile: filepath.Join(pkiDir, "server-key.pem"),
			CAFile: filepath.Join(pkiDir, "ca.pem"), InitialCluster: initial,
		},
	}, "https://" + clientAddr
}

// promote makes learner id a voter through s once it has caught up.
func promote(t *testing.T, ctx context.Context, s *Store, id uint64) {
	t.Helper()
	for {
		err := s.Promote(ctx, id)
		if err == nil {
			return
		}
		if !errors.Is(err, ErrNotCaughtUp) || ctx.Err() != nil {
			t.Fatalf("promote %x: %v", id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestClientStartsMember: a store opened as an etcd client of the voters
// (a client node) gains a member of its own in process — the learner the
// cluster added for it — and, once that is promoted, reads from it and
// commits optimistically like any voter's store; writes go on throughout.
func TestClientStartsMember(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o := newOpener(t)
	peer1, peer2 := freeAddr(t), freeAddr(t)
	s1, url1 := o.open("m1", peer1, nil, "")
	cfg, _ := o.config("m2", peer2, []string{url1}, "")
	s2, err := Open(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s2.Close)
	if s2.Embedded() || s2.MemberStopped() != nil || s2.attemptMode() != modeCareful {
		t.Fatal("a client store claims a member")
	}
	put := func(s *Store, id string) {
		t.Helper()
		if err := s.Update(ctx, func(tx *Tx) error {
			tx.PutVolume(&Volume{ID: id, Status: StatusAvailable})
			return nil
		}); err != nil {
			t.Fatalf("write %s: %v", id, err)
		}
	}
	put(s2, "as-client")

	id2, err := s1.AddLearner(ctx, "https://"+peer2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Embed.InitialCluster = "m1=https://" + peer1 + ",m2=https://" + peer2
	if err := s2.StartMember(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if !s2.Embedded() || s2.MemberID() != id2 || s2.MemberStopped() == nil {
		t.Fatalf("after StartMember: embedded %v, member %x (want %x)", s2.Embedded(), s2.MemberID(), id2)
	}
	if err := s2.StartMember(ctx, cfg); err == nil {
		t.Fatal("a second StartMember succeeded")
	}
	put(s2, "as-learner")
	promote(t, ctx, s2, id2)
	for {
		if _, serves, learner := s2.ownMember(); serves && !learner && s2.attemptMode() != modeCareful {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("m2 never saw itself promoted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s2.txnClient() == s2.cli || s2.localCopy() == s2.cli {
		t.Fatal("the promoted store does not read from its own member")
	}
	put(s2, "as-voter")
	for _, id := range []string{"as-client", "as-learner", "as-voter"} {
		if v, err := s1.Volume(ctx, id); err != nil || v.ID != id {
			t.Fatalf("m1 reads %s: %+v, %v", id, v, err)
		}
	}
	if ms, err := s1.Members(ctx); err != nil || len(ms) != 2 || ms[0].Learner || ms[1].Learner {
		t.Fatalf("members: %+v, %v", ms, err)
	}
}

// TestRemovedVoterStops: a voter removed from the cluster while its store
// is open. Reads and writes through it never panic — etcd panics when
// asked whether a member that is no longer in its member list is a
// learner, which a removed member is from the moment it applies its
// removal — MemberStopped closes with ErrMemberRemoved, and afterwards the
// store still works through the remaining member, even when its client
// knew no endpoint but its own member's (the first node's, before its
// client synced its endpoints).
func TestRemovedVoterStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o := newOpener(t)
	peer1, peer2 := freeAddr(t), freeAddr(t)
	s1, url1 := o.open("m1", peer1, nil, "")
	id2, err := s1.AddLearner(ctx, "https://"+peer2)
	if err != nil {
		t.Fatal(err)
	}
	s2, url2 := o.open("m2", peer2, []string{url1}, "m1=https://"+peer1+",m2=https://"+peer2)
	promote(t, ctx, s1, id2)
	// m2's client knows its own member alone.
	s2.cli.SetEndpoints(url2)
	for {
		if _, serves, learner := s2.ownMember(); serves && !learner {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("m2 never saw itself promoted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-s2.MemberStopped():
		t.Fatalf("m2's member stopped before its removal: %v", s2.MemberErr())
	default:
	}

	// Another node asking m2 for its status throughout.
	asking := make(chan struct{})
	defer func() { <-asking }()
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	go func() {
		defer close(asking)
		for actx.Err() == nil {
			sctx, scancel := context.WithTimeout(actx, time.Second)
			s1.cli.Status(sctx, url2)
			scancel()
			time.Sleep(time.Millisecond)
		}
	}()
	// etcd removes a voter only once the others have been connected to
	// it for 5 s (its strict reconfiguration check).
	for {
		err := s1.RemoveMember(ctx, id2)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("remove m2: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// From the removal until the member has stopped, reads and writes
	// through m2 may fail, but must not panic; nor may etcd's Status RPC
	// asked of m2 by another node.
	stopped := false
	for !stopped && ctx.Err() == nil {
		if _, err := s2.Node(ctx, "m2"); err != nil && !errs.IsCode(err, errs.CodeNotFound) {
			t.Logf("read through the removed member: %v", err)
		}

		s2.Update(ctx, func(tx *Tx) error { _, err := tx.Volume("removal-probe"); return err })
		select {
		case <-s2.MemberStopped():
			stopped = true
		case <-time.After(20 * time.Millisecond):
		}
	}
	if !stopped {
		t.Fatal("m2's member did not stop after its removal")
	}
	if err := s2.MemberErr(); !errors.Is(err, ErrMemberRemoved) {
		t.Fatalf("m2's member stopped with %v, want ErrMemberRemoved", err)
	}
	select {
	case <-s1.MemberStopped():
		t.Fatalf("m1's member stopped: %v", s1.MemberErr())
	default:
	}
	// What m2 writes now, m1 reads: m2 is an etcd client of m1.
	if err := s2.Update(ctx, func(tx *Tx) error {
		tx.PutVolume(&Volume{ID: "after-removal", Status: StatusAvailable})
		return nil
	}); err != nil {
		t.Fatalf("write through the removed member's store: %v", err)
	}
	if v, err := s1.Volume(ctx, "after-removal"); err != nil || v.ID != "after-removal" {
		t.Fatalf("m1 reads %+v, %v", v, err)
	}
	if ms, err := s2.Members(ctx); err != nil || len(ms) != 1 || ms[0].Name != "m1" {
		t.Fatalf("members as the removed node sees them: %+v, %v", ms, err)
	}
}

// TestMemberHTTPEndpoints: the member's /health and /metrics answer on
// their own address, with the client port's TLS, and the client port
// serves gRPC alone (sharing it, every gRPC call went through net/http).
func TestMemberHTTPEndpoints(t *testing.T) {
	o := newOpener(t)
	cfg, clientURL := o.config("m1", freeAddr(t), nil, "")
	httpAddr := freeAddr(t)
	cfg.Embed.HTTPAddr = httpAddr
	s, err := Open(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg.ClientTLS}}
	get := func(url string) (int, string, error) {
		resp, err := hc.Get(url)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	if code, body, err := get("https://" + httpAddr + "/health"); err != nil || code != http.StatusOK {
		t.Errorf("/health on the HTTP address: %d %q %v", code, body, err)
	}
	if code, body, err := get("https://" + httpAddr + "/metrics"); err != nil || code != http.StatusOK ||
		!strings.Contains(body, "etcd_server_has_leader") {
		t.Errorf("/metrics on the HTTP address: %d, %d bytes, %v", code, len(body), err)
	}
	if code, _, err := get(clientURL + "/health"); err == nil && code == http.StatusOK {
		t.Error("the client port still answers HTTP")
	}
	// Without a certificate from the CA, nothing.
	plain := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: o.ca.Pool()}}}
	if resp, err := plain.Get("https://" + httpAddr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Errorf("/metrics answered %d to a client without a certificate", resp.StatusCode)
	}
}

// TestMemberRefusesUserCertificates: the CA that signs the nodes'
// certificates also signs users' (for the API); the embedded member admits
// only a node's (pki.MemberName), or any user could read the CA key and
// every S3 secret from etcd.
func TestMemberRefusesUserCertificates(t *testing.T) {
	o := newOpener(t)
	cfg, clientURL := o.config("m1", freeAddr(t), nil, "")
	s, err := Open(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	get := func(tc *tls.Config) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{clientURL}, DialTimeout: 2 * time.Second, TLS: tc, Logger: zapNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = cli.Get(ctx, "/basalt/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err
	}
	if err := get(cfg.ClientTLS); err != nil {
		t.Fatalf("the node's own certificate: %v", err)
	}
	is, err := o.ca.IssueClient("alice", "u-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	user, err := tls.X509KeyPair(is.CertPEM, is.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if err := get(&tls.Config{Certificates: []tls.Certificate{user}, RootCAs: o.ca.Pool()}); err == nil {
		t.Fatal("a user's certificate reads the metadata store")
	}
}
