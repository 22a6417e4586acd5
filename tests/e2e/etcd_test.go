package e2e

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startEtcd runs a single-member external etcd (the `etcd` binary, Debian's
// etcd-server package) on free ports and returns its client URL.
func startEtcd(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		skipf(t, "external etcd test skipped: no `etcd` binary on PATH (install Debian's etcd-server; .ci/run does)")
	}
	cport, pport := freePort(t), freePort(t)
	client := "http://" + addr(cport)
	peer := "http://" + addr(pport)
	dir := filepath.Join(t.TempDir(), "etcd")
	cmd := exec.Command(bin, "--data-dir", dir, "--name", "default",
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "default="+peer)
	cmd.Env = baseEnv()
	log := &logBuf{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("==== etcd log ====\n%s\n==== end of etcd log ====", tail(log.String(), 10000))
		}
	})
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-done:
			t.Fatalf("etcd exited at start: %v\n%s", cmd.ProcessState, tail(log.String(), 10000))
		default:
		}
		if resp, err := hc.Get(client + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return client
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd not healthy after 30s\n%s", tail(log.String(), 10000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestExternalEtcdFreshDataDir: `basalt server --meta-endpoints URL` with a
// data dir that does not exist yet must come up, like the embedded mode does.
func TestExternalEtcdFreshDataDir(t *testing.T) {
	t.Parallel()
	ep := startEtcd(t)
	n := StartNode(t, NodeOptions{Name: "ext1", Args: []string{"--meta-endpoints", ep}})
	st := n.Admin().Status()
	if st.Metadata.Embedded || !st.Metadata.Healthy || !st.Store.Healthy {
		t.Errorf("status with external etcd: metadata %+v store %+v", st.Metadata, st.Store)
	}
	for _, f := range []string{"ca.pem", "cert.pem", "key.pem", "s3.env"} {
		if !exists(filepath.Join(n.AdminDir(), f)) {
			t.Errorf("admin identity lacks %s", f)
		}
	}
	// DATA/pki holds the cluster CA, as in embedded mode (brief §2).
	ca, err := os.ReadFile(filepath.Join(n.Data, "pki", "ca.pem"))
	if err != nil {
		t.Errorf("the first node of an external-etcd cluster keeps no CA in DATA/pki: %v", err)
	} else if !bytes.Equal(ca, mustRead(t, filepath.Join(n.AdminDir(), "ca.pem"))) {
		t.Errorf("DATA/pki/ca.pem differs from the admin identity's ca.pem")
	}
	n.StopOK()
	n.Restart()
	n.Admin().OK(nil, "status") // the identity from the first start still works
	n.StopOK()
}

// TestExternalEtcdCluster: the core flow against an external etcd, a
// restart, then a second node sharing the etcd and the store: the cluster CA
// and every record are shared, and revocation through one node holds on the
// other.
func TestExternalEtcdCluster(t *testing.T) {
	t.Parallel()
	ep := startEtcd(t)
	store := filepath.Join(t.TempDir(), "shared-store")
	opts := func(name string) NodeOptions {
		data := filepath.Join(t.TempDir(), "data-"+name)
		return NodeOptions{Name: name, Data: data, Store: store, Args: []string{"--meta-endpoints", ep}}
	}
	n1 := StartNode(t, opts("node1"))
	admin1 := n1.Admin()
	st := admin1.Status()
	if st.Metadata.Embedded {
		t.Errorf("status: metadata.embedded = true with --meta-endpoints")
	}
	if !st.Metadata.Healthy || !st.Store.Healthy {
		t.Errorf("status not healthy: %+v %+v", st.Metadata, st.Store)
	}

	// Core flow.
	alice := admin1.CreateUser("alice")
	vol := alice.CreateVolume("--size", "256MiB", "--name", "data")
	data := []region{{0, randomBytes(t, int(MiB))}, {100 * MiB, randomBytes(t, int(3*MiB))}}
	alice.WriteRegions("data", data)
	snap := alice.CreateSnapshot("data", "--name", "s")
	if snap.Status != "available" {
		t.Fatalf("snapshot: %+v", snap)
	}
	clone := alice.CreateVolume("--from-snapshot", "s", "--name", "clone")
	if clone.Status != "available" {
		t.Fatalf("clone: %+v", clone)
	}
	alice.CheckVolume("clone", clone.ID, data)
	volsBefore := admin1.OK(nil, "volume", "list").Stdout
	snapsBefore := admin1.OK(nil, "snapshot", "list").Stdout

	n1.StopOK()
	n1.Restart()
	if got := admin1.OK(nil, "volume", "list").Stdout; got != volsBefore {
		t.Errorf("volume list changed across restart:\nbefore: %s\nafter:  %s", volsBefore, got)
	}
	if got := admin1.OK(nil, "snapshot", "list").Stdout; got != snapsBefore {
		t.Errorf("snapshot list changed across restart:\nbefore: %s\nafter:  %s", snapsBefore, got)
	}
	if v := alice.Volume("clone"); v.ID != clone.ID || v.Status != "available" {
		t.Errorf("alice's clone after restart: %+v", v)
	}
	alice.CheckVolume("clone after restart", clone.ID, data)
	if st := admin1.Status(); st.Metadata.Embedded || !st.Metadata.Healthy {
		t.Errorf("status after restart: %+v", st.Metadata)
	}

	// A second node on the same etcd and store.
	n2 := StartNode(t, opts("node2"))
	if !bytes.Equal(mustRead(t, filepath.Join(n2.AdminDir(), "ca.pem")), mustRead(t, filepath.Join(n1.AdminDir(), "ca.pem"))) {
		t.Errorf("node2 did not adopt the cluster CA stored in etcd")
	}
	// A third node, on a data directory of its own, under node2's name
	// while node2 runs: refused before it takes node2's liveness,
	// write leases and record (no join checks names on --meta-endpoints).
	dupCtx, dupCancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer dupCancel()
	dup := exec.CommandContext(dupCtx, basaltBin, "server", "--data", filepath.Join(t.TempDir(), "data-dup"), "--name", "node2",
		"--store", store, "--meta-endpoints", ep, "--api", addr(freePort(t)), "--s3", addr(freePort(t)),
		"--nbd", addr(freePort(t)), "--etcd-client", addr(freePort(t)), "--etcd-peer", addr(freePort(t)))
	dup.Env = baseEnv()
	dupOut, err := dup.CombinedOutput()
	if code := dup.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(dupOut), "NodeExists") {
		t.Errorf("a second node named node2 while node2 runs: exit %d (%v), want 1 with NodeExists:\n%s", code, err, tail(string(dupOut), 4000))
	}
	admin1on2 := n2.As(n1.AdminDir()) // node 1's admin identity, talking to node 2
	var seen Volume
	admin1on2.OK(&seen, "volume", "show", vol.ID)
	if seen.Owner != "alice" || seen.SizeBytes != 256*MiB {
		t.Errorf("node2's view of alice's volume: %+v", seen)
	}
	if got := admin1on2.OK(nil, "volume", "list").Stdout; got != volsBefore {
		t.Errorf("node2's volume list differs from node1's:\nnode1: %s\nnode2: %s", volsBefore, got)
	}
	st1, st2 := admin1.Status(), admin1on2.Status()
	if st1.Node.ClusterID != st2.Node.ClusterID {
		t.Errorf("the two nodes report different cluster ids: %s, %s", st1.Node.ClusterID, st2.Node.ClusterID)
	}
	if st2.Node.Name != "node2" {
		t.Errorf("node2's status names node %q", st2.Node.Name)
	}
	// Both nodes are clients of an etcd that is not basalt's: its member
	// ("default") is neither listed nor removable as a node.
	var ns []NodeInfo
	admin1.OK(&ns, "node", "list")
	if len(ns) != 2 || ns[0].Role != "client" || ns[1].Role != "client" {
		t.Errorf("node list over an external etcd: %+v, want node1 and node2 as clients", ns)
	}
	admin1.Fail("NotFound", "node", "remove", "default")

	// alice works through node 2 with the identity node 1 issued, and a
	// volume she creates there is visible through node 1.
	aliceOn2 := n2.As(alice.Identity)
	v2 := aliceOn2.CreateVolume("--size", "64MiB", "--name", "via-node2")
	if got := alice.Volume("via-node2"); got.ID != v2.ID {
		t.Errorf("node1 resolves alice's via-node2 to %s, want %s", got.ID, v2.ID)
	}
	if !exists(n1.VolumeDir(v2.ID)) || !exists(n1.ImageDir(n1.TopImage(alice, v2.ID))) {
		t.Errorf("volume created through node2 has no directory or image in the shared store")
	}
	// Its data, written through node 2, reads back through node 1, and
	// alice's clone made on node 1 reads back through node 2.
	more := []region{{MiB, randomBytes(t, int(MiB))}}
	aliceOn2.WriteRegions("via-node2", more)
	alice.CheckVolume("volume written through node2, read through node1", v2.ID, more)
	aliceOn2.CheckVolume("clone made on node1, read through node2", clone.ID, data)
	// node 2's own admin identity works on node 1 too.
	n1.As(n2.AdminDir()).OK(nil, "volume", "show", v2.ID)

	// A user deleted through node 2 is refused on node 1.
	n2.Admin().OK(nil, "user", "delete", "alice")
	alice.Fail("CertificateRevoked", "volume", "list")
	aliceOn2.Fail("CertificateRevoked", "volume", "list")
	status, code, _ := call(t, identityHTTP(t, alice.Identity), "GET", n1.Endpoint()+"/v1/volumes", "")
	if status != http.StatusUnauthorized || code != "CertificateRevoked" {
		t.Errorf("deleted alice on node1: HTTP %d %s, want 401 CertificateRevoked", status, code)
	}

	n2.StopOK()
	n1.StopOK()
}
