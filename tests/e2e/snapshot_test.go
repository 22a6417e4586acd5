package e2e

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestSnapshotExactContent: a snapshot holds the volume's bytes as of its
// creation, a clone holds the snapshot's bytes, holes stay zero; list
// filters by volume; delete removes record and file.
func TestSnapshotExactContent(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	const size = 1 * GiB
	vol := admin.CreateVolume("--size", "1GiB", "--name", "src")
	vf := n.VolumeFile(vol.ID)

	// 8 MiB of random data in three regions: the start, an odd offset in
	// the middle, the very end.
	orig := []region{
		{0, randomBytes(t, int(1*MiB))},
		{300*MiB + 4096 + 512, randomBytes(t, int(3*MiB))},
		{size - 4*MiB, randomBytes(t, int(4*MiB))},
	}
	writeRegions(t, vf, orig)

	r := admin.OK(nil, "snapshot", "create", "src", "--name", "s1", "--wait")
	requireKeys(t, "snapshot create output", []byte(r.Stdout), "id", "name", "volume_id", "size_bytes", "status", "owner", "created_at")
	var snap Snapshot
	json.Unmarshal([]byte(r.Stdout), &snap)
	if snap.Status != "available" || snap.VolumeID != vol.ID || snap.SizeBytes != size || snap.Name != "s1" || snap.Owner != "admin" {
		t.Fatalf("snapshot after --wait: %+v", snap)
	}

	// Overwrite the volume: the snapshot must not change.
	changed := make([]region, len(orig))
	for i, o := range orig {
		changed[i] = region{o.off, bytes.Repeat([]byte{0xA5}, len(o.data))}
	}
	writeRegions(t, vf, changed)
	checkRegions(t, "volume after overwrite", vf, changed)

	sf := n.SnapshotFile(snap.ID)
	if got := fileSize(t, sf); got != size {
		t.Errorf("snapshot file is %d bytes, want %d", got, size)
	}
	checkRegions(t, "snapshot file", sf, orig)
	zero := make([]byte, MiB)
	if !bytes.Equal(readAt(t, sf, 600*MiB, int(MiB)), zero) {
		t.Errorf("snapshot file: a region never written is not zero")
	}
	if a := allocated(t, sf); a > 64*MiB {
		t.Errorf("snapshot of a volume with 8 MiB of data allocates %d bytes; holes should stay holes", a)
	}

	// Clone: the snapshot's bytes, not the volume's current ones.
	var clone Volume
	admin.OK(&clone, "volume", "create", "--from-snapshot", snap.ID, "--name", "clone", "--wait")
	if clone.Status != "available" || clone.SourceSnapshot != snap.ID || clone.SizeBytes != size {
		t.Fatalf("clone after --wait: %+v", clone)
	}
	cf := n.VolumeFile(clone.ID)
	if got := fileSize(t, cf); got != size {
		t.Errorf("clone file is %d bytes, want %d", got, size)
	}
	checkRegions(t, "clone file", cf, orig)
	if !bytes.Equal(readAt(t, cf, 600*MiB, int(MiB)), zero) {
		t.Errorf("clone file: a region never written is not zero")
	}
	// The clone is independent of the source volume and of the snapshot.
	writeAt(t, cf, 0, bytes.Repeat([]byte{0x5A}, 4096))
	checkRegions(t, "snapshot file after writing the clone", sf, orig)

	// A bigger clone, by snapshot name.
	var big Volume
	admin.OK(&big, "volume", "create", "--from-snapshot", "s1", "--size", "2GiB", "--wait")
	if big.SizeBytes != 2*GiB || big.Status != "available" {
		t.Errorf("2 GiB clone: %+v", big)
	}
	if got := fileSize(t, n.VolumeFile(big.ID)); got != 2*GiB {
		t.Errorf("2 GiB clone file is %d bytes", got)
	}
	checkRegions(t, "2 GiB clone file", n.VolumeFile(big.ID), orig)
	admin.Fail("InvalidSize", "volume", "create", "--from-snapshot", snap.ID, "--size", "512MiB")

	// list --volume filters; show by id and name.
	other := admin.CreateVolume("--size", "64MiB", "--name", "other")
	s2 := admin.CreateSnapshot("other", "--wait")
	s3 := admin.CreateSnapshot(vol.ID, "--wait")
	if got := admin.Snapshot("s1"); got.ID != snap.ID {
		t.Errorf("snapshot show s1 = %s, want %s", got.ID, snap.ID)
	}
	ids := func(ss []Snapshot) map[string]bool {
		m := map[string]bool{}
		for _, s := range ss {
			m[s.ID] = true
		}
		return m
	}
	if got := ids(admin.Snapshots("--volume", "src")); len(got) != 2 || !got[snap.ID] || !got[s3.ID] {
		t.Errorf("snapshot list --volume src = %v, want %s and %s", got, snap.ID, s3.ID)
	}
	if got := ids(admin.Snapshots("--volume", other.ID)); len(got) != 1 || !got[s2.ID] {
		t.Errorf("snapshot list --volume %s = %v, want only %s", other.ID, got, s2.ID)
	}
	if got := ids(admin.Snapshots()); len(got) != 3 {
		t.Errorf("snapshot list = %v, want 3 snapshots", got)
	}
	admin.Fail("NotFound", "snapshot", "list", "--volume", "nosuch")
	list := admin.OK(nil, "snapshot", "list")
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(list.Stdout), &raw); err != nil {
		t.Fatalf("snapshot list is not a JSON array: %v", err)
	}
	for _, e := range raw {
		requireKeys(t, "snapshot list entry", e, "id", "name", "volume_id", "size_bytes", "status", "owner", "created_at")
	}
	admin.Fail("NameConflict", "snapshot", "create", "other", "--name", "s1")

	// Snapshots survive their volume; a snapshot with finished clones can
	// be deleted and the clones keep their data.
	admin.OK(nil, "volume", "delete", "other")
	if got := admin.Snapshot(s2.ID); got.Status != "available" {
		t.Errorf("snapshot of a deleted volume: %+v", got)
	}
	admin.OK(nil, "snapshot", "delete", snap.ID)
	if exists(sf) {
		t.Errorf("snapshot file %s still exists after delete", sf)
	}
	admin.Fail("NotFound", "snapshot", "show", snap.ID)
	admin.Fail("NotFound", "snapshot", "show", "s1")
	checkRegions(t, "clone file after its snapshot was deleted", cf, orig[1:])
	if got := ids(admin.Snapshots()); len(got) != 2 || got[snap.ID] {
		t.Errorf("snapshot list after delete = %v", got)
	}
	admin.OK(nil, "snapshot", "delete", s2.ID)
	admin.OK(nil, "snapshot", "delete", s3.ID)
	// Everything left is the three volumes: provisioned bytes add up.
	var total int64
	for _, v := range admin.Volumes() {
		total += v.SizeBytes
	}
	if st := admin.Status(); st.Store.ProvisionedBytes != total {
		t.Errorf("provisioned_bytes %d, want %d (sum of the volumes left)", st.Store.ProvisionedBytes, total)
	}
}
