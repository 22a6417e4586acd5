package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStoreNotMounted: a node restarted while the shared file system
// that holds its store is not mounted — here an empty file system mounted
// over it, as an empty mount point shows — refuses to start, saying why,
// and creates nothing there (a store laid out afresh on the mount point
// would answer every volume and object as missing and take new ones where
// no other node sees them). Once the file system is back it starts and
// every flushed byte is there.
func TestStoreNotMounted(t *testing.T) {
	requireTools(t, "qemu-io")
	pfs := filepath.Join(t.TempDir(), "pfs") // the shared file system's mount point
	n := StartNode(t, NodeOptions{Store: filepath.Join(pfs, "basalt")})
	admin := n.Admin()
	v := admin.CreateVolume("--size", "8MiB", "--name", "kept")
	a := admin.Attach(v.ID, "h1", "rw")
	if r := qemuIO(t, a.NBDURI, "write -P 0x5a 0 2M", "flush"); qemuIOFailed(r) {
		t.Fatal(r)
	}
	n.StopOK()

	if os.Geteuid() != 0 {
		skipf(t, "mounting a tmpfs needs root")
	}
	toolOK(t, time.Minute, "mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", pfs)
	t.Cleanup(func() { exec.Command("umount", pfs).Run() })
	mark := len(n.Log())
	if err := n.launch(); err == nil {
		t.Fatal("the node started on a store whose file system is not mounted")
	}
	if log := n.Log()[mark:]; !strings.Contains(log, "is the file system that holds the store mounted here?") {
		t.Errorf("the refusal does not say why:\n%s", log)
	}
	if left, _ := os.ReadDir(pfs); len(left) != 0 {
		t.Errorf("the refused start created %d entries on the empty mount point", len(left))
	}
	toolOK(t, time.Minute, "umount", pfs)

	n.Restart()
	if r := qemuIO(t, a.NBDURI, "read -P 0x5a 0 2M", "read -P 0 2M 6M"); qemuIOFailed(r) {
		t.Fatalf("after the file system came back: %s", r)
	}
}
