package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/pki"
)

// TestUserCredentialsCommand: `basalt user credentials NAME --out DIR`
// writes a new identity for an existing user (never over another
// identity), the old one is refused from then on, the user keeps its
// volumes, and `user show -o json` lists the certificates now valid.
func TestUserCredentialsCommand(t *testing.T) {
	ep, admin := startNode(t)
	tmp := t.TempDir()
	old := filepath.Join(tmp, "old")
	if r := run(ep, admin, "user", "create", "alice", "--out", old); r.code != 0 {
		t.Fatalf("user create: %+v", r)
	}
	if r := run(ep, old, "volume", "create", "--size", "1MiB", "--name", "v"); r.code != 0 {
		t.Fatalf("volume create: %+v", r)
	}
	oldKey, _ := os.ReadFile(filepath.Join(old, "key.pem"))

	// Never over an identity (here: the very one it replaces).
	r := run(ep, admin, "user", "credentials", "alice", "--out", old)
	if r.code != 1 || !strings.Contains(r.stderr, "("+CodeIdentity+")") {
		t.Fatalf("credentials --out OLD-IDENTITY: %+v", r)
	}
	if now, _ := os.ReadFile(filepath.Join(old, "key.pem")); string(now) != string(oldKey) {
		t.Fatal("the old identity was overwritten")
	}
	if r := run(ep, old, "volume", "list"); r.code != 0 {
		t.Fatalf("a refused credentials call revoked the old identity: %+v", r)
	}

	fresh := filepath.Join(tmp, "new")
	if r := run(ep, admin, "user", "credentials", "alice", "--out", fresh); r.code != 0 {
		t.Fatalf("user credentials: %+v", r)
	}
	if r := run(ep, old, "volume", "list"); r.code != 1 || !strings.Contains(r.stderr, "(CertificateRevoked)") {
		t.Errorf("old identity after new credentials: %+v, want CertificateRevoked", r)
	}
	if r := run(ep, fresh, "volume", "show", "v"); r.code != 0 {
		t.Errorf("new identity, the user's volume: %+v", r)
	}
	oldEnv, _ := os.ReadFile(filepath.Join(old, "s3.env"))
	newEnv, err := os.ReadFile(filepath.Join(fresh, "s3.env"))
	if err != nil || string(oldEnv) == string(newEnv) || !strings.Contains(string(newEnv), "AWS_SECRET_ACCESS_KEY=") {
		t.Errorf("s3.env: %v\nold %s\nnew %s", err, oldEnv, newEnv)
	}

	r = run(ep, admin, "-o", "json", "user", "show", "alice")
	var u struct {
		Certificates []struct {
			Serial    string    `json:"serial"`
			NotAfter  time.Time `json:"not_after"`
			IssuedFor string    `json:"issued_for"`
		} `json:"certificates"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &u) != nil {
		t.Fatalf("user show -o json: %+v", r)
	}
	id, _ := pki.LoadIdentity(fresh)
	leaf, _ := pki.ParseCertPEM(id.CertPEM)
	if len(u.Certificates) != 1 || u.Certificates[0].Serial != pki.SerialHex(leaf.SerialNumber) ||
		u.Certificates[0].IssuedFor != "user" || !u.Certificates[0].NotAfter.Equal(leaf.NotAfter) {
		t.Errorf("user show -o json: %s", r.stdout)
	}
	if strings.Contains(strings.ToLower(r.stdout), "secret") {
		t.Errorf("user show carries a secret: %s", r.stdout)
	}
	if r := run(ep, admin, "user", "show", "alice"); r.code != 0 || !strings.Contains(r.stdout, pki.SerialHex(leaf.SerialNumber)) {
		t.Errorf("user show does not list the certificate: %+v", r)
	}
	// The node's own admin identity is listed as the node's.
	if r := run(ep, admin, "-o", "json", "user", "show", "admin"); r.code != 0 || !strings.Contains(r.stdout, `"node n1"`) {
		t.Errorf("admin's certificates: %+v", r)
	}

	// Refusals: precise, exit 1, nothing left behind.
	denied := filepath.Join(tmp, "denied")
	if r := run(ep, fresh, "user", "credentials", "alice", "--out", denied); r.code != 1 || !strings.Contains(r.stderr, "(AdminRequired)") {
		t.Errorf("credentials by a non-admin: %+v", r)
	}
	if r := run(ep, admin, "user", "credentials", "nobody", "--out", denied); r.code != 1 || !strings.Contains(r.stderr, "(NotFound)") {
		t.Errorf("credentials for a missing user: %+v", r)
	}
	if _, err := os.Stat(denied); !os.IsNotExist(err) {
		t.Errorf("a refused credentials call left %s behind (%v)", denied, err)
	}
	if r := run(ep, admin, "user", "credentials", "alice"); r.code == 0 || !strings.Contains(r.stderr, "--out") {
		t.Errorf("credentials without --out: %+v", r)
	}
}
