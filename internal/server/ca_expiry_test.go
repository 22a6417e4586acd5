package server

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/pki"
	"github.com/basalt-storage/basalt/internal/user"
)

// saveExpiringCA writes a cluster CA expiring in validFor to dir, as the
// CA a node finds there at its start.
func saveExpiringCA(t *testing.T, dir string, validFor time.Duration) {
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
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
}

// TestNoRenewalLoopInCAsLastDays: in the cluster CA's last 30 days every
// certificate it issues expires with it, within pki.RenewBefore. The
// node took its local admin identity for due at every check (a minute)
// and wrote itself a new one each time — each listed in admin's record
// and kept there until it expired, so the record grew by a certificate a
// minute per node until etcd refused to write it — and reissued its node
// certificate at every check (an hour) too. A certificate that expires
// with the CA is as good as a new one would be.
func TestNoRenewalLoopInCAsLastDays(t *testing.T) {
	adminEvery, certEvery := adminCheckEvery, certCheckEvery
	adminCheckEvery, certCheckEvery = 20*time.Millisecond, 20*time.Millisecond
	t.Cleanup(func() { adminCheckEvery, certCheckEvery = adminEvery, certEvery })
	tmp := t.TempDir()
	cfg := nodeConfig(t, "a", filepath.Join(tmp, "a"), filepath.Join(tmp, "store"))
	pkiDir := filepath.Join(cfg.Data, "pki")
	saveExpiringCA(t, pkiDir, 10*24*time.Hour)
	n, err := startNodeOnce(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	first := leafOf(t, n.AdminDir)
	serverPEM, err := os.ReadFile(filepath.Join(pkiDir, "server.pem"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(25 * adminCheckEvery)
	if again := leafOf(t, n.AdminDir); again.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Error("the local admin identity was replaced by one expiring no later (the CA's expiry)")
	}
	u, err := n.users.Get(t.Context(), user.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Certs) != 1 {
		t.Errorf("admin's record lists %d certificates after a single node's checks, want 1", len(u.Certs))
	}
	if now, err := os.ReadFile(filepath.Join(pkiDir, "server.pem")); err != nil || !bytes.Equal(now, serverPEM) {
		t.Errorf("the node certificate was reissued by a check (%v) although a new one would expire no later", err)
	}
}
