package user

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
)

// TestNodeCertificateIsNotAUser: a node certificate is signed by the
// cluster CA and may authenticate clients (a node is a client of its
// peers), but it identifies no user record. Presented to the API it is
// refused as not a user certificate (CertificateUntrusted), not reported
// as a revoked certificate of a deleted user, whether or not a user of its
// CN exists.
func TestNodeCertificateIsNotAUser(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	_, ca := openTestStore(t)
	name := uniq("node")
	if _, _, err := s.Create(ctx, Spec{Name: name, Admin: true}); err != nil {
		t.Fatal(err)
	}
	for _, cn := range []string{name, uniq("host"), "localhost"} {
		cert, err := ca.ServerCertificate(t.TempDir(), []string{cn})
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Authenticate(ctx, []*x509.Certificate{leaf})
		wantAuthError(t, err, errs.CodeCertificateUntrusted)
		if !strings.Contains(err.Error(), "not a user certificate") {
			t.Errorf("node certificate %q: message %q does not say why", cn, err)
		}
	}
}

// TestNotYetValidCertificate: a certificate whose validity has not
// begun (a clock behind the issuer's) is refused, and the message says so
// instead of claiming it expired on a date still to come.
func TestNotYetValidCertificate(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	_, ca := openTestStore(t)
	name := uniq("early")
	u, _, err := s.Create(ctx, Spec{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	is, err := ca.IssueClientWindow(name, u.ID, time.Now().Add(time.Hour), time.Now().Add(48*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Authenticate(ctx, chain(t, is.CertPEM))
	wantAuthError(t, err, errs.CodeCertificateExpired)
	if strings.Contains(err.Error(), "expired") || !strings.Contains(err.Error(), "not valid before") {
		t.Fatalf("message %q, want one saying the certificate is not valid yet", err)
	}
}
