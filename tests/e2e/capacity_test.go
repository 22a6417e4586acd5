package e2e

import (
	"testing"
)

func roundDown512(n int64) int64 { return n / 512 * 512 }
func roundUp512(n int64) int64   { return (n + 511) / 512 * 512 }

// TestProvisioningLimitTiny: with --overcommit 0.000001 the limit is a few
// hundred KiB; creates, extends and snapshots beyond it fail with
// InsufficientCapacity and provision nothing.
func TestProvisioningLimitTiny(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{Args: []string{"--overcommit", "0.000001"}})
	admin := n.Admin()
	st := admin.Status()
	limit := st.Store.LimitBytes
	if want := int64(float64(st.Store.TotalBytes) * 0.000001); limit != want {
		t.Errorf("limit_bytes %d, want total_bytes × 0.000001 = %d", limit, want)
	}
	if st.Store.Overcommit != 0.000001 {
		t.Errorf("status overcommit %v, want 0.000001", st.Store.Overcommit)
	}
	if limit < 2048 {
		skipf(t, "store too small for this test: limit %d bytes", limit)
	}

	admin.Fail("InsufficientCapacity", "volume", "create", "--size", "1GiB")
	admin.Fail("InsufficientCapacity", "volume", "create", "--size", sz(roundUp512(limit)+512))

	half := roundDown512(limit / 2)
	v := admin.CreateVolume("--size", sz(half), "--name", "half")
	if v.Status != "available" {
		t.Fatalf("volume of half the limit: %+v", v)
	}
	admin.Fail("InsufficientCapacity", "volume", "extend", "half", "--size", sz(roundUp512(limit)+512))
	admin.Fail("InsufficientCapacity", "volume", "extend", "half", "--size", "1GiB")
	if got := admin.Volume("half"); got.SizeBytes != half || got.Status != "available" {
		t.Errorf("volume after refused extends: %+v", got)
	}
	if got := fileSize(t, n.DataFile(admin, v.ID)); got != half {
		t.Errorf("volume's data file is %d bytes after refused extends, want %d", got, half)
	}
	rest := roundDown512(limit - half)
	admin.Fail("InsufficientCapacity", "volume", "create", "--size", sz(rest+512))
	if st := admin.Status(); st.Store.ProvisionedBytes != half {
		t.Errorf("provisioned_bytes %d after refused requests, want %d", st.Store.ProvisionedBytes, half)
	}
	// Snapshots count against the limit too: one of `half` fits exactly
	// when 2 × half <= limit, a second one does not.
	if s := admin.CreateSnapshot("half"); s.Status != "available" {
		t.Errorf("snapshot within the limit: %+v", s)
	}
	admin.Fail("InsufficientCapacity", "snapshot", "create", "half")
	// Within the limit everything works: delete frees capacity again.
	admin.OK(nil, "volume", "delete", "half")
	w := admin.CreateVolume("--size", sz(half))
	if w.Status != "available" {
		t.Errorf("create after delete freed capacity: %+v", w)
	}
}

// TestProvisioningLimitDefault: with the default overcommit (2) the limit is
// twice the store's size; a volume one sector beyond it fails, one of
// exactly what is left succeeds (and is sparse).
func TestProvisioningLimitDefault(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	st := admin.Status()
	if st.Store.Overcommit != 2 {
		t.Errorf("default overcommit %v, want 2", st.Store.Overcommit)
	}
	if want := st.Store.TotalBytes * 2; st.Store.LimitBytes != want {
		t.Errorf("limit_bytes %d, want 2 × total_bytes = %d", st.Store.LimitBytes, want)
	}
	small := admin.CreateVolume("--size", "1GiB")
	st = admin.Status()
	if st.Store.ProvisionedBytes != GiB {
		t.Fatalf("provisioned_bytes %d after a 1 GiB create", st.Store.ProvisionedBytes)
	}
	limit := st.Store.LimitBytes

	admin.Fail("InsufficientCapacity", "volume", "create", "--size", sz(roundUp512(limit)+512))
	left := roundDown512(limit - st.Store.ProvisionedBytes)
	admin.Fail("InsufficientCapacity", "volume", "create", "--size", sz(left+512))
	big := admin.CreateVolume("--size", sz(left), "--name", "all-the-rest")
	if big.Status != "available" || big.SizeBytes != left {
		t.Fatalf("volume of exactly the capacity left: %+v", big)
	}
	if got := fileSize(t, n.DataFile(admin, big.ID)); got != left {
		t.Errorf("data file of the big volume is %d bytes, want %d", got, left)
	}
	if a := allocatedTree(t, n.ImageDir(n.TopImage(admin, big.ID))) + allocatedTree(t, n.VolumeDir(big.ID)); a > MiB {
		t.Errorf("the big volume allocates %d bytes", a)
	}
	// Now full: even one sector more fails, for creates, extends and snapshots.
	admin.Fail("InsufficientCapacity", "volume", "create", "--size", "512")
	admin.Fail("InsufficientCapacity", "volume", "extend", small.ID, "--size", sz(GiB+512))
	admin.Fail("InsufficientCapacity", "snapshot", "create", small.ID)
	if st := admin.Status(); st.Store.ProvisionedBytes != GiB+left {
		t.Errorf("provisioned_bytes %d, want %d", st.Store.ProvisionedBytes, GiB+left)
	}
	admin.OK(nil, "volume", "delete", big.ID)
	if st := admin.Status(); st.Store.ProvisionedBytes != GiB {
		t.Errorf("provisioned_bytes %d after deleting the big volume, want %d", st.Store.ProvisionedBytes, GiB)
	}
	if s := admin.CreateSnapshot(small.ID); s.Status != "available" {
		t.Errorf("snapshot after the big volume was deleted: %+v", s)
	}
}
