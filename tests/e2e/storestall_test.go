package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStoreStalls: the store's file system stops answering — frozen
// (fsfreeze), as a file server that is down holds a hard-mounted NFS or
// Lustre client: calls block in the kernel until it answers. `basalt
// status` reports the store unhealthy within its 5 s bound instead of
// hanging, twice in a row (the stalled check is shared, not stacked);
// the control API goes on for what does not touch the store; an NBD
// write made meanwhile waits rather than fails, and completes, flushed,
// once the file system answers; status is healthy again.
func TestStoreStalls(t *testing.T) {
	requireTools(t, "qemu-io", "fsfreeze")
	fs := mountExt4(t, "256M")
	n := StartNode(t, NodeOptions{Store: filepath.Join(fs.mnt, "store")})
	admin := n.Admin()
	id := admin.CreateVolume("--size", "16MiB", "--name", "v").ID
	uri := admin.Attach(id, "h1", "rw").NBDURI
	if r := qemuIO(t, uri, "write -P 0x11 0 4M", "flush"); qemuIOFailed(r) {
		t.Fatal(r)
	}

	toolOK(t, time.Minute, "fsfreeze", "-f", fs.mnt)
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			exec.Command("fsfreeze", "-u", fs.mnt).Run()
		}
	})
	live := startQemuIO(t, uri, "write -P 0x22 4M 1M")
	for i := range 2 {
		start := time.Now()
		r := admin.Run("status")
		took := time.Since(start)
		if r.Code == 0 || !strings.Contains(r.Stdout, "does not answer") {
			t.Errorf("status %d with the store's file system frozen: want the store unhealthy, not answering: %s", i, r)
		}
		if took > 15*time.Second {
			t.Errorf("status %d took %v with the store's file system frozen", i, took.Round(time.Millisecond))
		}
	}
	admin.OK(nil, "volume", "list")

	toolOK(t, time.Minute, "fsfreeze", "-u", fs.mnt)
	thawed = true
	out := live.finish(t, "flush", "read -P 0x22 4M 1M", "read -P 0x11 0 4M")
	if strings.Contains(out, "failed") || strings.Contains(out, "Pattern verification") || strings.Count(out, "read ") != 2 {
		t.Errorf("a write made while the store was frozen, then flushed and read back after: %s", out)
	}
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		r := admin.Run("status")
		if r.Code == 0 {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("status after the file system answers again: %s", r)
		}
	}
	if r := qemuIO(t, uri, "read -P 0x22 4M 1M", "read -P 0x11 0 4M"); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification") {
		t.Errorf("a new connection after the stall: %s\n%s", r, r.Stdout)
	}
}
