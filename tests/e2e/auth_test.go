package e2e

import (
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/pki"
)

// TestUserCreate: `user create --out DIR` writes a usable identity; only an
// administrator manages users.
func TestUserCreate(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	alice := admin.CreateUser("alice")

	for _, f := range []string{"ca.pem", "cert.pem", "key.pem", "s3.env"} {
		if b, err := os.ReadFile(filepath.Join(alice.Identity, f)); err != nil || len(b) == 0 {
			t.Errorf("alice's identity: %s missing or empty (%v)", f, err)
		}
	}
	env := string(mustRead(t, filepath.Join(alice.Identity, "s3.env")))
	vars := map[string]string{}
	for _, line := range strings.Split(env, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			vars[strings.TrimPrefix(k, "export ")] = v
		}
	}
	if vars["AWS_ACCESS_KEY_ID"] == "" || vars["AWS_SECRET_ACCESS_KEY"] == "" {
		t.Errorf("alice's s3.env lacks AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY: %q", env)
	}
	if st, err := os.Stat(filepath.Join(alice.Identity, "key.pem")); err == nil && st.Mode().Perm()&0o077 != 0 {
		t.Errorf("alice's key.pem is readable by others: %v", st.Mode())
	}

	// The identity works, and the user is an ordinary user.
	alice.OK(nil, "status")
	var me User
	alice.OK(&me, "user", "show", "alice")
	if me.Name != "alice" || me.Admin {
		t.Errorf("alice's user show: %+v", me)
	}
	if me.AccessKeyID != vars["AWS_ACCESS_KEY_ID"] {
		t.Errorf("user show access key %q != s3.env %q", me.AccessKeyID, vars["AWS_ACCESS_KEY_ID"])
	}
	var users []User
	admin.OK(&users, "user", "list")
	names := []string{}
	for _, u := range users {
		names = append(names, u.Name)
	}
	if !slices.Contains(names, "alice") || !slices.Contains(names, "admin") {
		t.Errorf("user list = %v, want admin and alice", names)
	}

	// Only admin manages users.
	out := filepath.Join(t.TempDir(), "bob")
	alice.Fail("AdminRequired", "user", "create", "bob", "--out", out)
	if exists(filepath.Join(out, "cert.pem")) {
		t.Errorf("a refused user create wrote an identity")
	}
	admin.Fail("NotFound", "user", "show", "bob")
	alice.Fail("AdminRequired", "user", "list")
	alice.Fail("AdminRequired", "user", "delete", "alice")
	bob := admin.CreateUser("bob")
	alice.Fail("NotFound", "user", "show", "bob") // a user sees only themself
	bob.OK(nil, "user", "show", "bob")

	// Bad user requests.
	admin.Fail("UserExists", "user", "create", "alice", "--out", filepath.Join(t.TempDir(), "a2"))
	admin.Fail("InvalidName", "user", "create", "Bad/Name", "--out", filepath.Join(t.TempDir(), "bad"))
	admin.Fail("NotFound", "user", "delete", "nobody")
	admin.Fail("UserProtected", "user", "delete", "admin")
	// alice's identity was not disturbed by the failed re-create.
	alice.OK(nil, "status")

	// Secrets never appear in the server's log (brief §9).
	log := n.Log()
	for _, id := range []string{alice.Identity, bob.Identity, n.AdminDir()} {
		env := string(mustRead(t, filepath.Join(id, "s3.env")))
		for _, line := range strings.Split(env, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok && k == "AWS_SECRET_ACCESS_KEY" && strings.Contains(log, v) {
				t.Errorf("the server log contains the S3 secret key of %s", id)
			}
		}
	}
	if strings.Contains(log, "PRIVATE KEY") {
		t.Errorf("the server log contains a private key")
	}
}

// TestCertificateRejections: the API refuses requests without a valid,
// live client certificate, each with its own 401 code.
func TestCertificateRejections(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	alice := admin.CreateUser("alice")
	ca := mustRead(t, filepath.Join(n.AdminDir(), "ca.pem"))
	url := n.Endpoint() + "/v1/volumes"

	expect := func(what string, c *http.Client, want string) {
		t.Helper()
		status, code, body := call(t, c, "GET", url, "")
		if status != http.StatusUnauthorized || code != want {
			t.Errorf("%s: HTTP %d %s, want 401 %s", what, status, strings.TrimSpace(string(body)), want)
		}
	}

	// The valid identity works (sanity).
	if status, _, body := call(t, identityHTTP(t, alice.Identity), "GET", url, ""); status != http.StatusOK {
		t.Fatalf("alice's valid certificate: HTTP %d %s", status, body)
	}

	expect("no client certificate", tlsClient(t, ca), "CertificateRequired")

	// Expired: signed by the cluster CA for alice's user id, but expired.
	clusterCA, err := pki.LoadCA(filepath.Join(n.Data, "pki", "ca.pem"), filepath.Join(n.Data, "pki", "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.ParseCertPEM(mustRead(t, filepath.Join(alice.Identity, "cert.pem")))
	if err != nil {
		t.Fatal(err)
	}
	uid := pki.UserID(leaf)
	if uid == "" {
		t.Fatalf("alice's certificate carries no user id (OU %v)", leaf.Subject.OrganizationalUnit)
	}
	expired, err := clusterCA.IssueClientWindow("alice", uid, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	expect("expired certificate", tlsClient(t, ca, keyPair(t, expired)), "CertificateExpired")

	// Not yet valid counts as untrusted or expired, but never as valid.
	future, err := clusterCA.IssueClientWindow("alice", uid, time.Now().Add(time.Hour), time.Now().Add(48*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if status, _, body := call(t, tlsClient(t, ca, keyPair(t, future)), "GET", url, ""); status != http.StatusUnauthorized {
		t.Errorf("not-yet-valid certificate: HTTP %d %s, want 401", status, body)
	}

	// Foreign CA: a perfectly shaped certificate for alice from another CA.
	foreign, err := pki.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	forged, err := foreign.IssueClient("alice", uid, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expect("certificate from a foreign CA", tlsClient(t, ca, keyPair(t, forged)), "CertificateUntrusted")

	// A cluster-CA certificate for a user that never existed.
	ghost, err := clusterCA.IssueClient("ghost", "0123456789abcdef", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expect("certificate of a user that does not exist", tlsClient(t, ca, keyPair(t, ghost)), "CertificateRevoked")

	// Deleted user: alice's own identity is refused from then on.
	admin.OK(nil, "user", "delete", "alice")
	expect("deleted user's certificate", identityHTTP(t, alice.Identity), "CertificateRevoked")
	alice.Fail("CertificateRevoked", "volume", "list")
	alice.Fail("CertificateRevoked", "status")
	admin.Fail("NotFound", "user", "show", "alice")

	// A CLI without any identity says so instead of sending a request.
	nobody := n.As(filepath.Join(t.TempDir(), "missing"))
	nobody.Fail("IdentityError", "volume", "list")
}

// TestUserRecreatedSameName: a user deleted and created again under the
// same name is a new user: the old certificate stays revoked and the new
// user sees none of the old user's volumes; admin still sees them.
func TestUserRecreatedSameName(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	old := admin.CreateUser("alice")
	oldVol := old.CreateVolume("--size", "64MiB", "--name", "data")
	oldSnap := old.CreateSnapshot("data", "--name", "snap")

	admin.OK(nil, "user", "delete", "alice")
	old.Fail("CertificateRevoked", "volume", "list")

	// The old user's volume stays, visible to admin.
	if v := admin.Volume(oldVol.ID); v.Owner != "alice" {
		t.Errorf("admin sees the deleted user's volume with owner %q", v.Owner)
	}

	neu := admin.CreateUser("alice")
	old.Fail("CertificateRevoked", "volume", "list") // still revoked after re-creation
	if status, code, _ := call(t, identityHTTP(t, old.Identity), "GET", n.Endpoint()+"/v1/volumes", ""); status != http.StatusUnauthorized || code != "CertificateRevoked" {
		t.Errorf("old alice certificate after re-creation: HTTP %d %s, want 401 CertificateRevoked", status, code)
	}

	if vs := neu.Volumes(); len(vs) != 0 {
		t.Errorf("the new alice sees %d volume(s) of the old one: %+v", len(vs), vs)
	}
	if ss := neu.Snapshots(); len(ss) != 0 {
		t.Errorf("the new alice sees %d snapshot(s) of the old one: %+v", len(ss), ss)
	}
	neu.Fail("NotFound", "volume", "show", oldVol.ID)
	neu.Fail("NotFound", "volume", "show", "data")
	neu.Fail("NotFound", "snapshot", "show", oldSnap.ID)
	neu.Fail("NotFound", "volume", "delete", oldVol.ID)
	neu.Fail("NotFound", "volume", "create", "--from-snapshot", oldSnap.ID)

	// The name is free for the new user.
	newVol := neu.CreateVolume("--size", "64MiB", "--name", "data")
	if newVol.ID == oldVol.ID {
		t.Fatalf("the new alice's volume has the old one's id")
	}
	if v := neu.Volume("data"); v.ID != newVol.ID {
		t.Errorf("the new alice's \"data\" resolves to %s, want %s", v.ID, newVol.ID)
	}

	ids := map[string]bool{}
	for _, v := range admin.Volumes() {
		ids[v.ID] = true
	}
	if !ids[oldVol.ID] || !ids[newVol.ID] {
		t.Errorf("admin's list lacks the old (%s) or the new (%s) alice volume: %v", oldVol.ID, newVol.ID, ids)
	}
}

func keyPair(t *testing.T, is *pki.Issued) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(is.CertPEM, is.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
