package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// waitSnapshotProgress polls a creating snapshot until its persisted progress shows
// bytes done, and returns the last seen record.
func waitSnapshotProgress(t *testing.T, c *Client, id string, timeout time.Duration) Snapshot {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := c.Snapshot(id)
		if s.Status != "creating" {
			t.Fatalf("snapshot %s is %s before the crash could happen; the copy should take seconds", id, s.Status)
		}
		if s.Progress != nil && s.Progress.DoneBytes > 0 || time.Now().After(deadline) {
			return s
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// noTransitional fails if any volume or snapshot is still in a transitional
// status.
func noTransitional(t *testing.T, c *Client) {
	t.Helper()
	for _, v := range c.Volumes() {
		if v.Status == "creating" || v.Status == "extending" || v.Status == "deleting" {
			t.Errorf("volume %s left %s", v.ID, v.Status)
		}
	}
	for _, s := range c.Snapshots() {
		if s.Status == "creating" || s.Status == "deleting" {
			t.Errorf("snapshot %s left %s", s.ID, s.Status)
		}
	}
}

// noPartials fails if STORE/tmp still holds partial files.
func noPartials(t *testing.T, n *Node) {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(n.StoreDir(), "tmp"))
	for _, e := range ents {
		t.Errorf("STORE/tmp still holds %s after the job finished", e.Name())
	}
}

// TestCrashDuringSnapshot: kill -9 in the middle of a snapshot copy; after a
// restart the snapshot completes with exactly the volume's data.
func TestCrashDuringSnapshot(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{Args: []string{"--job-bandwidth", "4MiB"}})
	admin := n.Admin()
	vol := admin.CreateVolume("--size", "64MiB", "--name", "crash")
	data := []region{{0, randomBytes(t, int(32*MiB))}}
	writeRegions(t, n.VolumeFile(vol.ID), data)

	snap := admin.CreateSnapshot("crash")
	if snap.Status != "creating" {
		t.Fatalf("snapshot without --wait is %q, want creating", snap.Status)
	}
	if snap.Progress == nil {
		t.Errorf("a creating snapshot shows no progress: %+v", snap)
	}
	s := waitSnapshotProgress(t, admin, snap.ID, 5*time.Second)
	if s.Progress == nil || s.Progress.DoneBytes == 0 || s.Progress.TotalBytes != 64*MiB {
		t.Errorf("snapshot progress while copying: %+v, want done_bytes > 0 and total_bytes %d", s.Progress, 64*MiB)
	}
	time.Sleep(time.Second) // ~2 s into an ~8 s copy
	n.Kill()
	if exists(n.SnapshotFile(snap.ID)) {
		t.Fatalf("the snapshot file exists before the copy finished (files must be complete before they appear)")
	}

	n.Restart()
	got := admin.WaitSnapshot(snap.ID, 60*time.Second)
	if got.Status != "available" {
		t.Fatalf("snapshot after crash and restart: %s (%s), want available", got.Status, got.StatusMessage)
	}
	if got.SizeBytes != 64*MiB {
		t.Errorf("snapshot size %d", got.SizeBytes)
	}
	sf := n.SnapshotFile(snap.ID)
	if fs := fileSize(t, sf); fs != 64*MiB {
		t.Errorf("snapshot file is %d bytes, want %d", fs, 64*MiB)
	}
	checkRegions(t, "snapshot file after crash", sf, data)
	if regionSum(t, sf, 0, int(64*MiB)) != regionSum(t, n.VolumeFile(vol.ID), 0, int(64*MiB)) {
		t.Errorf("snapshot file differs from the volume")
	}
	noTransitional(t, admin)
	noPartials(t, n)
	// The volume is free again: it can be extended and deleted.
	admin.OK(nil, "volume", "extend", vol.ID, "--size", "128MiB")
	admin.OK(nil, "volume", "delete", vol.ID)
}

// TestCrashDuringClone: kill -9 in the middle of a clone copy; after a
// restart the clone completes with exactly the snapshot's data, and the
// snapshot can be deleted afterwards (the clone no longer holds it).
func TestCrashDuringClone(t *testing.T) {
	t.Parallel()
	// Make the snapshot at full speed, then restart throttled for the clone.
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	vol := admin.CreateVolume("--size", "64MiB", "--name", "src")
	data := []region{{0, randomBytes(t, int(16*MiB))}, {40 * MiB, randomBytes(t, int(16*MiB))}}
	writeRegions(t, n.VolumeFile(vol.ID), data)
	snap := admin.CreateSnapshot("src", "--name", "s", "--wait")
	n.StopOK()
	n.opts.Args = []string{"--job-bandwidth", "4MiB"}
	n.Restart()

	clone := admin.CreateVolume("--from-snapshot", "s", "--name", "clone")
	if clone.Status != "creating" {
		t.Fatalf("clone without --wait is %q, want creating", clone.Status)
	}
	if clone.Progress == nil {
		t.Errorf("a creating clone shows no progress: %+v", clone)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		v := admin.Volume(clone.ID)
		if v.Status != "creating" {
			t.Fatalf("clone is %s before the crash could happen", v.Status)
		}
		if v.Progress != nil && v.Progress.DoneBytes > 0 {
			if v.Progress.TotalBytes != 64*MiB {
				t.Errorf("clone progress total %d, want %d", v.Progress.TotalBytes, 64*MiB)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("clone progress never showed bytes done: %+v", v.Progress)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second)
	n.Kill()
	if exists(n.VolumeFile(clone.ID)) {
		t.Fatalf("the clone's file exists before the copy finished")
	}

	n.Restart()
	got := admin.WaitVolume(clone.ID, 60*time.Second)
	if got.Status != "available" {
		t.Fatalf("clone after crash and restart: %s (%s), want available", got.Status, got.StatusMessage)
	}
	cf := n.VolumeFile(clone.ID)
	if fs := fileSize(t, cf); fs != 64*MiB {
		t.Errorf("clone file is %d bytes, want %d", fs, 64*MiB)
	}
	checkRegions(t, "clone file after crash", cf, data)
	if regionSum(t, cf, 0, int(64*MiB)) != regionSum(t, n.SnapshotFile(snap.ID), 0, int(64*MiB)) {
		t.Errorf("clone file differs from the snapshot")
	}
	noTransitional(t, admin)
	noPartials(t, n)
	admin.OK(nil, "snapshot", "delete", snap.ID)
	checkRegions(t, "clone file after its snapshot was deleted", cf, data)
}

// TestGracefulStopDuringSnapshot: SIGTERM in the middle of a copy exits 0
// promptly; the next start finishes the snapshot.
func TestGracefulStopDuringSnapshot(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{Args: []string{"--job-bandwidth", "4MiB"}})
	admin := n.Admin()
	vol := admin.CreateVolume("--size", "64MiB")
	data := []region{{8 * MiB, randomBytes(t, int(16*MiB))}}
	writeRegions(t, n.VolumeFile(vol.ID), data)
	snap := admin.CreateSnapshot(vol.ID)
	waitSnapshotProgress(t, admin, snap.ID, 5*time.Second)

	code, took := n.Stop()
	if code != 0 {
		t.Errorf("exit status %d after SIGTERM during a snapshot copy, want 0", code)
	}
	if took > 15*time.Second {
		t.Errorf("SIGTERM during a copy took %v to exit", took)
	}
	n.Restart()
	got := admin.WaitSnapshot(snap.ID, 60*time.Second)
	if got.Status != "available" {
		t.Fatalf("snapshot after graceful restart: %s (%s)", got.Status, got.StatusMessage)
	}
	checkRegions(t, "snapshot file", n.SnapshotFile(snap.ID), data)
	noTransitional(t, admin)
	noPartials(t, n)
}
