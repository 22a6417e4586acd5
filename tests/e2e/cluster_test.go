package e2e

// Active/active clusters: nodes joining (admin identity, join token), roles
// and health in `node list`, read-your-writes across nodes, losing a voter
// and losing quorum, node removal. Every node is a separate process on its
// own ports and data directory; all share one store directory, as nodes on
// a parallel file system do.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// NodeInfo is one entry of `basalt node list -o json`.
type NodeInfo struct {
	Name   string `json:"name"`
	Role   string `json:"role"`
	Health string `json:"health"`
	API    string `json:"api"`
	S3     string `json:"s3"`
	NBD    string `json:"nbd"`
}

// Cluster is a set of nodes sharing one store.
type Cluster struct {
	t     *testing.T
	Store string
	Nodes []*Node
}

// StartCluster starts n nodes: the first bootstraps the cluster, the
// others join it through the first with its admin identity. It returns
// once every node reports itself healthy in `node list`.
func StartCluster(t *testing.T, n int, extra ...string) *Cluster {
	t.Helper()
	c := &Cluster{t: t, Store: filepath.Join(t.TempDir(), "store")}
	first := StartNode(t, NodeOptions{Name: "n1", Store: c.Store, Args: extra})
	c.Nodes = append(c.Nodes, first)
	for i := 2; i <= n; i++ {
		c.Join(fmt.Sprintf("n%d", i), "--identity", first.AdminDir())
	}
	// Learners promote themselves "usually within seconds"
	// (docs/cluster.md); as startNetCluster, room for a loaded machine.
	c.WaitRoles(20*time.Second*time.Duration(n), nil)
	return c
}

// Join starts a node that joins through the first node with auth (e.g.
// "--identity", DIR or "--join-token", T).
func (c *Cluster) Join(name string, auth ...string) *Node {
	c.t.Helper()
	args := append([]string{"--join", c.Nodes[0].Endpoint()}, auth...)
	n := StartNode(c.t, NodeOptions{Name: name, Store: c.Store, Args: args})
	c.Nodes = append(c.Nodes, n)
	return n
}

// Admin is the cluster's admin talking to node i.
func (c *Cluster) Admin(i int) *Client { return c.Nodes[i].As(c.Nodes[0].AdminDir()) }

// NodeList is `node list` through node i.
func (c *Cluster) NodeList(i int) []NodeInfo {
	c.t.Helper()
	var ns []NodeInfo
	c.Admin(i).OK(&ns, "node", "list")
	return ns
}

// WaitRoles waits until `node list` (through any running node) shows every
// running node healthy and, if want is given, exactly those roles.
func (c *Cluster) WaitRoles(timeout time.Duration, want map[string]string) []NodeInfo {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var last []NodeInfo
	for {
		for i, n := range c.Nodes {
			if !n.Running() {
				continue
			}
			r := c.Admin(i).Run("node", "list")
			if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &last) != nil {
				continue
			}
			if c.rolesOK(last, want) {
				return last
			}
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node list did not settle within %v (want roles %v): %+v", timeout, want, last)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func (c *Cluster) rolesOK(ns []NodeInfo, want map[string]string) bool {
	byName := map[string]NodeInfo{}
	for _, n := range ns {
		byName[n.Name] = n
	}
	for _, n := range c.Nodes {
		got, ok := byName[n.opts.Name]
		if !ok || (got.Health == "healthy") != n.Running() {
			return false
		}
		if n.Running() && want == nil && got.Role == "learner" {
			return false // still catching up
		}
	}
	for name, role := range want {
		if byName[name].Role != role {
			return false
		}
	}
	return want == nil || len(ns) == len(want)
}

func TestClusterMembership(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 2)
	// A join token: the third node joins through the second.
	var tok struct {
		Token     string `json:"token"`
		ExpiresAt string `json:"expires_at"`
	}
	c.Admin(1).OK(&tok, "node", "join-token", "--ttl", "10m")
	if !strings.HasPrefix(tok.Token, "basalt-join.") {
		t.Fatalf("join token %q", tok.Token)
	}
	n3 := StartNode(t, NodeOptions{Name: "n3", Store: c.Store, Args: []string{"--join", c.Nodes[1].Endpoint(), "--join-token", tok.Token}})
	c.Nodes = append(c.Nodes, n3)
	// Beyond 3 voters, nodes are etcd clients.
	c.Join("n4", "--join-token", tok.Token)
	ns := c.WaitRoles(60*time.Second, map[string]string{"n1": "voter", "n2": "voter", "n3": "voter", "n4": "client"})
	for _, n := range ns {
		if n.API == "" || n.S3 == "" || n.NBD == "" {
			t.Errorf("node list entry without endpoints: %+v", n)
		}
	}
	var rawList []json.RawMessage
	c.Admin(3).OK(&rawList, "node", "list")
	requireKeys(t, "node list entry", rawList[0], "name", "role", "health", "api", "s3", "nbd")

	// Any node serves; what one node wrote the next one reads at once.
	for i := range 8 {
		from, to := c.Admin(i%4), c.Admin((i+1)%4)
		v := from.CreateVolume("--size", "64MiB", "--name", fmt.Sprintf("ryw-%d", i))
		if got := to.Volume(v.ID); got.ID != v.ID || got.Status != "available" {
			t.Fatalf("volume created through n%d, read through n%d: %+v", i%4+1, (i+1)%4+1, got)
		}
	}

	// The token revoked before it expires: a join with it is refused, as
	// one with a forged token, and the node does not start.
	c.Admin(0).OK(nil, "node", "join-token", "--revoke", tok.Token)
	c.Admin(2).Fail("NotFound", "node", "join-token", "--revoke", tok.Token)
	out, code := runFailingServer(t, c, "n5", "--join", c.Nodes[0].Endpoint(), "--join-token", tok.Token)
	if code != 1 || !strings.Contains(out, "InvalidJoinToken") {
		t.Errorf("join with a revoked token: exit %d, want 1 with InvalidJoinToken:\n%s", code, tail(out, 4000))
	}

	// One voter lost: everything goes on; node list shows it unhealthy.
	c.Nodes[0].Kill()
	c.Admin(1).CreateVolume("--size", "64MiB", "--name", "one-down")
	c.WaitRoles(30*time.Second, nil)

	// Quorum lost: writes fail quickly with a clear error; reads go on.
	c.Nodes[1].Kill()
	start := time.Now()
	c.Admin(2).Fail("MetadataUnavailable", "volume", "create", "--size", "64MiB", "--name", "no-quorum")
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("a write without quorum took %v to fail", took)
	}
	for _, i := range []int{2, 3} {
		start := time.Now()
		vs := c.Admin(i).Volumes()
		if len(vs) != 9 {
			t.Errorf("volume list through n%d without quorum: %d volumes, want 9", i+1, len(vs))
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("a read without quorum through n%d took %v", i+1, took)
		}
	}
	// node list too, from the node's own view.
	start = time.Now()
	if ns := c.NodeList(2); len(ns) != 4 {
		t.Errorf("node list without quorum: %+v", ns)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("node list without quorum took %v", took)
	}
	// A voter back: writes resume.
	c.Nodes[0].Restart()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := c.Admin(2).Run("volume", "create", "--size", "64MiB", "--name", "quorum-back")
		if r.Code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writes did not resume after a voter came back: %s", r)
		}
		time.Sleep(500 * time.Millisecond)
	}
	c.Nodes[1].Restart()
	c.WaitRoles(60*time.Second, nil)

	// Removing a node: it leaves the list and its process stops.
	c.Admin(0).OK(nil, "node", "remove", "n4")
	select {
	case <-c.Nodes[3].done:
	case <-time.After(20 * time.Second):
		t.Fatalf("n4 still runs 20s after it was removed")
	}
	for _, n := range c.NodeList(2) {
		if n.Name == "n4" {
			t.Errorf("n4 still listed after removal: %+v", n)
		}
	}
	c.Admin(0).Fail("NotFound", "node", "remove", "n4")
	c.Admin(0).Fail("NodeIsSelf", "node", "remove", "n1")
}

// TestClusterRemoveVoter: `node remove` of a running voter — the first
// node, whose etcd client may know no member but its own — takes it out
// cleanly: the removed process releases its volume's write lease, exits 0
// saying why, and never panics (etcd panics when asked whether a removed
// member is a learner); the two voters left serve writes, and one of the
// two client nodes steps up to voter by itself — resuming after crashes
// at each step — so that the cluster again survives the loss of a voter.
// Client nodes serve joins and list the cluster's roles like voters.
func TestClusterRemoveVoter(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	n1 := c.Nodes[0]
	// The client nodes crash when they begin to step up (below).
	crash := []string{"BASALT_FAILPOINT=step-up-learner-added"}
	n4 := StartNode(t, NodeOptions{Name: "n4", Store: c.Store, Env: crash, Args: []string{"--join", n1.Endpoint(), "--identity", n1.AdminDir()}})
	c.Nodes = append(c.Nodes, n4)
	// n5 joins through n4, a client node (which runs no etcd member).
	n5 := StartNode(t, NodeOptions{Name: "n5", Store: c.Store, Env: crash, Args: []string{"--join", n4.Endpoint(), "--identity", n1.AdminDir()}})
	c.Nodes = append(c.Nodes, n5)
	c.WaitRoles(60*time.Second, map[string]string{"n1": "voter", "n2": "voter", "n3": "voter", "n4": "client", "n5": "client"})
	// Asked of a client node, node list shows the voters as voters.
	for _, n := range c.NodeList(4) {
		if want := map[bool]string{true: "voter", false: "client"}[n.Name <= "n3"]; n.Role != want {
			t.Errorf("node list through client node n5: %s is %s, want %s", n.Name, n.Role, want)
		}
	}
	c.Admin(0).CreateVolume("--size", "64MiB", "--name", "held")
	a := c.Admin(0).Attach("held", "h1", "rw")
	if a.NBDURI != n1.nbdBase()+a.Export {
		t.Fatalf("attachment made through n1 has nbd_uri %s, want n1's (n1 holds the write lease)", a.NBDURI)
	}
	// Watched from before the removal (n1 shuts down while `node remove`
	// runs): when another node serves the attachment. Through n3 with n3's
	// own admin identity: the removal revokes n1's (c.Admin's).
	movedc, stop := make(chan attachmentMove, 1), make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go watchAttachmentMove(c.Nodes[2].Admin(), a, movedc, stop)
	// Status asked of every node throughout, the removed one included:
	// etcd's own status handler panics on a member between applying its
	// removal and stopping, so a node must not ask it.
	hc := identityHTTP(t, n1.AdminDir())
	for _, n := range c.Nodes {
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				if r, err := hc.Get(n.Endpoint() + "/v1/status"); err == nil {
					io.Copy(io.Discard, r.Body)
					r.Body.Close()
				}
			}
		}()
	}
	// etcd removes a voter only once the others have been connected to
	// every voter for 5 s; n3 was promoted a moment ago (409
	// WouldLoseQuorum until then: not a bound of basalt's, room for a
	// loaded machine). Any other failure is one: the requests after the
	// member's removal once met the removed member ("raft: stopped", a
	// 500) and left n1 registered with a valid identity.
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := c.Nodes[1].Admin().Run("node", "remove", "n1") // not n1's identity, which the removal revokes
		if r.Code == 0 {
			break
		}
		if !strings.Contains(r.Stderr, "WouldLoseQuorum") || time.Now().After(deadline) {
			t.Fatalf("node remove n1 through n2: %s", r)
		}
		time.Sleep(500 * time.Millisecond)
	}
	select {
	case <-n1.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("n1 still runs 15s after it was removed")
	}
	if code := n1.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("removed n1 exited %d, want 0", code)
	}
	log := n1.Log()
	for _, bad := range []string{"panic", "goroutine "} {
		if strings.Contains(log, bad) {
			t.Errorf("removed n1's log holds %q:\n%s", bad, tail(log, 4000))
		}
	}
	for _, want := range []string{"this node was removed from the cluster; stopping", "msg=stopped"} {
		if !strings.Contains(log, want) {
			t.Errorf("removed n1's log lacks %q:\n%s", want, tail(log, 4000))
		}
	}

	c.Nodes = c.Nodes[1:] // n2 is the cluster's first node now
	// A client node may begin to step up (and crash, below) meanwhile:
	// it shows unhealthy only once its 5 s liveness lease has expired.
	ns := c.WaitRoles(60*time.Second, nil)
	for _, n := range ns {
		if n.Name == "n1" {
			t.Errorf("n1 still listed after its removal: %+v", n)
		}
	}
	// n1 released its write lease as it shut down: another node serves
	// the attachment well before the lease could have expired (its 5 s
	// TTL runs from the last renewal, which n1 sent every second until
	// then).
	var moved attachmentMove
	select {
	case moved = <-movedc:
	case <-time.After(15 * time.Second):
		t.Fatalf("nbd_uri still names the removed n1 15s after it exited")
	}
	if moved.err != nil {
		t.Fatal(moved.err)
	}
	shutdown, err := logTime(log, `msg="shutting down"`)
	if err != nil {
		t.Fatal(err)
	}
	took := moved.at.Sub(shutdown)
	t.Logf("the attachment moved to %s %v after n1 began to shut down", moved.a.NBDURI, took.Round(time.Millisecond))
	if took > 3500*time.Millisecond {
		t.Errorf("the attachment moved off n1 %v after n1 began to shut down: its write lease expired instead of being released", took)
	}
	if !slices.ContainsFunc(c.Nodes, func(n *Node) bool { return moved.a.NBDURI == n.nbdBase()+a.Export }) {
		t.Errorf("nbd_uri %s names no live node", moved.a.NBDURI)
	}
	c.Admin(0).CreateVolume("--size", "64MiB", "--name", "after-removal-2")
	c.Admin(1).CreateVolume("--size", "64MiB", "--name", "after-removal-3")

	// One client node steps up. It crashes once its learner is added
	// (before it recorded that), and once more after it recorded it
	// (before its member started); each time it resumes when restarted —
	// and no other node can step up past its learner meanwhile.
	deadline = time.Now().Add(60 * time.Second)
	stepping := -1
	for stepping < 0 {
		for _, i := range []int{2, 3} {
			if !c.Nodes[i].Running() {
				stepping = i
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no client node stepped up (and crashed at step-up-learner-added) within 60s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	sn := c.Nodes[stepping]
	joined := func() string {
		st, _ := os.ReadFile(filepath.Join(sn.Data, "cluster.json"))
		var js struct{ Role string }
		json.Unmarshal(st, &js)
		return js.Role
	}
	if role := joined(); role != "client" {
		t.Errorf("%s crashed as its learner was added: cluster.json says %q, want client", sn.opts.Name, role)
	}
	sn.SetEnv("BASALT_FAILPOINT=step-up-state-saved")
	sn.Restart()
	select {
	case <-sn.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not resume its step up (and crash at step-up-state-saved) within 60s", sn.opts.Name)
	}
	if role := joined(); role != "learner" {
		t.Errorf("%s crashed before its member started: cluster.json says %q, want learner", sn.opts.Name, role)
	}
	sn.SetEnv()
	sn.Restart()
	// Then it becomes the third voter, the other stays a client.
	up, client := stepping, 5-stepping // indexes into c.Nodes (n2 n3 n4 n5)
	want := map[string]string{"n2": "voter", "n3": "voter", sn.opts.Name: "voter", c.Nodes[client].opts.Name: "client"}
	c.WaitRoles(60*time.Second, want)
	if log := c.Nodes[up].Log(); !strings.Contains(log, "promoted to voter") {
		t.Errorf("%s's log does not say it was promoted:\n%s", c.Nodes[up].opts.Name, tail(log, 4000))
	}
	if v := c.Admin(up).Volume("after-removal-3"); v.Name != "after-removal-3" {
		t.Errorf("the new voter reads %+v", v)
	}
	// Three voters again: losing one (n2) leaves a quorum.
	c.Nodes[0].Kill()
	c.Admin(client).CreateVolume("--size", "64MiB", "--name", "after-step-up")
	if v := c.Admin(up).Volume("after-step-up"); v.Name != "after-step-up" {
		t.Errorf("the new voter reads %+v", v)
	}
	// Restarted, the new voter comes back as a voter.
	c.Nodes[up].Kill()
	c.Nodes[up].Restart()
	c.Admin(up).CreateVolume("--size", "64MiB", "--name", "after-restart")
}

// attachmentMove is when `attachment show` first named another node.
type attachmentMove struct {
	a   Attachment
	at  time.Time
	err error
}

// watchAttachmentMove polls `attachment show` of a through cl for up to a
// minute, until stop, and sends the first answer whose nbd_uri differs
// from a's.
func watchAttachmentMove(cl *Client, a Attachment, movedc chan<- attachmentMove, stop <-chan struct{}) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-stop:
			return
		default:
		}
		var now Attachment
		r := cl.Run("attachment", "show", a.ID)
		if r.Code == 0 && json.Unmarshal([]byte(r.Stdout), &now) == nil && now.NBDURI != a.NBDURI {
			movedc <- attachmentMove{a: now, at: time.Now()}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	movedc <- attachmentMove{err: fmt.Errorf("attachment %s still served at %s after a minute", a.ID, a.NBDURI)}
}

// logTime is the time of the first line of a server log holding what.
func logTime(log, what string) (time.Time, error) {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, what) {
			continue
		}
		stamp, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		return time.Parse(time.RFC3339Nano, stamp)
	}
	return time.Time{}, fmt.Errorf("no log line holds %s", what)
}

// runFailingServer starts a server that must fail to start and returns
// its output and exit code.
func runFailingServer(t *testing.T, c *Cluster, name string, args ...string) (string, int) {
	t.Helper()
	n := NewNode(t, NodeOptions{Name: name, Store: c.Store, Args: args})
	cmd := exec.Command(basaltBin, n.serverArgs()...)
	cmd.Env = baseEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("server %s did not exit within 60s:\n%s", name, tail(out.String(), 4000))
	}
	return out.String(), cmd.ProcessState.ExitCode()
}

// nbdBase is node n's NBD URI without the export name.
func (n *Node) nbdBase() string { return "nbd://" + n.addr(n.NBD) + "/" }

// TestClusterWriteLeaseFailover: a rw attachment is served by the node that
// holds its volume's write lease, and only by it; when that node dies,
// another takes the lease over and `attachment show` names it within 10 s,
// with the data flushed before the death intact.
func TestClusterWriteLeaseFailover(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	c := StartCluster(t, 3)
	c.Admin(0).CreateVolume("--size", "64MiB", "--name", "ha")
	// Attached through n2: n2 writes the volume.
	a := c.Admin(1).Attach("ha", "hv1", "rw")
	if want := c.Nodes[1].nbdBase() + a.Export; a.NBDURI != want {
		t.Fatalf("attachment made through n2 has nbd_uri %s, want %s (n2 holds the write lease)", a.NBDURI, want)
	}
	var shown Attachment
	c.Admin(2).OK(&shown, "attachment", "show", a.ID)
	if shown.NBDURI != a.NBDURI {
		t.Fatalf("attachment show through n3: nbd_uri %s, want the holder's %s", shown.NBDURI, a.NBDURI)
	}
	qemuIOGood(t, "write through the holder", a.NBDURI, "write -P 0x5a 0 4M", "flush")
	// Any other node refuses the rw export: one writer at a time.
	if r := qemuIO(t, c.Nodes[2].nbdBase()+a.Export, "read 0 4k"); !qemuIOFailed(r) {
		t.Fatalf("n3 served a rw attachment whose volume n2 writes: %s", r)
	}
	// A snapshot asked of n3 is taken by n2, the writer: it holds what
	// was written before, nothing written after.
	sn := c.Admin(2).CreateSnapshot("ha", "--name", "ha-s")
	if sn.Status != "available" {
		t.Fatalf("snapshot through a node that does not write the volume: %+v", sn)
	}
	qemuIOGood(t, "write after the snapshot", a.NBDURI, "write -P 0x77 0 1M", "flush")
	c.Admin(0).CreateVolume("--from-snapshot", "ha-s", "--name", "ha-clone")
	ro := c.Admin(0).Attach("ha-clone", "hv2", "ro")
	if r := qemuIORO(t, ro.NBDURI, "read -P 0x5a 0 4M"); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Errorf("the snapshot's content: %s\n%s%s", r, r.Stdout, r.Stderr)
	}
	c.Admin(0).Detach(ro.ID)
	// An extend asked of n3 is done by n2: a new connection sees the size.
	var ext Volume
	c.Admin(2).OK(&ext, "volume", "extend", "ha", "--size", "80MiB")
	if ext.SizeBytes != 80<<20 || ext.Status != "in-use" {
		t.Fatalf("extend through a node that does not write the volume: %+v", ext)
	}
	if r := qemuIO(t, a.NBDURI, "length"); !strings.Contains(r.Stdout, "80 MiB") {
		t.Errorf("after the extend, the holder serves: %s\n%s", r, r.Stdout)
	}

	c.Nodes[1].Kill()
	start := time.Now()
	var moved Attachment
	for {
		c.Admin(0).OK(&moved, "attachment", "show", a.ID)
		if moved.NBDURI != a.NBDURI {
			break
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("nbd_uri still names the dead node after %v", time.Since(start))
		}
		time.Sleep(200 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("nbd_uri moved to %s %v after the holder died", moved.NBDURI, took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("the attachment named a live node only after %v, want within 10s", took)
	}
	if moved.NBDURI != c.Nodes[0].nbdBase()+a.Export && moved.NBDURI != c.Nodes[2].nbdBase()+a.Export {
		t.Fatalf("nbd_uri %s names no live node", moved.NBDURI)
	}
	qemuIOGood(t, "flushed data after the failover", moved.NBDURI, "read -P 0x77 0 1M", "read -P 0x5a 1M 3M")
	qemuIOGood(t, "write after the failover", moved.NBDURI, "write -P 0x6b 4M 1M", "flush", "read -P 0x6b 4M 1M")
}

// TestClusterJobAdoptedFromDeadNode: a flatten runs on the node that
// accepted it (the volume has no rw attachment, so no node held its write
// lease). That node is killed mid-job: another node adopts the job once
// the dead node's liveness key and write lease have expired, runs it to
// the end, and the clone holds its data. Before, the job stayed recorded
// for the dead node and the volume refused every other job for good.
func TestClusterJobAdoptedFromDeadNode(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "nbdcopy")
	c := StartCluster(t, 3)
	admin := c.Admin(0)
	admin.OK(nil, "type", "create", "slow", "--stack", stackFile(t, slowImagesStack))
	const size = 32 * MiB
	admin.CreateVolume("--size", sz(size), "--type", "slow", "--name", "src")
	data := []region{{0, randomBytes(t, int(16*MiB))}}
	admin.WriteRegions("src", data)
	admin.CreateSnapshot("src", "--name", "s")
	admin.CreateVolume("--from-snapshot", "s", "--name", "clone")

	// Asked of n2: n2 runs it (256 chunks at 40 operations a second).
	var started Volume
	c.Admin(1).OK(&started, "volume", "flatten", "clone")
	if started.Progress == nil || started.Progress.Job != "flatten" {
		t.Fatalf("volume flatten printed progress %+v, want a running flatten", started.Progress)
	}
	time.Sleep(time.Second)
	c.Nodes[1].Kill()
	killed := time.Now()
	got := admin.WaitJob("clone", 90*time.Second)
	if got.LastJob == nil || got.LastJob.Job != "flatten" || got.LastJob.Error != "" {
		t.Fatalf("flatten whose node died ended with last_job %+v", got.LastJob)
	}
	t.Logf("the adopted flatten ended %v after its node was killed", time.Since(killed).Round(time.Millisecond))
	log := c.Nodes[0].Log() + c.Nodes[2].Log()
	if !strings.Contains(log, "adopted the workflow of a node that is gone") {
		t.Errorf("no live node logged the adoption:\n%s", tail(log, 4000))
	}
	checkImage(t, "clone flattened by the node that adopted the job", admin.VolumeCopy("clone"), image(size, data))
	// The volume takes jobs again.
	admin.OK(nil, "volume", "flatten", "clone", "--wait")
}

// TestClusterJoinSurvivesCrash: a node killed in the middle of its join —
// right after the cluster added its member, before the member ran — joins
// when restarted, with no second member left behind.
func TestClusterJoinSurvivesCrash(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 1)
	n := NewNode(t, NodeOptions{Name: "n2", Store: c.Store, Args: []string{"--join", c.Nodes[0].Endpoint(), "--identity", c.Nodes[0].AdminDir()}})
	c.Nodes = append(c.Nodes, n)
	cmd := exec.Command(basaltBin, n.serverArgs()...)
	cmd.Env = baseEnv()
	cmd.Stdout, cmd.Stderr = n.log, n.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(n.Log(), "msg=joined") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("n2 never logged its join:\n%s", tail(n.Log(), 4000))
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	n.Start()
	ns := c.WaitRoles(60*time.Second, map[string]string{"n1": "voter", "n2": "voter"})
	if len(ns) != 2 {
		t.Fatalf("node list after the crashed join: %+v", ns)
	}
	c.Admin(1).CreateVolume("--size", "64MiB", "--name", "after-crash")
}

// TestClusterS3EveryNode: in a joined cluster every node's S3 gateway
// serves the same buckets over the shared store, and a user deleted through
// one node loses S3 access through all of them.
func TestClusterS3EveryNode(t *testing.T) {
	t.Parallel()
	requireTools(t, "aws")
	c := StartCluster(t, 3)
	alice := c.Nodes[0].S3User(c.Admin(0).CreateUser("alice"))
	data := randomBytes(t, 200<<10)
	src := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	alice.On(c.Nodes[1]).AWSOK("s3", "mb", "s3://everywhere")
	alice.On(c.Nodes[2]).AWSOK("s3", "cp", src, "s3://everywhere/obj")
	for _, n := range c.Nodes {
		got, etag := awsGetETag(t, alice.On(n), "everywhere", "obj")
		if !bytes.Equal(got, data) || etag != md5Of(data) {
			t.Fatalf("GET through %s: %d bytes, ETag %s", n.opts.Name, len(got), etag)
		}
	}
	c.Admin(2).OK(nil, "user", "delete", "alice")
	for _, n := range c.Nodes {
		alice.On(n).AWSFail("InvalidAccessKeyId", "s3", "ls", "s3://everywhere")
	}
}
