package user

import (
	"crypto/x509"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
)

// TestServiceCertificateIsNotAClientCertificate: a certificate the
// cluster CA signed for a server only (the S3 gateway's, no client-auth
// usage) is refused as CertificateUntrusted, and the message says it is
// not for client authentication. It used to claim the certificate was
// not signed by this cluster's CA, which sent an operator looking for a
// foreign CA that was not there.
func TestServiceCertificateIsNotAClientCertificate(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	_, ca := openTestStore(t)
	cert, _, _, err := ca.ServiceCertificate(t.TempDir(), "s3", []string{"s3.example.org"})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Authenticate(ctx, []*x509.Certificate{leaf})
	wantAuthError(t, err, errs.CodeCertificateUntrusted)
	if msg := err.Error(); strings.Contains(msg, "not signed by this cluster's CA") || !strings.Contains(msg, "client authentication") {
		t.Errorf("message %q, want one saying the certificate is the CA's but not for client authentication", msg)
	}
}
