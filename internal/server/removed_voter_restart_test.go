package server

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/errs"
)

// TestRemovedVoterRestartRefused: a voter removed while it was down
// (`node remove` of a dead node), started again on its data directory,
// finds its etcd member refused by the others. It must say that it was
// removed (NodeRemoved) — and mark its directory and drop its copy of the
// CA key, as a node that learns of its removal does — promptly, rather
// than wait for a member that will never be ready and fail saying etcd
// is not ready.
func TestRemovedVoterRestartRefused(t *testing.T) {
	ctx, a, c := threeVoters(t, 3, 120*time.Second)
	ccfg := c.cfg
	c.Close()
	for {
		err := a.cluster.Remove(ctx, "c")
		if err == nil {
			break
		}
		if !errs.IsCode(err, cluster.CodeWouldLoseQuorum) || ctx.Err() != nil {
			t.Fatalf("remove c, down: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	start := time.Now()
	n, err := startNodeOnce(t, ccfg)
	if err == nil {
		n.Close()
		t.Fatal("the removed voter c started again on its data directory")
	}
	took := time.Since(start)
	t.Logf("restart of the removed voter after %v: %v", took, err)
	if !errs.IsCode(err, cluster.CodeNodeRemoved) {
		t.Errorf("restart of the removed voter: %v; want %s", err, cluster.CodeNodeRemoved)
	}
	if took > 30*time.Second {
		t.Errorf("restart of the removed voter took %v to fail", took)
	}
	if _, err := os.Stat(filepath.Join(ccfg.Data, "removed")); err != nil {
		t.Errorf("removed marker: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ccfg.Data, "pki", "ca-key.pem")); !os.IsNotExist(err) {
		t.Errorf("the removed voter kept its copy of the CA key: %v", err)
	}
}
