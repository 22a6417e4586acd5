package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A node that finds itself removed deletes its copy of the cluster CA's
// private key — a decommissioned disk must not keep what signs
// identities the cluster trusts — and marks its data directory, so a
// start on it is refused as removed (NodeRemoved), not for the missing key.
func TestRemovedNodeDeletesTheCAKey(t *testing.T) {
	tmp := t.TempDir()
	store := filepath.Join(tmp, "store")
	a := firstNode(t, tmp, store, 1)
	defer a.Close()
	b := joinNode(t, a, "b", tmp, store)
	keyPath := filepath.Join(tmp, "b", "pki", "ca-key.pem")
	if _, err := os.Stat(keyPath); err != nil {
		b.Close()
		t.Fatalf("a joined node has no CA key: %v", err)
	}
	removeRunning(t, a, b)
	if _, err := os.Stat(keyPath); !os.IsNotExist(err) {
		t.Fatalf("the removed node's CA key: %v, want it deleted", err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "a", "pki", "ca-key.pem")); err != nil {
		t.Fatalf("the remaining node's CA key: %v", err)
	}
	bcfg := nodeConfig(t, "b", filepath.Join(tmp, "b"), store)
	bcfg.Join, bcfg.JoinIdentity = "https://"+a.APIAddr(), a.AdminDir
	refusedAsRemoved(t, bcfg, "the removed node b, started again on its data directory")
}

// A node removed while it was down learns it at its next start, which is
// refused: its CA key goes then.
func TestNodeRemovedWhileDownDeletesTheCAKey(t *testing.T) {
	tmp := t.TempDir()
	store := filepath.Join(tmp, "store")
	a := firstNode(t, tmp, store, 1)
	defer a.Close()
	c := joinNode(t, a, "c", tmp, store) // a client: the cluster has its one voter
	ccfg := c.cfg
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := a.cluster.Remove(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	refusedAsRemoved(t, ccfg, "the node c, removed while down")
	if _, err := os.Stat(filepath.Join(tmp, "c", "pki", "ca-key.pem")); !os.IsNotExist(err) {
		t.Fatalf("the CA key of a node removed while down, after its refused start: %v, want it deleted", err)
	}
	refusedAsRemoved(t, ccfg, "the node c, started a second time")
}
