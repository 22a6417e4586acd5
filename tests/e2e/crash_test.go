package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

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

// TestCrashAfterSnapshot: data written and flushed through NBD before a
// snapshot, more written and flushed after it, then kill -9. After the
// restart the snapshot (read through a clone) holds exactly the data from
// before it, and the volume exactly the data from after it — including
// chunks only partly overwritten after the snapshot (copied up).
func TestCrashAfterSnapshot(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "nbdcopy")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	const size = 64 * MiB
	vol := admin.CreateVolume("--size", sz(size), "--name", "crash")
	a := admin.Attach("crash", "hv1", "rw")

	before := []region{
		{0, randomBytes(t, int(4*MiB))},
		{20*MiB + 4096, randomBytes(t, int(3*MiB))},
		{size - 4*MiB, randomBytes(t, int(4*MiB))},
	}
	writeRegionsURI(t, a.NBDURI, before)
	snap := admin.CreateSnapshot("crash", "--name", "s")
	if snap.Status != "available" || snap.SizeBytes != size {
		t.Fatalf("snapshot of an attached volume: %+v, want available at once", snap)
	}
	// After the snapshot: part of a chunk the snapshot holds (512 bytes into
	// a 64 KiB chunk), a whole region over again, and fresh space.
	after := []region{
		{1*MiB + 512, randomBytes(t, int(MiB))},
		{20*MiB + 4096, randomBytes(t, int(3*MiB))},
		{40 * MiB, randomBytes(t, int(2*MiB))},
	}
	writeRegionsURI(t, a.NBDURI, after)
	n.Kill()

	n.Restart()
	noTransitional(t, admin)
	if got := admin.Snapshot(snap.ID); got.Status != "available" || got.SizeBytes != size {
		t.Errorf("snapshot after kill -9 and restart: %+v", got)
	}
	if got := admin.Volume(vol.ID); got.Status != "in-use" {
		t.Errorf("volume after kill -9 and restart: %s (%s), want in-use (its attachment persists)", got.Status, got.StatusMessage)
	}
	// The attachment survived the crash: read the volume through it.
	checkImage(t, "volume after kill -9", copyOut(t, a.NBDURI), image(size, before, after))
	admin.Detach(a.ID)

	clone := admin.CreateVolume("--from-snapshot", "s", "--name", "clone")
	checkImage(t, "clone of the snapshot after kill -9", admin.VolumeCopy(clone.ID), image(size, before))

	// Everything is usable again: another snapshot, an extend, a delete.
	s2 := admin.CreateSnapshot("crash")
	admin.OK(nil, "volume", "extend", vol.ID, "--size", sz(2*size))
	admin.OK(nil, "volume", "delete", vol.ID)
	checkImage(t, "second snapshot, after its volume was deleted", admin.CheckSnapshot("second snapshot", s2.ID, nil), image(size, before, after))
}

// TestCrashDuringFlatten: kill -9 while a flatten runs on a clone of a
// snapshot holding 256 MiB; after the restart the job resumes (or had
// finished) and ends without error, the clone holds the snapshot's data
// plus its own writes, and it no longer needs the snapshot: once the
// snapshot and its volume are deleted, the snapshot's image is removed
// from STORE/images (--image-grace 0s) and the clone still reads the same.
func TestCrashDuringFlatten(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "nbdcopy")
	n := StartNode(t, NodeOptions{Args: []string{"--image-grace", "0s"}})
	admin := n.Admin()
	const size, written = 320 * MiB, 256 * MiB
	admin.CreateVolume("--size", sz(size), "--name", "src")
	in := filepath.Join(t.TempDir(), "in.img")
	writeRandomFile(t, in, written)
	admin.withAttachment("src", "rw", func(uri string) {
		toolOK(t, 2*time.Minute, "nbdcopy", "--flush", in, uri)
	})
	base := []region{{0, mustRead(t, in)}}
	os.Remove(in)

	snapImage := n.TopImage(admin, "src") // what the snapshot freezes
	snap := admin.CreateSnapshot("src", "--name", "s")
	// The source goes on changing; none of that may reach the clone.
	admin.WriteVolume("src", 0, bytes.Repeat([]byte{0xEE}, int(MiB)))
	clone := admin.CreateVolume("--from-snapshot", "s", "--name", "clone")
	// The clone's own writes, from before the flatten, must survive it.
	own := []region{{100*MiB + 512, randomBytes(t, int(MiB))}, {300 * MiB, randomBytes(t, int(MiB))}}
	admin.WriteRegions("clone", own)
	want := image(size, base, own)

	var started Volume
	admin.OK(&started, "volume", "flatten", "clone")
	if started.Progress == nil || started.Progress.Job != "flatten" {
		t.Fatalf("volume flatten printed progress %+v, want a running flatten", started.Progress)
	}
	n.Kill()
	mark := len(n.Log())
	n.Restart()

	got := admin.WaitJob("clone", 2*time.Minute)
	if got.LastJob == nil || got.LastJob.Job != "flatten" || got.LastJob.Error != "" {
		t.Fatalf("after kill -9 during a flatten and a restart, last_job is %+v, want a flatten without error", got.LastJob)
	}
	if strings.Contains(n.Log()[mark:], "resuming job") {
		t.Logf("the flatten was interrupted by the kill and resumed after the restart")
	} else {
		t.Logf("the flatten had finished before the kill")
	}
	noTransitional(t, admin)
	if got.Status != "available" {
		t.Errorf("clone after the flatten: %s (%s)", got.Status, got.StatusMessage)
	}
	checkImage(t, "clone after its flatten was interrupted by kill -9", admin.VolumeCopy("clone"), want)

	// The snapshot's image stays while the source volume still reads from
	// it, and goes when nothing does: the flattened clone does not.
	admin.OK(nil, "snapshot", "delete", snap.ID)
	if !exists(n.ImageDir(snapImage)) {
		t.Fatalf("the snapshot's image %s was removed while its volume still reads from it", snapImage)
	}
	admin.OK(nil, "volume", "delete", "src")
	top := n.TopImage(admin, clone.ID)
	imgs := n.WaitImages(10*time.Second, func(imgs []string) bool { return slices.Equal(imgs, []string{top}) })
	if slices.Contains(imgs, snapImage) {
		t.Errorf("the snapshot's image %s is still in STORE/images after the snapshot and its volume were deleted (--image-grace 0s)", snapImage)
	}
	if !slices.Equal(imgs, []string{top}) {
		t.Errorf("STORE/images holds %v, want only the clone's image %s", imgs, top)
	}
	checkImage(t, "flattened clone after its snapshot's image was removed", admin.VolumeCopy("clone"), want)
}

// TestGracefulStopDuringFlatten: SIGTERM while a flatten runs exits 0
// promptly; the job stays recorded, the next start runs it again, and it
// ends without error: the clone holds its data even once the snapshot and
// its volume are gone. The clone's images are throttled (slowImagesStack)
// so the job is surely still running at the SIGTERM.
func TestGracefulStopDuringFlatten(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "nbdcopy")
	n := StartNode(t, NodeOptions{Args: []string{"--image-grace", "0s"}})
	admin := n.Admin()
	admin.OK(nil, "type", "create", "slow", "--stack", stackFile(t, slowImagesStack))
	const size = 32 * MiB
	admin.CreateVolume("--size", sz(size), "--type", "slow", "--name", "src")
	data := []region{{4 * MiB, randomBytes(t, int(16*MiB))}}
	admin.WriteRegions("src", data)
	admin.CreateSnapshot("src", "--name", "s")
	admin.CreateVolume("--from-snapshot", "s", "--name", "clone")
	admin.OK(nil, "volume", "flatten", "clone")

	code, took := n.Stop()
	if code != 0 {
		t.Errorf("exit status %d after SIGTERM during a flatten, want 0", code)
	}
	if took > 10*time.Second {
		t.Errorf("SIGTERM during a flatten took %v to exit", took)
	}
	n.Restart()
	if v := admin.Volume("clone"); v.Progress == nil || v.Progress.Job != "flatten" {
		t.Errorf("right after the restart the interrupted flatten is not running: progress %+v, last_job %+v", v.Progress, v.LastJob)
	}
	got := admin.WaitJob("clone", time.Minute)
	if got.LastJob == nil || got.LastJob.Job != "flatten" || got.LastJob.Error != "" {
		t.Fatalf("resumed flatten ended with last_job %+v", got.LastJob)
	}
	noTransitional(t, admin)
	admin.OK(nil, "snapshot", "delete", "s")
	admin.OK(nil, "volume", "delete", "src")
	if imgs := n.WaitImages(10*time.Second, func(imgs []string) bool { return len(imgs) == 1 }); len(imgs) != 1 {
		t.Errorf("STORE/images holds %v once only the flattened clone is left, want its image only", imgs)
	}
	checkImage(t, "clone after a flatten interrupted by SIGTERM", admin.VolumeCopy("clone"), image(size, data))
}
