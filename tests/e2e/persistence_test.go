package e2e

import (
	"testing"
)

// TestPersistenceAcrossRestart: users, volumes, snapshots, names, the
// provisioned total and the data itself survive a clean restart.
func TestPersistenceAcrossRestart(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	alice := admin.CreateUser("alice")
	bob := admin.CreateUser("bob")

	av := alice.CreateVolume("--size", "256MiB", "--name", "data")
	bv := bob.CreateVolume("--size", "128MiB", "--name", "data")
	admin.CreateVolume("--size", "10GiB", "--name", "scratch")
	data := []region{{4096, randomBytes(t, int(2*MiB))}, {200 * MiB, randomBytes(t, int(MiB))}}
	alice.WriteRegions("data", data)
	as := alice.CreateSnapshot("data", "--name", "before")
	alice.CreateVolume("--from-snapshot", "before", "--name", "copy")
	// After the snapshot the volume changes; the snapshot and its clone
	// must not.
	changed := []region{{4096, randomBytes(t, int(MiB))}}
	alice.WriteRegions("data", changed)
	bob.CreateSnapshot(bv.ID)
	admin.OK(nil, "volume", "extend", "scratch", "--size", "20GiB")

	type view struct{ users, vols, snaps, aliceVols, bobVols string }
	capture := func() view {
		return view{
			users:     admin.OK(nil, "user", "list").Stdout,
			vols:      admin.OK(nil, "volume", "list").Stdout,
			snaps:     admin.OK(nil, "snapshot", "list").Stdout,
			aliceVols: alice.OK(nil, "volume", "list").Stdout,
			bobVols:   bob.OK(nil, "volume", "list").Stdout,
		}
	}
	before := capture()
	stBefore := admin.Status()

	n.StopOK()
	n.Restart()

	after := capture()
	for _, c := range []struct{ what, b, a string }{
		{"user list", before.users, after.users},
		{"volume list", before.vols, after.vols},
		{"snapshot list", before.snaps, after.snaps},
		{"alice's volume list", before.aliceVols, after.aliceVols},
		{"bob's volume list", before.bobVols, after.bobVols},
	} {
		if c.a != c.b {
			t.Errorf("%s changed across restart:\nbefore: %s\nafter:  %s", c.what, c.b, c.a)
		}
	}
	stAfter := admin.Status()
	if stAfter.Store.ProvisionedBytes != stBefore.Store.ProvisionedBytes {
		t.Errorf("provisioned_bytes changed across restart: %d -> %d", stBefore.Store.ProvisionedBytes, stAfter.Store.ProvisionedBytes)
	}
	if stAfter.Node.ClusterID != stBefore.Node.ClusterID {
		t.Errorf("cluster id changed across restart")
	}

	// Data, names and identities are all still there.
	checkImage(t, "alice's volume after restart", alice.VolumeCopy(av.ID), image(256*MiB, data, changed))
	checkImage(t, "alice's snapshot after restart", alice.CheckSnapshot("alice's snapshot", as.ID, nil), image(256*MiB, data))
	checkImage(t, "alice's clone after restart", alice.VolumeCopy("copy"), image(256*MiB, data))
	if v := bob.Volume("data"); v.ID != bv.ID {
		t.Errorf("bob's name \"data\" resolves to %s after restart, want %s", v.ID, bv.ID)
	}
	alice.Fail("NameConflict", "volume", "create", "--size", "1GiB", "--name", "data")
	bob.Fail("NotFound", "volume", "show", av.ID)
	if got := admin.Volume("scratch"); got.SizeBytes != 20*GiB {
		t.Errorf("extended volume is %d bytes after restart", got.SizeBytes)
	}
	// And the node keeps working.
	s := alice.CreateSnapshot("data")
	checkImage(t, "snapshot taken after restart", alice.CheckSnapshot("snapshot taken after restart", s.ID, nil), image(256*MiB, data, changed))
	n.StopOK()
}
