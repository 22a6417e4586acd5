package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"
)

// expiringCA is a CA whose own certificate expires in validFor.
func expiringCA(t *testing.T, validFor time.Duration) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "expiring CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := ParseCA(pemBlock("CERTIFICATE", der), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestCertificatesNotReissuedInCAsLastDays: every certificate a CA issues
// ends by the CA's own expiry. In the CA's last RenewBefore a node (or
// service) certificate is therefore "due" as soon as it is issued, and
// was reissued at every check — a new key every hour and at every start,
// for a certificate that expires no later than the one it replaced.
func TestCertificatesNotReissuedInCAsLastDays(t *testing.T) {
	ca := expiringCA(t, 10*24*time.Hour)
	dir := t.TempDir()
	names := []string{"localhost", "127.0.0.1"}
	first, err := ca.ServerCertificate(dir, names)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ca.ServerCertificate(dir, names)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.Certificate[0], again.Certificate[0]) {
		t.Fatal("the node certificate was reissued although a new one would expire no later (the CA's expiry)")
	}
	s1, _, _, err := ca.ServiceCertificate(dir, "s3", names)
	if err != nil {
		t.Fatal(err)
	}
	s2, _, _, err := ca.ServiceCertificate(dir, "s3", names)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s1.Certificate[0], s2.Certificate[0]) {
		t.Fatal("the s3 certificate was reissued although a new one would expire no later (the CA's expiry)")
	}

	// A certificate due for another reason than the CA's expiry is still
	// renewed: one expiring before the CA does.
	leaf, err := x509.ParseCertificate(first.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if ca.RenewalDue(leaf.NotAfter) {
		t.Fatal("a certificate expiring with its CA is due: a new one would be no better")
	}
	if !ca.RenewalDue(leaf.NotAfter.Add(-time.Hour)) {
		t.Fatal("a certificate expiring within RenewBefore, before its CA, is not due")
	}
	long := expiringCA(t, 365*24*time.Hour)
	if long.RenewalDue(time.Now().Add(RenewBefore + time.Hour)) {
		t.Fatal("a certificate valid beyond RenewBefore is due")
	}
	if !long.RenewalDue(time.Now().Add(RenewBefore - time.Hour)) {
		t.Fatal("a certificate within RenewBefore of expiry is not due")
	}
}
