package cli

// Tests of the CLI against a real node (server.Start on loopback
// ports, embedded etcd) or, where a node cannot be made to answer so, a
// fake API server presenting a certificate of a test CA.

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/pki"
	"github.com/basalt-storage/basalt/internal/server"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startNode starts a one-node cluster and returns its API endpoint and
// the admin identity directory.
func startNode(t *testing.T) (endpoint, adminDir string) {
	t.Helper()
	dir := t.TempDir()
	addr := freeAddr(t)
	cfg := server.Config{Name: "n1", Data: filepath.Join(dir, "data"), Store: filepath.Join(dir, "store"),
		API: addr, S3: freeAddr(t), NBD: freeAddr(t), EtcdClient: freeAddr(t), EtcdPeer: freeAddr(t),
		Overcommit: 1, Voters: 1, S3TrustFile: filepath.Join(dir, "trust-{uid}")}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n, err := server.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return "https://" + addr, n.AdminDir
}

type runResult struct {
	code           int
	stdout, stderr string
}

// run runs the CLI with the given endpoint and identity.
func run(endpoint, identity string, args ...string) runResult {
	var o, e bytes.Buffer
	code := Main(append([]string{"--endpoint", endpoint, "--identity", identity}, args...), &o, &e)
	return runResult{code, o.String(), e.String()}
}

// TestUserCreateOut: the server keeps neither the private key nor
// the S3 secret of a new user; the answer to the create is their only
// copy. An --out the CLI could not write used to be found out only after
// the user was created: the identity was lost and the name taken (a retry
// fails with UserExists); an --out holding another identity had its key
// overwritten. Both must fail before anything is created, and a refused
// create must not leave the directory behind.
func TestUserCreateOut(t *testing.T) {
	ep, admin := startNode(t)
	tmp := t.TempDir()

	file := filepath.Join(tmp, "a-file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(ep, admin, "user", "create", "carol", "--out", file)
	if r.code != 1 || !strings.Contains(r.stderr, "("+CodeIdentity+")") {
		t.Errorf("user create --out FILE: exit %d, stderr %q; want 1 and %s", r.code, r.stderr, CodeIdentity)
	}
	if r := run(ep, admin, "user", "show", "carol"); r.code != 1 || !strings.Contains(r.stderr, "(NotFound)") {
		t.Errorf("after a create whose --out could not be written, carol exists: %+v", r)
	}

	alice := filepath.Join(tmp, "alice")
	if r := run(ep, admin, "user", "create", "alice", "--out", alice); r.code != 0 {
		t.Fatalf("user create alice: %+v", r)
	}
	key, err := os.ReadFile(filepath.Join(alice, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	r = run(ep, admin, "user", "create", "bob", "--out", alice)
	if r.code != 1 || !strings.Contains(r.stderr, "("+CodeIdentity+")") {
		t.Errorf("user create bob --out ALICE'S-IDENTITY: exit %d, stderr %q; want 1 and %s", r.code, r.stderr, CodeIdentity)
	}
	if r := run(ep, admin, "user", "show", "bob"); r.code != 1 {
		t.Errorf("bob was created although his --out was refused: %+v", r)
	}
	if now, _ := os.ReadFile(filepath.Join(alice, "key.pem")); !bytes.Equal(now, key) {
		t.Errorf("alice's key.pem was overwritten by another user's")
	}
	if r := run(ep, alice, "user", "show", "alice"); r.code != 0 {
		t.Errorf("alice's identity no longer works: %+v", r)
	}

	fresh := filepath.Join(tmp, "bad")
	if r := run(ep, admin, "user", "create", "Bad/Name", "--out", fresh); r.code != 1 || !strings.Contains(r.stderr, "(InvalidName)") {
		t.Errorf("user create Bad/Name: %+v", r)
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("a refused user create left %s behind (%v)", fresh, err)
	}
	// An empty directory made beforehand is fine.
	empty := filepath.Join(tmp, "dave")
	os.Mkdir(empty, 0o700)
	if r := run(ep, admin, "user", "create", "dave", "--out", empty); r.code != 0 {
		t.Errorf("user create --out EMPTY-DIR: %+v", r)
	}

	// A join token's --ttl must be in range: 0 used to give a 24-hour
	// token and exit 0 (the server read an explicit 0 as its default).
	if r := run(ep, admin, "node", "join-token", "--ttl", "0"); r.code != 1 || !strings.Contains(r.stderr, "(InvalidRequest)") {
		t.Errorf("node join-token --ttl 0: %+v", r)
	}
}

// fakeAPI serves h over TLS with a certificate of a test CA and returns
// the endpoint and an identity directory that trusts it.
func fakeAPI(t *testing.T, h http.Handler) (endpoint, identity string) {
	t.Helper()
	ca, err := pki.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServerCertificate(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	is, err := ca.IssueClient("admin", "id-admin", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	identity = t.TempDir()
	if err := (&pki.Identity{CAPEM: ca.CertPEM, CertPEM: is.CertPEM, KeyPEM: is.KeyPEM}).Write(identity); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL, identity
}

// TestStatusJSONUnhealthy: `basalt -o json status` of an unhealthy
// node exits 1, and its stdout is one JSON document, the status (as the
// object commands do: the answer printed, the error on stderr). It used to
// be the status followed by a second document, the error, which no JSON
// parser reads as one value.
func TestStatusJSONUnhealthy(t *testing.T) {
	ep, id := fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(api.Status{Node: api.NodeStatus{Name: "n1"},
			Metadata: api.MetadataStatus{Healthy: true}, Store: api.StoreStatus{Healthy: false, Error: "store not writable"}})
	}))
	r := run(ep, id, "-o", "json", "status")
	if r.code != 1 || !strings.Contains(r.stderr, "(Unhealthy)") {
		t.Fatalf("status of an unhealthy node: %+v", r)
	}
	var st api.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Node.Name != "n1" || st.Store.Healthy {
		t.Errorf("-o json status: stdout is not one Status document (%v): %q", err, r.stdout)
	}
}

// TestBadAnswerCode: an answer the client cannot decode is the
// server's (or a proxy's) fault, not the command line's; it used to be
// reported with code UsageError, telling scripts to fix their arguments.
func TestBadAnswerCode(t *testing.T) {
	ep, id := fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "<html>not the API</html>")
	}))
	for _, o := range []string{"table", "json"} {
		r := run(ep, id, "-o", o, "volume", "list")
		if r.code != 1 || strings.Contains(r.stderr, "(UsageError)") || !strings.Contains(r.stderr, "(BadResponse)") {
			t.Errorf("-o %s volume list against a garbled answer: %+v; want exit 1 with code BadResponse", o, r)
		}
	}
}

// TestClientFlagsIgnoreEnv: of a client command's flags only the globals
// come from the environment. BASALT_NAME is a server's node name (every
// server flag reads BASALT_<FLAG>), and a shell that exports it for the
// server must not name every volume created there without --name.
func TestClientFlagsIgnoreEnv(t *testing.T) {
	endpoint, admin := startNode(t)
	t.Setenv("BASALT_NAME", "fromenv")
	t.Setenv("BASALT_SIZE", "1GiB")
	t.Setenv("BASALT_OUTPUT", "json") // a global: still read
	r := run(endpoint, admin, "volume", "create", "--size", "1MiB")
	var v struct {
		Name      string `json:"name"`
		SizeBytes int64  `json:"size_bytes"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil {
		t.Fatalf("volume create: %+v", r)
	}
	if v.Name == "fromenv" || v.SizeBytes != 1<<20 {
		t.Errorf("volume create took its flags from the environment: %+v", v)
	}
}
