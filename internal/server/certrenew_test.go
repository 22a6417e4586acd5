package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/pki"
)

// writeServerCert writes DIR/server.pem and server-key.pem: a node
// certificate of ca for names, valid until notAfter.
func writeServerCert(t *testing.T, dir string, ca *pki.CA, names []string, notAfter time.Time) {
	t.Helper()
	blk, _ := pem.Decode(ca.KeyPEM)
	caKey, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range append(names, pki.MemberName) {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "server-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "server.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}

// servedLeaf is the certificate a TLS server at addr presents.
func servedLeaf(t *testing.T, addr string, ca *pki.CA, client []tls.Certificate) *x509.Certificate {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", Certificates: client, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("TLS to %s: %v", addr, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0]
}

// TestNodeCertificateRenewedWhileRunning: the node certificate (the
// API's, NBD's, the etcd member's and its client's — a year) was renewed
// only at a start, when due. A node running when it came due served it
// until it expired: then every client refused the API, and the etcd
// members refused one another — every node of a cluster made the same
// day at once. A running node renews it when it comes due.
func TestNodeCertificateRenewedWhileRunning(t *testing.T) {
	every := certCheckEvery
	certCheckEvery = 100 * time.Millisecond
	t.Cleanup(func() { certCheckEvery = every })
	tmp := t.TempDir()
	cfg := nodeConfig(t, "a", filepath.Join(tmp, "a"), filepath.Join(tmp, "store"))
	pkiDir := filepath.Join(cfg.Data, "pki")
	ca, err := pki.LoadOrCreateCA(pkiDir)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	// Not due yet at start (it is kept), due a few seconds later.
	dueAt := time.Now().Add(8 * time.Second)
	writeServerCert(t, pkiDir, ca, []string{"localhost", "127.0.0.1", "::1", host}, dueAt.Add(pki.RenewBefore))
	n, err := startNodeOnce(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if time.Now().After(dueAt) {
		t.Skip("the node took too long to start: its certificate was due already")
	}
	first := servedLeaf(t, n.APIAddr(), ca, nil)
	if !first.NotAfter.Equal(dueAt.Add(pki.RenewBefore).Truncate(time.Second)) {
		t.Fatalf("API certificate at start expires %v, want the one written (%v)", first.NotAfter, dueAt.Add(pki.RenewBefore))
	}
	time.Sleep(time.Until(dueAt))
	renewed := func(addr string, client []tls.Certificate) bool {
		return time.Until(servedLeaf(t, addr, ca, client).NotAfter) > pki.RenewBefore
	}
	deadline := time.Now().Add(15 * time.Second)
	for !renewed(n.APIAddr(), nil) {
		if time.Now().After(deadline) {
			t.Fatalf("the API still serves the certificate that came due at %v (expires %v): not renewed while running", dueAt, first.NotAfter)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The etcd member reads its files at each handshake: renewed on disk,
	// it presents the new one too.
	nodeCert, err := tls.LoadX509KeyPair(filepath.Join(pkiDir, "server.pem"), filepath.Join(pkiDir, "server-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if !renewed(n.cfg.EtcdClient, []tls.Certificate{nodeCert}) {
		t.Fatal("the etcd member presents the certificate that came due")
	}
	// The node's own etcd client presents the renewed one.
	cc, err := n.metaCfg.ClientTLS.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil || cc.Leaf == nil && len(cc.Certificate) == 0 {
		t.Fatalf("etcd client certificate: %v", err)
	}
	leaf, err := x509.ParseCertificate(cc.Certificate[0])
	if err != nil || time.Until(leaf.NotAfter) <= pki.RenewBefore {
		t.Fatalf("the node's etcd client presents a certificate expiring %v: not renewed (%v)", leaf.NotAfter, err)
	}
	if err := n.meta.Health(t.Context()); err != nil {
		t.Fatalf("metadata after the renewal: %v", err)
	}
}
