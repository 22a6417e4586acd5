package e2e

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStartupFreshDataDir: a fresh data dir comes up healthy with an admin
// identity, `status` reports health, SIGTERM exits 0 promptly and a restart
// reuses the CA and the admin identity.
func TestStartupFreshDataDir(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})

	// healthz needs no client certificate.
	ca := mustRead(t, filepath.Join(n.Data, "pki", "ca.pem"))
	code, _, body := call(t, tlsClient(t, ca), "GET", n.Endpoint()+"/healthz", "")
	if code != http.StatusOK {
		t.Fatalf("GET /healthz without a client certificate: HTTP %d %s", code, body)
	}

	// The admin identity directory holds the four files.
	for _, f := range []string{"ca.pem", "cert.pem", "key.pem", "s3.env"} {
		p := filepath.Join(n.AdminDir(), f)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("admin identity: %v", err)
		}
		if len(b) == 0 {
			t.Errorf("admin identity: %s is empty", p)
		}
	}
	env := string(mustRead(t, filepath.Join(n.AdminDir(), "s3.env")))
	for _, k := range []string{"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY="} {
		if !strings.Contains(env, k) {
			t.Errorf("admin s3.env lacks %s: %q", k, env)
		}
	}
	if !bytes.Equal(mustRead(t, filepath.Join(n.AdminDir(), "ca.pem")), ca) {
		t.Errorf("admin identity ca.pem differs from DATA/pki/ca.pem")
	}
	if st, err := os.Stat(filepath.Join(n.AdminDir(), "key.pem")); err == nil && st.Mode().Perm()&0o077 != 0 {
		t.Errorf("admin key.pem is readable by others: %v", st.Mode())
	}

	// The server tells where the admin identity is (brief §2).
	if !strings.Contains(n.Log(), n.AdminDir()) {
		t.Errorf("the server's output does not mention the admin identity %s", n.AdminDir())
	}

	// status: exit 0, healthy metadata and store.
	admin := n.Admin()
	r := admin.Run("status")
	if r.Code != 0 {
		t.Fatalf("status: %s", r)
	}
	st := admin.Status()
	if !st.Metadata.Healthy || !st.Store.Healthy {
		t.Errorf("status not healthy: metadata %+v store %+v", st.Metadata, st.Store)
	}
	if !st.Metadata.Embedded {
		t.Errorf("status: metadata.embedded = false for a node without --meta-endpoints")
	}
	if st.Store.Path != n.StoreDir() {
		t.Errorf("status: store.path %q, want %q", st.Store.Path, n.StoreDir())
	}
	if st.Node.ClusterID == "" {
		t.Errorf("status: empty node.cluster_id")
	}

	// SIGTERM: exit 0 within 15 s.
	code2, took := n.Stop()
	if code2 != 0 {
		t.Errorf("exit status after SIGTERM: %d, want 0", code2)
	}
	if took > 15*time.Second {
		t.Errorf("exit after SIGTERM took %v", took)
	}

	adminCert := mustRead(t, filepath.Join(n.AdminDir(), "cert.pem"))
	n.Restart()
	if !bytes.Equal(mustRead(t, filepath.Join(n.Data, "pki", "ca.pem")), ca) {
		t.Errorf("restart replaced the CA (DATA/pki/ca.pem changed)")
	}
	if !bytes.Equal(mustRead(t, filepath.Join(n.AdminDir(), "cert.pem")), adminCert) {
		t.Errorf("restart replaced the admin certificate although the old one was valid")
	}
	st2 := admin.Status() // the identity from before the restart still works
	if st2.Node.ClusterID != st.Node.ClusterID {
		t.Errorf("cluster id changed across restart: %s -> %s", st.Node.ClusterID, st2.Node.ClusterID)
	}
	n.StopOK()
}

// TestStartupFailureIsReported: a node that cannot start (its API port is
// taken) must say why on stderr and exit 1 — not crash.
func TestStartupFailureIsReported(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	data := filepath.Join(t.TempDir(), "data")
	cmd := exec.Command(basaltBin, "server", "--data", data, "--name", "busy",
		"--api", addr(port), "--etcd-client", addr(freePort(t)), "--etcd-peer", addr(freePort(t)),
		"--s3", addr(freePort(t)), "--nbd", addr(freePort(t)))
	cmd.Env = baseEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("server with a taken --api port did not exit within 60s:\n%s", tail(out.String(), 20000))
	}
	code := cmd.ProcessState.ExitCode()
	log := out.String()
	if code != 1 {
		t.Errorf("exit status %d, want 1 (brief §3: errors exit 1)", code)
	}
	if strings.Contains(log, "panic:") || strings.Contains(log, "SIGSEGV") {
		t.Errorf("the server crashed instead of reporting its start failure")
	}
	if !strings.Contains(log, "address already in use") {
		t.Errorf("stderr does not say why the server could not start (expected \"address already in use\")")
	}
	if t.Failed() {
		t.Logf("server output:\n%s", tail(log, 20000))
	}
}
