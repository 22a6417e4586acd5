package e2e

// A network lab for partitions: a bridge in the root namespace and one
// network namespace per node, each joined to the bridge by its own veth
// pair. Everything a node sends or receives — etcd peer and client
// traffic, the API, NBD — crosses its veth, so taking the veth down is a
// real partition (packets are dropped, not refused), and the test process
// in the root namespace reaches every node over the bridge. A client run
// inside a node's namespace (ip netns exec) still reaches that node while
// it is cut off: a hypervisor on the node's side of the partition.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	labSeq atomic.Int32
	labMu  sync.Mutex
)

// netLab is one test's bridge and namespaces.
type netLab struct {
	t      *testing.T
	id     string // short, unique: interface names have at most 15 bytes
	prefix string // 10.X.Y.
	bridge string
	n      int
	// rtoMaxMS, when set, is each namespace's net.ipv4.tcp_rto_max_ms:
	// the tuning docs/cluster.md advises for metadata voters.
	rtoMaxMS int
}

// newNetLab makes the bridge; its cleanup removes every namespace and link
// the lab made. Needs root and iproute2.
//
// Names and the subnet must not collide with another test process running
// at the same time (other packages, other checkouts on a shared machine)
// nor with a lab a killed run left behind (its cleanup never ran): the id
// holds the full pid (unique among live processes) and skips names that
// exist, and the subnet is the first free /24 from a pid-dependent start —
// two bridges with one subnet would send a node's packets to the wrong lab.
func newNetLab(t *testing.T) *netLab {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		skipf(t, "network namespaces need iproute2 (ip)")
	}
	if os.Geteuid() != 0 {
		skipf(t, "network namespaces need root")
	}
	// Labs of this process start one at a time: a subnet is free until
	// its bridge has the address.
	labMu.Lock()
	defer labMu.Unlock()
	l := &netLab{t: t}
	for {
		l.id = fmt.Sprintf("%dx%d", os.Getpid(), labSeq.Add(1))
		l.bridge = "bb" + l.id
		if _, err := os.Stat("/run/netns/" + l.ns(1)); os.IsNotExist(err) && !linkExists(l.bridge) && !linkExists(l.host(1)) {
			break
		}
	}
	l.prefix = freeSubnet(t)
	t.Cleanup(l.teardown)
	l.ip("link", "add", l.bridge, "type", "bridge")
	l.ip("addr", "add", l.prefix+"1/24", "dev", l.bridge)
	l.ip("link", "set", l.bridge, "up")
	return l
}

func linkExists(name string) bool { return exec.Command("ip", "link", "show", name).Run() == nil }

// freeSubnet returns "10.X.Y." of a /24 no route of this host covers yet.
func freeSubnet(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		t.Fatalf("ip route: %v", err)
	}
	routes := string(out)
	start := (os.Getpid()*7 + int(labSeq.Load())*131) % (128 * 250)
	for k := range 128 * 250 {
		c := (start + k) % (128 * 250)
		prefix := fmt.Sprintf("10.%d.%d.", 64+c/250, c%250+1)
		if !strings.Contains(routes, prefix+"0/24") {
			return prefix
		}
	}
	t.Fatal("no free 10.x.y.0/24 for a network lab")
	return ""
}

func (l *netLab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (l *netLab) ns(i int) string   { return fmt.Sprintf("bn%sx%d", l.id, i) }
func (l *netLab) host(i int) string { return fmt.Sprintf("bv%sx%d", l.id, i) }

// addNode makes namespace i with an address on the bridge and returns
// both.
func (l *netLab) addNode() (ns, addr string) {
	l.t.Helper()
	l.n++
	i := l.n
	ns, addr = l.ns(i), l.prefix+fmt.Sprint(10+i)
	inner := fmt.Sprintf("bi%sx%d", l.id, i)
	l.ip("netns", "add", ns)
	l.ip("link", "add", l.host(i), "type", "veth", "peer", "name", inner)
	l.ip("link", "set", l.host(i), "master", l.bridge, "up")
	l.ip("link", "set", inner, "netns", ns)
	l.ip("-n", ns, "addr", "add", addr+"/24", "dev", inner)
	l.ip("-n", ns, "link", "set", inner, "up")
	l.ip("-n", ns, "link", "set", "lo", "up")
	if l.rtoMaxMS > 0 {
		// Per namespace, like the rest of net.ipv4's TCP settings.
		if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-q", "-w",
			fmt.Sprintf("net.ipv4.tcp_rto_max_ms=%d", l.rtoMaxMS)).CombinedOutput(); err != nil {
			l.t.Fatalf("set tcp_rto_max_ms in %s: %v: %s", ns, err, out)
		}
	}
	return ns, addr
}

// cut partitions node i (1-based, in addNode order) from everyone.
func (l *netLab) cut(i int) { l.ip("link", "set", l.host(i), "down") }

// heal reconnects node i.
func (l *netLab) heal(i int) { l.ip("link", "set", l.host(i), "up") }

func (l *netLab) teardown() {
	for i := 1; i <= l.n; i++ {
		exec.Command("ip", "netns", "del", l.ns(i)).Run() // its veth end goes with it
		exec.Command("ip", "link", "del", l.host(i)).Run()
	}
	exec.Command("ip", "link", "del", l.bridge).Run()
}

// StartNetCluster starts n nodes as StartCluster does, each in its own
// namespace of a fresh lab.
func StartNetCluster(t *testing.T, n int) (*Cluster, *netLab) {
	t.Helper()
	return startNetCluster(t, newNetLab(t), n)
}

// startNetCluster starts n nodes in lab.
func startNetCluster(t *testing.T, lab *netLab, n int) (*Cluster, *netLab) {
	t.Helper()
	c := &Cluster{t: t, Store: filepath.Join(t.TempDir(), "store")}
	for i := 1; i <= n; i++ {
		ns, addr := lab.addNode()
		// NBD off loopback needs TLS unless told otherwise: the lab's
		// clients are plain qemu-io.
		opts := NodeOptions{Name: fmt.Sprintf("n%d", i), Store: c.Store, Host: addr, NetNS: ns, Args: []string{"--nbd-insecure"}}
		if i > 1 {
			opts.Args = append(opts.Args, "--join", c.Nodes[0].Endpoint(), "--identity", c.Nodes[0].AdminDir())
		}
		c.Nodes = append(c.Nodes, StartNode(t, opts))
	}
	c.WaitRoles(time.Duration(n)*20*time.Second, nil)
	return c, lab
}
