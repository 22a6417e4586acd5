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
	"sync/atomic"
	"testing"
	"time"
)

var labSeq atomic.Int32

// netLab is one test's bridge and namespaces.
type netLab struct {
	t      *testing.T
	id     string // short, unique: interface names have at most 15 bytes
	prefix string // 10.X.Y.
	bridge string
	n      int
}

// newNetLab makes the bridge; its cleanup removes every namespace and link
// the lab made. Needs root and iproute2.
func newNetLab(t *testing.T) *netLab {
	t.Helper()
	requireTools(t, "ip")
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	seq := int(labSeq.Add(1))
	l := &netLab{t: t, id: fmt.Sprintf("%d%d", os.Getpid()%1000, seq),
		prefix: fmt.Sprintf("10.%d.%d.", 64+os.Getpid()%128, seq%250+1)}
	l.bridge = "bb" + l.id
	t.Cleanup(l.teardown)
	l.ip("link", "add", l.bridge, "type", "bridge")
	l.ip("addr", "add", l.prefix+"1/24", "dev", l.bridge)
	l.ip("link", "set", l.bridge, "up")
	return l
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
	lab := newNetLab(t)
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
