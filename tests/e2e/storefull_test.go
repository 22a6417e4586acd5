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

// TestStoreFullRedundant: mirrored and parity volumes on a store that fills
// up. Their legs live on that one full file system, which is not a leg's
// fault: a write that needs space fails with ENOSPC, no leg is failed (a
// full store must not leave every redundant volume degraded until someone
// repairs it), flushed data reads back, and the volumes stay available —
// detached and attached again while the store is full they open and read.
// Once space is freed writes and flushes work again and survive kill -9.
func TestStoreFullRedundant(t *testing.T) {
	requireTools(t, "qemu-io")
	store := filepath.Join(mountTmpfs(t, "48m"), "store")
	n := StartNode(t, NodeOptions{Store: store})
	admin := n.Admin()
	vols := []struct {
		typ, layer  string
		kept, moreW string // what is written and flushed first; a write the full store refuses
		after, read string // once space is back: written and flushed; read back
	}{
		{"mirrored", "mirror", "write -P 0x11 0 2M", "write -P 0x12 2M 4M", "write -P 0x13 2M 2M", "read -P 0x13 2M 2M"},
		{"parity", "parity", "write -P 0x21 0 3M", "write -P 0x22 3M 6M", "write -P 0x23 3M 3M", "read -P 0x23 3M 3M"},
	}
	keptRead := []string{"read -P 0x11 0 2M", "read -P 0x21 0 3M"}
	ids := make([]string, len(vols))
	atts := make([]Attachment, len(vols))
	for i, v := range vols {
		ids[i] = admin.CreateVolume("--size", "12MiB", "--name", v.typ, "--type", v.typ).ID
		atts[i] = admin.Attach(ids[i], "h1", "rw")
		if r := qemuIO(t, atts[i].NBDURI, v.kept, "flush"); qemuIOFailed(r) {
			t.Fatalf("%s: write within the free space: %s", v.typ, r)
		}
	}
	legsOK := func(what string) {
		t.Helper()
		for i, v := range vols {
			_, node := redShow(t, admin, ids[i], v.layer)
			for k, st := range redLegStates(node) {
				if st != "ok" {
					t.Fatalf("%s: %s volume's leg %d is %s, want ok (stack %+v)", what, v.typ, k, st, node)
				}
			}
		}
	}

	// Fill the store with another volume's data.
	big := admin.CreateVolume("--size", "68MiB", "--name", "big")
	bigAtt := admin.Attach(big.ID, "h1", "rw")
	if r := qemuIO(t, bigAtt.NBDURI, "write -P 0x77 0 60M", "flush"); !qemuIOFailed(r) {
		t.Fatalf("60 MiB into a 48 MiB store: want ENOSPC, got %s", r)
	}
	for i, v := range vols {
		r := qemuIO(t, atts[i].NBDURI, v.moreW, "flush")
		if !qemuIOFailed(r) || !strings.Contains(r.Stdout+r.Stderr, "No space left on device") {
			t.Fatalf("%s: a write into a full store: want ENOSPC, got %s", v.typ, r)
		}
		if r := qemuIO(t, atts[i].NBDURI, keptRead[i]); qemuIOFailed(r) {
			t.Fatalf("%s: data flushed before the store filled up: %s", v.typ, r)
		}
	}
	legsOK("store full")
	for i, v := range vols {
		admin.Detach(atts[i].ID)
		atts[i] = admin.Attach(ids[i], "h1", "rw")
		if r := qemuIO(t, atts[i].NBDURI, keptRead[i]); qemuIOFailed(r) {
			t.Fatalf("%s: attached again while the store is full: %s", v.typ, r)
		}
	}
	legsOK("attached again on a full store")

	if r := qemuIO(t, bigAtt.NBDURI, "discard 0 68M", "flush"); qemuIOFailed(r) {
		t.Fatalf("discard: %s", r)
	}
	for i, v := range vols {
		if r := qemuIO(t, atts[i].NBDURI, v.after, "flush", v.read, keptRead[i]); qemuIOFailed(r) {
			t.Fatalf("%s: once space was freed: %s", v.typ, r)
		}
	}
	legsOK("space freed")
	n.Kill()
	n.Restart()
	for i, v := range vols {
		if r := qemuIO(t, atts[i].NBDURI, v.read, keptRead[i]); qemuIOFailed(r) {
			t.Fatalf("%s: after kill -9 and restart: %s", v.typ, r)
		}
	}
	legsOK("restarted")
}
