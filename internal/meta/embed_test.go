package meta

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/pki"
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
	pkiDir := filepath.Join(o.base, name, "pki")
	if err := o.ca.Save(pkiDir); err != nil {
		o.t.Fatal(err)
	}
	cert, err := o.ca.ServerCertificate(pkiDir, []string{"localhost", "127.0.0.1"})
	if err != nil {
		o.t.Fatal(err)
	}
	clientAddr := freeAddr(o.t)
	s, err := Open(context.Background(), Config{
		Endpoints: endpoints,
		ClientTLS: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: o.ca.Pool(), MinVersion: tls.VersionTLS12},
		Embed: EmbedConfig{
			Name: name, Dir: filepath.Join(o.base, name, "meta"),
			ClientAddr: clientAddr, PeerAddr: peerAddr,
			CertFile: filepath.Join(pkiDir, "server.pem"), KeyFile: filepath.Join(pkiDir, "server-key.pem"),
			CAFile: filepath.Join(pkiDir, "ca.pem"), InitialCluster: initial,
		},
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		o.t.Fatalf("open member %s: %v", name, err)
	}
	o.t.Cleanup(s.Close)
	return s, "https://" + clientAddr
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
	base := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(base, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	o := &memberOpener{t: t, base: base, ca: ca}
	peer1, peer2 := freeAddr(t), freeAddr(t)
	s1, url1 := o.open("m1", peer1, nil, "")
	id2, err := s1.AddLearner(ctx, "https://"+peer2)
	if err != nil {
		t.Fatal(err)
	}
	s2, url2 := o.open("m2", peer2, []string{url1}, "m1=https://"+peer1+",m2=https://"+peer2)
	for {
		err := s1.Promote(ctx, id2)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNotCaughtUp) || ctx.Err() != nil {
			t.Fatalf("promote m2: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// m2's client knows its own member alone.
	s2.cli.SetEndpoints(url2)
	for {
		if serves, learner := s2.ownMember(); serves && !learner {
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
	// through m2 may fail, but must not panic.
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
