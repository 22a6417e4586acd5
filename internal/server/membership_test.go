package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/store"
	"github.com/basalt-storage/basalt/internal/user"
	"github.com/basalt-storage/basalt/internal/volume"
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

// nodeConfig is a node named name on free loopback ports, its data in
// dir and its store shared at store.
func nodeConfig(t *testing.T, name, dir, store string) Config {
	return Config{
		Name: name, Data: dir, Store: store,
		API: freeAddr(t), S3: freeAddr(t), NBD: freeAddr(t),
		EtcdClient: freeAddr(t), EtcdPeer: freeAddr(t),
		Overcommit: 1, Voters: 1, S3TrustFile: filepath.Join(dir, "trust-{uid}"),
	}
}

func testLog(t *testing.T) *slog.Logger {
	if os.Getenv("BASALT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startNodeOnce starts a node, once.
func startNodeOnce(t *testing.T, cfg Config) (*Node, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return Start(ctx, cfg, testLog(t))
}

// startNode starts a node. A first start (no data directory yet) that
// finds one of its ports taken — picked free, then grabbed by another
// test process before the node bound it — is tried again on fresh ports
// with a fresh data directory; the node's cfg has the ports it got.
func startNode(t *testing.T, cfg Config) (*Node, error) {
	t.Helper()
	_, err := os.Stat(cfg.Data)
	fresh := errors.Is(err, os.ErrNotExist)
	for attempt := 1; ; attempt++ {
		n, err := startNodeOnce(t, cfg)
		if err == nil || !fresh || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return n, err
		}
		t.Logf("start %s: %v; again on fresh ports", cfg.Name, err)
		os.RemoveAll(cfg.Data)
		for _, a := range []*string{&cfg.API, &cfg.NBD, &cfg.EtcdClient, &cfg.EtcdPeer, &cfg.S3} {
			if !strings.HasSuffix(*a, ":0") {
				*a = freeAddr(t)
			}
		}
	}
}

// firstNode starts the first node of a cluster of voters voters, its
// data under tmp, over the shared store.
func firstNode(t *testing.T, tmp, store string, voters int) *Node {
	t.Helper()
	cfg := nodeConfig(t, "a", filepath.Join(tmp, "a"), store)
	cfg.Voters = voters
	a, err := startNode(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// joinNode starts node name, joining through a with a's admin identity.
func joinNode(t *testing.T, a *Node, name, tmp, store string) *Node {
	t.Helper()
	cfg := nodeConfig(t, name, filepath.Join(tmp, name), store)
	cfg.Join, cfg.JoinIdentity = "https://"+a.APIAddr(), a.AdminDir
	n, err := startNode(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRemovedClientStaysOut: a client node taken out with `node
// remove` stops; started again on its data directory (a supervisor, an
// operator) it must not register itself again and serve as a member of
// the cluster it was removed from.
func TestRemovedClientStaysOut(t *testing.T) {
	tmp := t.TempDir()
	store := filepath.Join(tmp, "store")
	a := firstNode(t, tmp, store, 1)
	defer a.Close()
	b := joinNode(t, a, "b", tmp, store)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	removeRunning(t, a, b)

	bcfg := nodeConfig(t, "b", filepath.Join(tmp, "b"), store)
	bcfg.Join, bcfg.JoinIdentity = "https://"+a.APIAddr(), a.AdminDir
	b, err := startNode(t, bcfg)
	if err == nil {
		defer b.Close()
		n, _ := a.meta.Node(ctx, "b")
		t.Fatalf("the removed node b started again and registered itself: %+v", n)
	}
	t.Logf("restart refused: %v", err)
	if _, err := a.meta.Node(ctx, "b"); err == nil {
		t.Fatal("the removed node b is registered again")
	}
}

// removeRunning removes node n through a and waits for n, running, to
// stop by itself; n is closed.
func removeRunning(t *testing.T, a, n *Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := a.cluster.Remove(ctx, n.Name()); err != nil {
		n.Close()
		t.Fatal(err)
	}
	select {
	case <-n.Done():
	case <-time.After(15 * time.Second):
		t.Errorf("%s still runs 15s after its removal", n.Name())
	}
	n.Close()
}

// TestUnjoinedNodeRemovedStaysOut: a node that never joined — the
// cluster's first, or one started on --meta-endpoints — and whose
// registration was taken away (`node remove` through another node)
// refuses to start again on its data directory, as a joined node does,
// instead of registering itself anew.
func TestUnjoinedNodeRemovedStaysOut(t *testing.T) {
	tmp := t.TempDir()
	a := firstNode(t, tmp, filepath.Join(tmp, "store"), 1)
	cfg := a.cfg
	a.Close()
	a, err := startNode(t, cfg) // registered before: its record is there
	if err != nil {
		t.Fatalf("restart of a registered node: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := a.meta.DeleteNode(ctx, "a"); err != nil {
		a.Close()
		t.Fatal(err)
	}
	a.Close()
	refusedAsRemoved(t, cfg, "a node whose registration was removed")
}

// refusedAsRemoved starts a node on cfg and requires it refused with
// NodeRemoved.
func refusedAsRemoved(t *testing.T, cfg Config, what string) {
	t.Helper()
	n, err := startNode(t, cfg)
	if err == nil {
		n.Close()
		t.Fatalf("%s started", what)
	}
	if !strings.Contains(err.Error(), "NodeRemoved") {
		t.Errorf("%s: refused with %v, want NodeRemoved", what, err)
	}
}

// TestNodeBeingRemovedStaysOut: a joined node that starts while its
// removal runs — its record marked removing, its identity revoked, the
// record not deleted yet — refuses to start, and is given no admin
// certificate: otherwise the removal would leave it a listed one.
func TestNodeBeingRemovedStaysOut(t *testing.T) {
	tmp := t.TempDir()
	store := filepath.Join(tmp, "store")
	a := firstNode(t, tmp, store, 1)
	defer a.Close()
	b := joinNode(t, a, "b", tmp, store)
	bcfg := b.cfg
	b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rec, err := a.meta.Node(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	rec.Removing = true
	if err := a.meta.PutNode(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := a.users.RevokeNode(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	refusedAsRemoved(t, bcfg, "a node being removed")
	adm, err := a.meta.User(ctx, user.Admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range adm.Certs {
		if c.IssuedFor == meta.CertForNode("b") {
			t.Fatalf("the node being removed was given an admin certificate: %+v", c)
		}
	}
}

// TestMembershipWithoutQuorum: with the quorum lost (one of two
// voters down), membership changes — `node remove`, a join — fail with
// 503 MetadataUnavailable within seconds, like any other write, instead
// of waiting as long as their caller does (the CLI gives up after 60 s
// with an unreachable-node error).
func TestMembershipWithoutQuorum(t *testing.T) {
	tmp := t.TempDir()
	store := filepath.Join(tmp, "store")
	a := firstNode(t, tmp, store, 3)
	defer a.Close()
	b := joinNode(t, a, "b", tmp, store)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if ns, _ := a.cluster.Nodes(ctx); len(ns) == 2 && ns[0].Role == "voter" && ns[1].Role == "voter" {
			break
		}
		if ctx.Err() != nil {
			b.Close()
			t.Fatal("b was not promoted to voter within 30s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.Close() // a alone: 1 of 2 voters, no quorum
	for what, f := range map[string]func(context.Context) error{
		"node remove": func(ctx context.Context) error { return a.cluster.Remove(ctx, "nosuchnode") },
		"join": func(ctx context.Context) error {
			_, err := a.cluster.Join(ctx, cluster.JoinRequest{Name: "c", Peer: "https://c.example:2380",
				Client: "https://c.example:2379", API: "https://c.example:8443"})
			return err
		},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := time.Now()
		err := f(ctx)
		cancel()
		took := time.Since(start)
		if !errs.IsCode(err, errs.CodeMetadataUnavailable) || took > 12*time.Second {
			t.Errorf("%s without quorum: %v after %v, want %s within 12s", what, err, took.Round(time.Millisecond), errs.CodeMetadataUnavailable)
		}
	}
}

// TestRemoveVoterKeepsQuorum: with one of three voters down,
// removing a live voter would leave one live voter of two — no quorum —
// and etcd refuses. The refusal must say so (409 WouldLoseQuorum), not
// claim that no quorum answers (503 MetadataUnavailable): the cluster
// has its quorum and keeps accepting writes.
func TestRemoveVoterKeepsQuorum(t *testing.T) {
	tmp := t.TempDir()
	store := filepath.Join(tmp, "store")
	a := firstNode(t, tmp, store, 3)
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	others := map[string]*Node{}
	for _, name := range []string{"b", "c"} {
		n := joinNode(t, a, name, tmp, store)
		defer n.Close()
		others[name] = n
		waitVoter(ctx, t, a, name)
	}
	others["c"].Close()
	time.Sleep(6 * time.Second) // etcd's view of c: down
	err := a.cluster.Remove(ctx, "b")
	if err == nil {
		t.Fatal("b removed with c down: a is left alone with a quorum of 2")
	}
	if _, _, terr := a.cluster.NewJoinToken(ctx, time.Hour); terr != nil {
		t.Fatalf("a write with 2 of 3 voters up: %v", terr)
	}
	if !errs.IsCode(err, cluster.CodeWouldLoseQuorum) {
		t.Fatalf("removing b with c down: %v; want %s", err, cluster.CodeWouldLoseQuorum)
	}
}

// TestStoreNotMountedRefused: a node whose --store is not the cluster's
// store — the shared file system not mounted (the directory missing, or an
// empty mount point), or another cluster's store — refuses to start, before
// joining and before creating anything there; with the right store it
// joins.
func TestStoreNotMountedRefused(t *testing.T) {
	tmp := t.TempDir()
	shared := filepath.Join(tmp, "store")
	a := firstNode(t, tmp, shared, 1)
	defer a.Close()
	if m, ok, err := store.ReadMarker(shared); err != nil || !ok || m.ID != a.store.ID || m.Cluster != a.clusterID {
		t.Fatalf("the first node's store: marker %+v %v %v, node's id %q of cluster %s", m, ok, err, a.store.ID, a.clusterID)
	}
	other := filepath.Join(tmp, "other")
	if _, err := store.Claim(other, store.Marker{ID: "another-clusters-store", Cluster: "another-cluster"}); err != nil {
		t.Fatal(err)
	}
	// Marked for this cluster, but not the store it runs on (a copy of
	// the marker, another file system).
	copied := filepath.Join(tmp, "copied")
	if _, err := store.Claim(copied, store.Marker{ID: "not-the-store", Cluster: a.clusterID}); err != nil {
		t.Fatal(err)
	}
	mountPoint := filepath.Join(tmp, "mnt")
	if err := os.Mkdir(mountPoint, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct{ name, store, want string }{
		{"missing directory", filepath.Join(tmp, "lustre", "basalt"), "mounted"},
		{"empty mount point", mountPoint, "mounted"},
		// Its marker is checked by the cluster before it counts the node in.
		{"another cluster's store", other, "StoreMismatch"},
		{"another store of this cluster", copied, "StoreMismatch"},
	} {
		before, _ := os.ReadDir(c.store)
		cfg := nodeConfig(t, fmt.Sprintf("b%d", i), filepath.Join(tmp, fmt.Sprintf("b%d", i)), c.store)
		cfg.Join, cfg.JoinIdentity = "https://"+a.APIAddr(), a.AdminDir
		n, err := startNode(t, cfg)
		if err == nil {
			n.Close()
			t.Fatalf("%s: the node started", c.name)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want it to say %q", c.name, err, c.want)
		}
		if after, _ := os.ReadDir(c.store); len(after) != len(before) {
			t.Errorf("%s: the refused start changed %s: %d entries, then %d", c.name, c.store, len(before), len(after))
		}
		// Not half joined: no member, no record to remove by hand.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		members, err := a.meta.Members(ctx)
		nodes, nerr := a.meta.Nodes(ctx)
		cancel()
		if err != nil || nerr != nil || len(members) != 1 || len(nodes) != 1 {
			t.Errorf("%s: after the refusal the cluster has %d members (%v), %d nodes (%v); want only a", c.name, len(members), err, len(nodes), nerr)
		}
	}
	b := joinNode(t, a, "b", tmp, shared)
	b.Close()
}

// TestStoreOfAnotherCluster: a new cluster started on a store another
// cluster made is refused (its marker names that cluster); a cluster whose
// first start wrote the marker but stopped before recording the store's
// id accepts its own store at the next start and records it.
func TestStoreOfAnotherCluster(t *testing.T) {
	tmp := t.TempDir()
	shared := filepath.Join(tmp, "store")
	cfg := nodeConfig(t, "a", filepath.Join(tmp, "a"), shared)
	cfg.Voters = 1
	a, err := startNode(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg = a.cfg // the ports it got
	id := a.store.ID

	other := nodeConfig(t, "z", filepath.Join(tmp, "z"), shared)
	other.Voters = 1
	if z, err := startNode(t, other); err == nil {
		z.Close()
		a.Close()
		t.Fatal("a new cluster started on another cluster's store")
	} else if !strings.Contains(err.Error(), "another cluster's store") {
		t.Errorf("refusal: %v, want it to name another cluster's store", err)
	}

	// The first start's window: marker written, id not recorded.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.meta.Client().Delete(ctx, "/basalt/store-id"); err != nil {
		a.Close()
		t.Fatal(err)
	}
	a.Close()
	a, err = startNode(t, cfg)
	if err != nil {
		t.Fatalf("restart on its own store with the id not recorded: %v", err)
	}
	defer a.Close()
	if got, err := a.meta.StoreID(ctx, ""); err != nil || got != id || a.store.ID != id {
		t.Fatalf("recorded %q (%v), node's %q, want %q", got, err, a.store.ID, id)
	}
}

// TestStoreUpgradeWithoutMarker: a cluster whose store predates markers
// (none written, no id recorded) claims its store at the first start of
// this build — but not an empty directory in its place (its file system
// not mounted) while the cluster has volumes: that start is refused, and
// the start on the real store, laid out by an earlier build, records it.
func TestStoreUpgradeWithoutMarker(t *testing.T) {
	tmp := t.TempDir()
	shared := filepath.Join(tmp, "store")
	cfg := nodeConfig(t, "a", filepath.Join(tmp, "a"), shared)
	cfg.Voters = 1
	a, err := startNode(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg = a.cfg // the ports it got
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := a.volumes.CreateVolume(ctx, volume.Caller{Name: "admin", ID: "u-test", Admin: true}, volume.CreateVolume{Name: "kept", SizeBytes: 1 << 20}); err != nil {
		a.Close()
		t.Fatal(err)
	}
	// As an earlier build left it: no marker, no id recorded.
	if _, err := a.meta.Client().Delete(ctx, "/basalt/store-id"); err != nil {
		a.Close()
		t.Fatal(err)
	}
	a.Close()
	if err := os.Remove(filepath.Join(shared, store.MarkerFile)); err != nil {
		t.Fatal(err)
	}

	unmounted := cfg
	unmounted.Store = filepath.Join(tmp, "mnt")
	if n, err := startNode(t, unmounted); err == nil {
		n.Close()
		t.Fatal("a node of a cluster with volumes claimed an empty directory as its store")
	} else if !strings.Contains(err.Error(), "mounted") {
		t.Errorf("refusal: %v, want it to ask whether the file system is mounted", err)
	}
	if _, err := os.Stat(unmounted.Store); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused start created %s (%v)", unmounted.Store, err)
	}

	a, err = startNode(t, cfg)
	if err != nil {
		t.Fatalf("start on the store an earlier build laid out: %v", err)
	}
	defer a.Close()
	if m, ok, err := store.ReadMarker(shared); err != nil || !ok || m.ID != a.store.ID {
		t.Fatalf("marker %+v %v %v, node's store %q", m, ok, err, a.store.ID)
	}
}

// waitVoter waits until a lists node name as a voter.
func waitVoter(ctx context.Context, t *testing.T, a *Node, name string) {
	t.Helper()
	for voter := false; !voter; {
		if ctx.Err() != nil {
			t.Fatalf("%s not promoted", name)
		}
		time.Sleep(200 * time.Millisecond)
		ns, _ := a.cluster.Nodes(ctx)
		for _, x := range ns {
			voter = voter || x.Name == name && x.Role == "voter"
		}
	}
}

// threeVoters starts node a of a cluster whose target is voters, joins b
// and c and waits until both are voters. The nodes close when the test
// ends (c, b, then a); ctx, done then too, bounds the test's waits.
func threeVoters(t *testing.T, voters int, timeout time.Duration) (ctx context.Context, a, c *Node) {
	t.Helper()
	tmp := t.TempDir()
	store := filepath.Join(tmp, "store")
	a = firstNode(t, tmp, store, voters)
	t.Cleanup(a.Close)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	for _, name := range []string{"b", "c"} {
		c = joinNode(t, a, name, tmp, store)
		t.Cleanup(c.Close)
		waitVoter(ctx, t, a, name)
	}
	return ctx, a, c
}
