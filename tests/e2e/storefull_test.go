package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs of size bytes and returns its directory; the
// cleanup unmounts it. A store on it fills up for real: writes meet ENOSPC
// from the kernel, not from a fault injected into basalt.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		skipf(t, "mounting a tmpfs needs root")
	}
	mnt := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	toolOK(t, time.Minute, "mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", mnt)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

// TestStoreFull: a store whose file system fills up refuses what does not
// fit with a clear error, every way in — NBD writes fail with ENOSPC, an S3
// PUT with 507 InsufficientCapacity (not a 500 the client retries), a
// volume create with InsufficientCapacity — and loses nothing: what was
// flushed before reads back, the object a failed PUT would have replaced
// is intact, no upload is left behind, and once space is freed every path
// works again.
func TestStoreFull(t *testing.T) {
	requireTools(t, "qemu-io", "aws")
	store := filepath.Join(mountTmpfs(t, "48m"), "store")
	n := StartNode(t, NodeOptions{Store: store})
	admin := n.Admin()
	s3 := n.S3User(admin)

	// The provisioning limit (2 × 48 MiB) admits this thin volume; the
	// file system cannot hold all of it.
	v := admin.CreateVolume("--size", "72MiB", "--name", "big")
	ver := admin.CreateVolume("--size", "16MiB", "--name", "ver", "--type", "verified")
	verAtt := admin.Attach(ver.ID, "h1", "rw")
	if r := qemuIO(t, verAtt.NBDURI, "write -P 0x44 0 4M", "flush"); qemuIOFailed(r) {
		t.Fatalf("write to the verified volume: %s", r)
	}
	s3.AWSOK("s3api", "create-bucket", "--bucket", "full")
	small := filepath.Join(t.TempDir(), "small")
	if err := os.WriteFile(small, []byte(strings.Repeat("kept ", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	s3.AWSOK("s3api", "put-object", "--bucket", "full", "--key", "k", "--body", small)

	att := admin.Attach(v.ID, "h1", "rw")
	if r := qemuIO(t, att.NBDURI, "write -P 0x11 0 16M", "flush"); qemuIOFailed(r) {
		t.Fatalf("write within the free space: %s", r)
	}
	r := qemuIO(t, att.NBDURI, "write -P 0x22 16M 50M", "flush")
	if !qemuIOFailed(r) || !strings.Contains(r.Stdout+r.Stderr, "No space left on device") {
		t.Fatalf("a write beyond the free space: want ENOSPC, got %s", r)
	}
	if r := qemuIO(t, att.NBDURI, "read -P 0x11 0 16M"); qemuIOFailed(r) {
		t.Fatalf("data flushed before the store filled up: %s", r)
	}
	// A checksummed volume whose write failed for want of space still
	// opens and reads (a table the full store refuses stays in memory:
	// checksum's TestOpenOverAFullChild).
	if r := qemuIO(t, verAtt.NBDURI, "write -P 0x55 0 8M"); !qemuIOFailed(r) {
		t.Fatalf("a write into new space of a full store succeeded: %s", r)
	}
	if r := qemuIO(t, verAtt.NBDURI, "read 0 4M", "read -P 0 8M 8M"); qemuIOFailed(r) {
		t.Fatalf("the verified volume after a write the full store refused: %s", r)
	}

	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, make([]byte, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	put := s3.AWS("s3api", "put-object", "--bucket", "full", "--key", "k", "--body", big)
	if put.Code == 0 || !strings.Contains(put.Stderr, "InsufficientCapacity") {
		t.Fatalf("PUT into a full store: want InsufficientCapacity, got %s", put)
	}
	if strings.Contains(put.Stderr, "max retries") {
		t.Errorf("the aws cli retried the refused PUT (a 5xx it retries): %s", put)
	}
	got := filepath.Join(t.TempDir(), "got")
	s3.AWSOK("s3api", "get-object", "--bucket", "full", "--key", "k", got)
	if b, err := os.ReadFile(got); err != nil || string(b) != strings.Repeat("kept ", 1000) {
		t.Fatalf("the object a refused PUT would have replaced: %d bytes, %v", len(b), err)
	}
	if left, _ := filepath.Glob(filepath.Join(store, "objects", "tmp", "*")); len(left) > 0 {
		t.Errorf("a refused PUT left %v behind", left)
	}
	admin.Fail("InsufficientCapacity", "volume", "create", "--size", "1MiB")

	// Freeing space (a trim punches the volume's holes) brings it all back.
	if r := qemuIO(t, att.NBDURI, "discard 0 16M", "flush"); qemuIOFailed(r) {
		t.Fatalf("discard: %s", r)
	}
	if r := qemuIO(t, att.NBDURI, "write -P 0x33 16M 4M", "flush", "read -P 0x33 16M 4M"); qemuIOFailed(r) {
		t.Fatalf("a write after space was freed: %s", r)
	}
	s3.AWSOK("s3api", "put-object", "--bucket", "full", "--key", "k", "--body", big)
	admin.CreateVolume("--size", "1MiB")

	// What was flushed once space came back survives a crash: the
	// copy-on-write map whose update the full disk refused was written
	// by a later flush.
	n.Kill()
	n.Restart()
	if r := qemuIO(t, att.NBDURI, "read -P 0x33 16M 4M", "read -P 0 0 16M"); qemuIOFailed(r) {
		t.Fatalf("after kill -9 and restart: %s", r)
	}
}
