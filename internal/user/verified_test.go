package user

import (
	"strconv"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/pki"
)

// A chain is checked once and then believed only while its leaf is valid;
// another chain, or one signed by another CA, is checked (and refused) on
// its own.
func TestVerifiedChains(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	name := uniq("vera")
	u, id, err := s.Create(ctx, Spec{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	c := chain(t, id.CertPEM)
	if s.verified.ok(c, time.Now()) {
		t.Fatal("a chain never presented counts as verified")
	}
	for range 2 {
		if _, err := s.Authenticate(ctx, c); err != nil {
			t.Fatal(err)
		}
		if !s.verified.ok(c, time.Now()) {
			t.Fatal("a chain that authenticated is not remembered")
		}
	}
	leaf := c[0]
	if s.verified.ok(c, leaf.NotAfter.Add(time.Second)) {
		t.Fatal("a remembered chain is believed after its leaf expired")
	}
	if s.verified.ok(c, leaf.NotBefore.Add(-time.Second)) {
		t.Fatal("a remembered chain is believed before its leaf is valid")
	}

	// The same name and record id from another CA: a different chain,
	// checked and refused every time.
	other, err := pki.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	is, err := other.IssueClient(name, u.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	forged := chain(t, is.CertPEM)
	for range 2 {
		_, err := s.Authenticate(ctx, forged)
		wantAuthError(t, err, errs.CodeCertificateUntrusted)
	}
	if s.verified.ok(forged, time.Now()) {
		t.Fatal("a refused chain is remembered")
	}

	// The cache starts over when full.
	v := verified{m: map[string]time.Time{}}
	for i := range maxVerified {
		v.m[strconv.Itoa(i)] = time.Now()
	}
	v.add(c)
	if len(v.m) != 1 || !v.ok(c, time.Now()) {
		t.Fatalf("a full cache holds %d chains after one more", len(v.m))
	}
}
