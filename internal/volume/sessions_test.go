package volume

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/nbd"
)

// TestSessionsRechecked: a TLS connection whose client certificate stops
// authenticating (its user deleted, or given new credentials) is closed
// within a recheck; one whose check cannot tell (no quorum) is left open,
// as are the connections of other certificates; a released connection is
// no longer checked.
func TestSessionsRechecked(t *testing.T) {
	old := sessionRecheck
	sessionRecheck = 50 * time.Millisecond
	t.Cleanup(func() { sessionRecheck = old })
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	a := attached(t, s, meta.ModeRO)
	b := attached(t, s, meta.ModeRO)
	alice := &x509.Certificate{Subject: pkix.Name{CommonName: "alice"}}
	bob := &x509.Certificate{Subject: pkix.Name{CommonName: "bob"}}
	var aliceState atomic.Pointer[errs.Error] // what Authenticate answers for alice (nil: ok)
	x := s.NewExports(func(ctx context.Context, chain []*x509.Certificate) (Caller, error) {
		if chain[0] == alice {
			if err := aliceState.Load(); err != nil {
				return Caller{}, err
			}
			return Caller{Name: "alice", ID: a.OwnerID}, nil
		}
		return Caller{Name: "bob", ID: b.OwnerID}, nil
	})
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); x.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	open := func(att *meta.Attachment, c *x509.Certificate) *nbd.Export {
		exp, err := x.Open(ctx, att.Export, &tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}})
		if err != nil {
			t.Fatal(err)
		}
		return exp
	}
	aliceExp, bobExp := open(a, alice), open(b, bob)
	defer bobExp.Release()

	aliceState.Store(errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable, "no quorum"))
	time.Sleep(5 * sessionRecheck)
	if revoked(aliceExp) {
		t.Fatal("a connection whose check could not tell (no quorum) was closed")
	}
	aliceState.Store(errs.New(errs.KindUnauthenticated, errs.CodeCertificateRevoked, "revoked"))
	deadline := time.Now().Add(5 * time.Second)
	for !revoked(aliceExp) {
		if time.Now().After(deadline) {
			t.Fatal("a connection whose certificate was revoked is still open")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if revoked(bobExp) {
		t.Fatal("another user's connection was closed with alice's")
	}

	// Released (as the NBD server does once it closed the connection),
	// a connection is no longer checked.
	aliceExp.Release()
	x.mu.Lock()
	n := len(x.sessions)
	x.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d connections checked with only bob's open, want 1", n)
	}
}
