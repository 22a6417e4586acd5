package e2e

// The bridge between volumes and objects: `snapshot export --to s3://`
// and `volume create --from-object`, checked with the aws cli and NBD
// clients; on XFS the data is shared by reflink, never by a link that
// would let a write through one name change the other.

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// copyReport is the block.CopyReport inside export and import reports.
type copyReport struct {
	Object      string `json:"object"`
	ETag        string `json:"etag"`
	Bytes       int64  `json:"bytes"`
	DataBytes   int64  `json:"data_bytes"`
	ClonedBytes int64  `json:"cloned_bytes"`
	KernelBytes int64  `json:"kernel_copied_bytes"`
	UserBytes   int64  `json:"user_copied_bytes"`
}

func jobReport(t *testing.T, what string, j *JobResult, kind string) copyReport {
	t.Helper()
	if j == nil || j.Job != kind || j.Error != "" {
		t.Fatalf("%s: last job %+v, want a successful %s", what, j, kind)
	}
	var r copyReport
	if err := json.Unmarshal(j.Report, &r); err != nil {
		t.Fatalf("%s: report %s: %v", what, j.Report, err)
	}
	return r
}

// exportSnapshot runs `snapshot export --wait` and returns the report.
func exportSnapshot(t *testing.T, c *Client, snap, url string) copyReport {
	t.Helper()
	var sn Snapshot
	c.OK(&sn, "snapshot", "export", snap, "--to", url, "--wait")
	if sn.Progress != nil {
		t.Fatalf("export --wait returned while the job runs: %+v", sn)
	}
	r := jobReport(t, "export of "+snap, sn.LastJob, "export")
	if r.Object != url || r.ETag == "" {
		t.Fatalf("export report %+v", r)
	}
	return r
}

// importVolume runs `volume create --from-object --wait`.
func importVolume(t *testing.T, c *Client, url string, args ...string) (Volume, copyReport) {
	t.Helper()
	var v Volume
	c.OK(&v, append([]string{"volume", "create", "--from-object", url, "--wait"}, args...)...)
	if v.Status != "available" || v.SourceObject != url {
		t.Fatalf("volume from %s: %+v", url, v)
	}
	return v, jobReport(t, "import of "+url, v.LastJob, "import")
}

func TestBridgeSnapshotObjectVolume(t *testing.T) {
	t.Parallel()
	requireTools(t, "aws", "nbdcopy", "qemu-io")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	aliceC, bobC := admin.CreateUser("alice"), admin.CreateUser("bob")
	alice, bob := n.S3User(aliceC), n.S3User(bobC)
	alice.AWSOK("s3", "mb", "s3://alice-img")
	bob.AWSOK("s3", "mb", "s3://bob-img")

	const size = 40 << 20
	want := make([]byte, size)
	copy(want[1<<20:], bytes.Repeat([]byte{0x5a}, 3<<20))
	copy(want[20<<20:], bytes.Repeat([]byte{0x6b}, 64<<10))
	aliceC.CreateVolume("--size", sz(size), "--name", "src")
	a := aliceC.Attach("src", "hv1", "rw")
	qemuIOGood(t, "write", a.NBDURI, "write -P 0x5a 1M 3M", "write -P 0x6b 20M 64k", "flush")
	snap := aliceC.CreateSnapshot("src", "--name", "s1")
	// Written after the snapshot: in no object made from it.
	qemuIOGood(t, "write after the snapshot", a.NBDURI, "write -P 0x77 1M 1M", "flush")
	aliceC.Detach(a.ID)

	// Snapshot → object: the snapshot's bytes, a plain sparse file.
	const url = "s3://alice-img/images/s1.raw"
	rep := exportSnapshot(t, aliceC, "s1", url)
	if rep.Bytes != size || rep.DataBytes < 3<<20 || rep.DataBytes > 8<<20 || rep.UserBytes != 0 {
		t.Errorf("export report %+v: want ~3 MiB of data moved in the kernel, holes skipped", rep)
	}
	got, etag := awsGetETag(t, alice, "alice-img", "images/s1.raw")
	if !bytes.Equal(got, want) || etag != md5Of(want) || rep.ETag != etag {
		t.Fatalf("GET of the exported snapshot: %d bytes, ETag %s (report %s), want %d bytes, %s", len(got), etag, rep.ETag, len(want), md5Of(want))
	}
	var p objPath
	aliceC.OK(&p, "object", "path", url)
	if a := allocatedTree(t, p.Path); a > 8<<20 {
		t.Errorf("the object's file %s allocates %d bytes: the snapshot's holes were filled", p.Path, a)
	}

	// Object → volume, through cow over a file (kernel copies) and
	// through crypt (every byte through the layers).
	restored, irep := importVolume(t, aliceC, url, "--name", "restored")
	if restored.SizeBytes != size || irep.UserBytes != 0 || irep.DataBytes < 3<<20 || irep.DataBytes > 8<<20 {
		t.Errorf("import: volume %+v report %+v", restored, irep)
	}
	if !bytes.Equal(mustRead(t, aliceC.VolumeCopy("restored")), want) {
		t.Fatal("the volume made from the object differs from the snapshot")
	}
	enc, erep := importVolume(t, aliceC, url, "--name", "enc", "--type", "encrypted")
	if enc.Type != "encrypted" || erep.UserBytes == 0 {
		t.Errorf("encrypted import: %+v, report %+v", enc, erep)
	}
	if !bytes.Equal(mustRead(t, aliceC.VolumeCopy("enc")), want) {
		t.Fatal("the encrypted volume made from the object differs from the snapshot")
	}
	aliceC.CreateSnapshot("enc", "--name", "enc-s")
	if r := exportSnapshot(t, aliceC, "enc-s", "s3://alice-img/enc.raw"); r.ETag != md5Of(want) || r.UserBytes == 0 {
		t.Errorf("export of an encrypted snapshot: %+v, want plaintext with ETag %s", r, md5Of(want))
	}

	// Independence: a write through the volume leaves the object alone,
	// and a write into the object's file leaves the volume alone.
	rw := aliceC.Attach("restored", "hv1", "rw")
	qemuIOGood(t, "write to the restored volume", rw.NBDURI, "write -P 0x11 1M 1M", "flush")
	aliceC.Detach(rw.ID)
	if _, etag := awsGetETag(t, alice, "alice-img", "images/s1.raw"); etag != md5Of(want) {
		t.Fatal("a write to the volume made from the object changed the object")
	}
	vol := append([]byte(nil), want...)
	copy(vol[1<<20:], bytes.Repeat([]byte{0x11}, 1<<20))
	f, err := os.OpenFile(p.Path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0x99}, 1<<20), 2<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !bytes.Equal(mustRead(t, aliceC.VolumeCopy("restored")), vol) {
		t.Fatal("a write into the object's file changed the volume made from it")
	}
	// The object is now modified outside S3: no volume is made of it.
	aliceC.Fail("ObjectModifiedOutsideS3", "volume", "create", "--from-object", url, "--name", "bad")

	// Errors: another user's bucket or snapshot, no such object, bad URLs,
	// a size below the object's.
	aliceC.Fail("AccessDenied", "snapshot", "export", "s1", "--to", "s3://bob-img/s1.raw")
	bobC.Fail("NotFound", "snapshot", "export", snap.ID, "--to", "s3://bob-img/s1.raw")
	bobC.Fail("AccessDenied", "volume", "create", "--from-object", "s3://alice-img/enc.raw", "--name", "theft")
	aliceC.Fail("NoSuchKey", "volume", "create", "--from-object", "s3://alice-img/none.raw", "--name", "none")
	aliceC.Fail("NoSuchBucket", "snapshot", "export", "s1", "--to", "s3://no-such-bucket/x")
	aliceC.Fail("InvalidRequest", "snapshot", "export", "s1", "--to", "http://alice-img/x")
	aliceC.Fail("InvalidKey", "snapshot", "export", "s1", "--to", "s3://alice-img/a/../../x")
	aliceC.Fail("InvalidSize", "volume", "create", "--from-object", "s3://alice-img/enc.raw", "--size", "1MiB", "--name", "small")
	if ls := bob.AWSOK("s3", "ls", "--recursive", "s3://bob-img"); ls != "" {
		t.Errorf("bob's bucket holds %q after refused exports", ls)
	}
}

// mountXFS mounts a fresh XFS file system (reflink on) from a sparse
// image and returns its directory; the cleanup unmounts it.
func mountXFS(t *testing.T) string {
	t.Helper()
	requireTools(t, "mkfs.xfs")
	if os.Geteuid() != 0 {
		skipf(t, "mounting an XFS image needs root")
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "xfs.img"), filepath.Join(dir, "mnt")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 2*GiB); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	toolOK(t, time.Minute, "mkfs.xfs", "-q", "-m", "reflink=1", img)
	toolOK(t, time.Minute, "mount", "-o", "loop", img, mnt)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// TestBridgeReflink: with the store on XFS, exporting a snapshot and
// making a volume of the object share the data (the free space barely
// moves, the reports say "cloned"), and still a write through any of the
// three names changes only that one.
func TestBridgeReflink(t *testing.T) {
	t.Parallel()
	requireTools(t, "aws", "nbdcopy", "qemu-io")
	mnt := mountXFS(t)
	n := StartNode(t, NodeOptions{Store: filepath.Join(mnt, "store")})
	admin := n.Admin()
	u := n.S3User(admin)
	u.AWSOK("s3", "mb", "s3://img")

	const data = 96 << 20
	admin.CreateVolume("--size", "256MiB", "--name", "src")
	a := admin.Attach("src", "hv1", "rw")
	in := filepath.Join(t.TempDir(), "in.img")
	writeRandomFile(t, in, data)
	want := mustRead(t, in)
	toolOK(t, 2*time.Minute, "nbdcopy", in, a.NBDURI)
	admin.CreateSnapshot("src", "--name", "s")

	free := freeBytes(t, mnt)
	rep := exportSnapshot(t, admin, "s", "s3://img/s.raw")
	if rep.ClonedBytes < data {
		t.Errorf("export report %+v: want all %d bytes of data reflinked", rep, data)
	}
	if used := free - freeBytes(t, mnt); used > 16<<20 {
		t.Errorf("exporting %d bytes of data used %d bytes of the file system: not shared", data, used)
	}
	got, etag := awsGetETag(t, u, "img", "s.raw")
	if etag != md5Of(got) || !bytes.Equal(got[:data], want) || !bytes.Equal(got[data:], make([]byte, 256<<20-data)) {
		t.Fatal("the exported snapshot differs from what was written")
	}

	free = freeBytes(t, mnt)
	_, irep := importVolume(t, admin, "s3://img/s.raw", "--name", "copy")
	if irep.ClonedBytes < data {
		t.Errorf("import report %+v: want all %d bytes of data reflinked", irep, data)
	}
	if used := free - freeBytes(t, mnt); used > 16<<20 {
		t.Errorf("making a volume of %d bytes of data used %d bytes of the file system: not shared", data, used)
	}

	// Shared blocks, independent files: write through the source volume
	// and the new one; the object and the other volume keep their bytes.
	qemuIOGood(t, "write to the source", a.NBDURI, "write -P 0x21 0 8M", "flush")
	admin.Detach(a.ID)
	c := admin.Attach("copy", "hv1", "rw")
	qemuIOGood(t, "write to the copy", c.NBDURI, "write -P 0x42 8M 8M", "flush")
	admin.Detach(c.ID)
	if _, etag2 := awsGetETag(t, u, "img", "s.raw"); etag2 != etag {
		t.Fatal("writes to the volumes changed the object")
	}
	cp := mustRead(t, admin.VolumeCopy("copy"))
	wantCopy := append([]byte(nil), got...)
	copy(wantCopy[8<<20:], bytes.Repeat([]byte{0x42}, 8<<20))
	if !bytes.Equal(cp, wantCopy) {
		t.Fatal("the volume made from the object shows a write to its source volume")
	}
	src := mustRead(t, admin.VolumeCopy("src"))
	wantSrc := append([]byte(nil), got...)
	copy(wantSrc, bytes.Repeat([]byte{0x21}, 8<<20))
	if !bytes.Equal(src, wantSrc) {
		t.Fatal("the source volume shows a write to the volume made from its export")
	}

	// And a write straight into the object's file, over blocks it still
	// shares with both volumes, changes neither.
	var p objPath
	admin.OK(&p, "object", "path", "s3://img/s.raw")
	f, err := os.OpenFile(p.Path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0x77}, 4<<20), 32<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustRead(t, admin.VolumeCopy("copy")), wantCopy) {
		t.Fatal("a write into the object's file changed the volume made from it")
	}
	if !bytes.Equal(mustRead(t, admin.VolumeCopy("src")), wantSrc) {
		t.Fatal("a write into the object's file changed the volume it was exported from")
	}
}
