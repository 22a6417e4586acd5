package user

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/pki"
)

// TestNodeIdentityReplacedInCAsLastDays: a node's new local identity
// revokes its previous one unless that one was due for renewal (then it
// stays valid until it expires, for the clients that loaded it). In the
// CA's last 30 days every certificate expires with the CA, within
// pki.RenewBefore, and was taken for due: a node that wrote itself a new
// identity (its directory torn) left the previous one valid beside it.
// A certificate that expires with the CA is not due (pki.CA.RenewalDue).
func TestNodeIdentityReplacedInCAsLastDays(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "expiring CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(10 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := openTestStore(t)
	s := New(m, ca)
	ctx := ctxT(t)
	name := uniq("nodeid")
	if _, _, err := s.Create(ctx, Spec{Name: name}); err != nil {
		t.Fatal(err)
	}
	node := meta.CertForNode("n1")
	first, err := s.IssueIdentity(ctx, name, node)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.IssueIdentity(ctx, name, node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, chain(t, second.CertPEM)); err != nil {
		t.Fatalf("the node's new identity: %v", err)
	}
	_, err = s.Authenticate(ctx, chain(t, first.CertPEM))
	if !errs.IsCode(err, errs.CodeCertificateRevoked) {
		t.Fatalf("the node's previous identity, not due for renewal, after a new one: %v, want %s", err, errs.CodeCertificateRevoked)
	}
}
