package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
)

// TestS3TLSSettingsRefusedFirst: contradicting S3 TLS settings, or a site
// certificate that cannot be loaded, are refused before anything starts.
// They were checked only when the gateway started — after the embedded
// etcd member had started, the store's marker and the admin identity had
// been written and, for a node started with --join, after the cluster had
// taken it in as a learner whose member then never came back.
func TestS3TLSSettingsRefusedFirst(t *testing.T) {
	for name, tlsCfg := range map[string]S3TLSConfig{
		"cert without key": {S3Cert: "site.pem"},
		"insecure and tls": {S3Insecure: true, S3TLS: true},
		"missing cert":     {S3Cert: "/nonexistent/site.pem", S3Key: "/nonexistent/site-key.pem"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := nodeConfig(t, "a", filepath.Join(dir, "data"), filepath.Join(dir, "store"))
			cfg.S3TLSConfig = tlsCfg
			n, err := startNodeOnce(t, cfg)
			if err == nil {
				n.Close()
				t.Fatalf("a node with S3 settings %+v started", tlsCfg)
			}
			if !errs.IsCode(err, usageCode) {
				t.Fatalf("error %v, want %s", err, usageCode)
			}
			for _, d := range []string{"meta", "pki", "identities"} {
				if _, err := os.Stat(filepath.Join(cfg.Data, d)); !os.IsNotExist(err) {
					t.Errorf("the data directory's %s/ was made before the S3 settings were refused (%v)", d, err)
				}
			}
			if _, err := os.Stat(filepath.Join(cfg.Store, ".basalt-store")); !os.IsNotExist(err) {
				t.Errorf("the store was claimed before the S3 settings were refused (%v)", err)
			}
		})
	}
}
