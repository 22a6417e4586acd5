package server

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/errs"
)

// TestNameOfRunningNodeRefused: the first start of a data directory in a
// cluster (no join, never registered — a node on --meta-endpoints, which
// no join checks) under the name of a running node is refused with
// NodeExists before it keeps that name alive or starts volumes. Before,
// it took the running node's liveness key, write leases and record. A
// name that is free, or whose node is not running, may be taken; the
// node of that name itself (its data directory) is not refused.
func TestNameOfRunningNodeRefused(t *testing.T) {
	tmp := t.TempDir()
	a := firstNode(t, tmp, filepath.Join(tmp, "store"), 1)
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Another data directory on a's metadata, as a --meta-endpoints node.
	other := func(name string) *Node {
		return &Node{cfg: Config{Name: name, Data: filepath.Join(tmp, "other-"+name)}, meta: a.meta, log: a.log, clusterID: a.clusterID}
	}
	err := other("a").checkNameFree(ctx, nil)
	if !errs.IsCode(err, cluster.CodeNodeExists) || !strings.Contains(err.Error(), "another --name") {
		t.Fatalf("a second node named a while a runs: %v, want NodeExists saying what to do", err)
	}
	if err := other("b").checkNameFree(ctx, nil); err != nil {
		t.Errorf("a free name: %v", err)
	}
	self := &Node{cfg: a.cfg, meta: a.meta, log: a.log, clusterID: a.clusterID}
	if err := self.checkNameFree(ctx, nil); err != nil {
		t.Errorf("the node's own data directory: %v", err)
	}
	// Not running (its liveness key gone): the name may be taken over.
	a.stopBelonging()
	if err := other("a").checkNameFree(ctx, nil); err != nil {
		t.Errorf("the name of a node that is not running: %v", err)
	}
}
