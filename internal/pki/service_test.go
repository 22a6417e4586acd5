package pki

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestServiceCertificate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"node1.example", "localhost", "127.0.0.1", "::1", "", "localhost"}
	c, certPath, keyPath, err := ca.ServiceCertificate(dir, "s3", names)
	if err != nil {
		t.Fatal(err)
	}
	if certPath != filepath.Join(dir, "s3.pem") || keyPath != filepath.Join(dir, "s3-key.pem") {
		t.Fatalf("paths %s %s", certPath, keyPath)
	}
	if m := mode(t, keyPath); m != 0o600 {
		t.Errorf("key mode %v, want 0600", m)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node1.example", "localhost", "127.0.0.1", "::1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: n, Roots: ca.Pool()}); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	if leaf.Subject.CommonName != "node1.example" {
		t.Errorf("subject %q, want the first name", leaf.Subject.CommonName)
	}
	if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("key usages %v, want server auth only", leaf.ExtKeyUsage)
	}
	// The node's own server certificate is not touched.
	if _, err := os.Stat(filepath.Join(dir, "server.pem")); err == nil {
		t.Error("server.pem written")
	}

	// Same names: the same certificate. A new name: a new one.
	again, _, _, err := ca.ServiceCertificate(dir, "s3", names[:2])
	if err != nil || !slices.Equal(again.Certificate[0], c.Certificate[0]) {
		t.Fatalf("reissued for known names (%v)", err)
	}
	other, _, _, err := ca.ServiceCertificate(dir, "s3", append(names, "10.1.2.3"))
	if err != nil || slices.Equal(other.Certificate[0], c.Certificate[0]) {
		t.Fatalf("not reissued for a new name (%v)", err)
	}
	// Another CA's certificate is replaced.
	ca2, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	c2, _, _, err := ca2.ServiceCertificate(dir, "s3", names)
	if err != nil {
		t.Fatal(err)
	}
	if l2, _ := x509.ParseCertificate(c2.Certificate[0]); l2.CheckSignatureFrom(ca2.Cert) != nil {
		t.Fatal("certificate of the old CA kept")
	}

	for _, bad := range []string{"", "server", "ca", "../x", "a/b"} {
		if _, _, _, err := ca.ServiceCertificate(dir, bad, names); err == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
	if _, _, _, err := ca.ServiceCertificate(dir, "s3", []string{"", ""}); err == nil {
		t.Error("no names accepted")
	}
}

func TestIdentityS3CABundle(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	is, err := ca.IssueClient("alice", "id-1", ClientValidity)
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	t.Chdir(base)
	id := &Identity{CAPEM: ca.CertPEM, CertPEM: is.CertPEM, KeyPEM: is.KeyPEM, AccessKeyID: "AK", SecretAccessKey: "SK",
		S3Endpoint: "https://node1:9000", S3Region: "us-east-1", S3CABundle: true}
	// A relative directory: the bundle path is absolute all the same.
	if err := id.Write("alice"); err != nil {
		t.Fatal(err)
	}
	env := string(mustReadFile(t, filepath.Join(base, "alice", "s3.env")))
	if !strings.Contains(env, "\nAWS_CA_BUNDLE="+filepath.Join(base, "alice", "ca.pem")+"\n") ||
		!strings.Contains(env, "AWS_ENDPOINT_URL=https://node1:9000\n") {
		t.Fatalf("s3.env:\n%s", env)
	}
	back, err := LoadIdentity("alice")
	if err != nil || !back.S3CABundle || back.S3Endpoint != id.S3Endpoint {
		t.Fatalf("loaded %+v, %v", back, err)
	}
	// Plain HTTP, or a site certificate: no bundle.
	id.S3CABundle = false
	if err := id.Write("bob"); err != nil {
		t.Fatal(err)
	}
	if env := string(mustReadFile(t, filepath.Join(base, "bob", "s3.env"))); strings.Contains(env, "AWS_CA_BUNDLE") {
		t.Fatalf("s3.env without S3CABundle:\n%s", env)
	}
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
