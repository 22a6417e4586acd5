package pki

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestServiceCertificateKeepsOtherFiles: a service certificate's
// files (<name>.pem, <name>-key.pem) live next to the CA's and the node's
// in the pki directory. A name whose files would be one of those
// (ca-key.pem, server-key.pem) or another service's key file is refused
// and overwrites nothing.
func TestServiceCertificateKeepsOtherFiles(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.ServerCertificate(dir, []string{"localhost"}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := ca.ServiceCertificate(dir, "s3", []string{"localhost"}); err != nil {
		t.Fatal(err)
	}
	files := []string{"ca.pem", "ca-key.pem", "server.pem", "server-key.pem", "s3.pem", "s3-key.pem"}
	before := map[string][]byte{}
	for _, f := range files {
		before[f] = mustReadFile(t, filepath.Join(dir, f))
	}
	for _, bad := range []string{"ca-key", "server-key", "s3-key", "x-key"} {
		if _, _, _, err := ca.ServiceCertificate(dir, bad, []string{"localhost"}); err == nil {
			t.Errorf("service certificate name %q accepted", bad)
		}
	}
	for _, f := range files {
		if !bytes.Equal(before[f], mustReadFile(t, filepath.Join(dir, f))) {
			t.Errorf("%s was overwritten", f)
		}
	}
	if _, err := LoadCA(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")); err != nil {
		t.Errorf("the CA no longer loads: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x-key.pem")); err == nil {
		t.Error("x-key.pem written")
	}
}
