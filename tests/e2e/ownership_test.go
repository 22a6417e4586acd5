package e2e

import (
	"net/http"
	"testing"
)

// TestOwnership: a user sees and touches only their own volumes and
// snapshots — someone else's are reported exactly like missing ones —
// names are unique per owner, and admin sees everything.
func TestOwnership(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	alice := admin.CreateUser("alice")
	bob := admin.CreateUser("bob")

	av := alice.CreateVolume("--size", "1GiB", "--name", "data")
	bv := bob.CreateVolume("--size", "2GiB", "--name", "data") // same name, other owner
	if av.Owner != "alice" || bv.Owner != "bob" {
		t.Errorf("owners: alice's volume %q, bob's %q", av.Owner, bv.Owner)
	}
	snapImage := n.TopImage(alice, "data") // the image alice's snapshot freezes
	as := alice.CreateSnapshot("data", "--name", "snap")
	bob.CreateSnapshot("data", "--name", "snap")

	// Names resolve per owner.
	if v := alice.Volume("data"); v.ID != av.ID {
		t.Errorf("alice's \"data\" = %s, want %s", v.ID, av.ID)
	}
	if v := bob.Volume("data"); v.ID != bv.ID {
		t.Errorf("bob's \"data\" = %s, want %s", v.ID, bv.ID)
	}
	alice.Fail("NameConflict", "volume", "create", "--size", "1GiB", "--name", "data")

	before := alice.Volume(av.ID)
	// Bob cannot see or touch alice's volume or snapshot: 404 NotFound.
	bob.Fail("NotFound", "volume", "show", av.ID)
	bob.Fail("NotFound", "volume", "delete", av.ID)
	bob.Fail("NotFound", "volume", "extend", av.ID, "--size", "4GiB")
	bob.Fail("NotFound", "snapshot", "create", av.ID)
	bob.Fail("NotFound", "snapshot", "show", as.ID)
	bob.Fail("NotFound", "snapshot", "delete", as.ID)
	bob.Fail("NotFound", "snapshot", "list", "--volume", av.ID)
	bob.Fail("NotFound", "volume", "create", "--from-snapshot", as.ID)
	// The same answers as for ids that do not exist at all.
	bob.Fail("NotFound", "volume", "show", "vol-0000000000000000")
	bob.Fail("NotFound", "snapshot", "show", "snap-0000000000000000")

	// Over raw HTTP: 404 with the same code.
	for _, req := range []struct{ method, path, body string }{
		{"GET", "/v1/volumes/" + av.ID, ""},
		{"DELETE", "/v1/volumes/" + av.ID, ""},
		{"POST", "/v1/volumes/" + av.ID + "/extend", `{"size":"4GiB"}`},
		{"GET", "/v1/snapshots/" + as.ID, ""},
		{"DELETE", "/v1/snapshots/" + as.ID, ""},
		{"POST", "/v1/snapshots", `{"volume":"` + av.ID + `"}`},
	} {
		status, code, body := call(t, identityHTTP(t, bob.Identity), req.method, n.Endpoint()+req.path, req.body)
		if status != http.StatusNotFound || code != "NotFound" {
			t.Errorf("bob %s %s: HTTP %d %s, want 404 NotFound", req.method, req.path, status, body)
		}
	}

	// Nothing of alice's changed.
	after := alice.Volume(av.ID)
	if after.SizeBytes != before.SizeBytes || after.Status != "available" {
		t.Errorf("alice's volume changed through bob's refused requests: %+v", after)
	}
	if !exists(n.VolumeDir(av.ID)) || !exists(n.ImageDir(snapImage)) || !exists(n.ImageDir(n.TopImage(alice, av.ID))) {
		t.Errorf("alice's volume directory or images disappeared")
	}
	if got := alice.Snapshot(as.ID); got.Status != "available" {
		t.Errorf("alice's snapshot after bob's refused requests: %+v", got)
	}
	if got := alice.Snapshots("--volume", "data"); len(got) != 1 || got[0].ID != as.ID {
		t.Errorf("alice's snapshots of data: %+v", got)
	}

	// Lists: each user their own; admin all.
	for _, c := range []struct {
		who  *Client
		name string
		want []string
	}{{alice, "alice", []string{av.ID}}, {bob, "bob", []string{bv.ID}}, {admin, "admin", []string{av.ID, bv.ID}}} {
		got := map[string]bool{}
		for _, v := range c.who.Volumes() {
			got[v.ID] = true
		}
		if len(got) != len(c.want) {
			t.Errorf("%s's volume list = %v, want %v", c.name, got, c.want)
		}
		for _, id := range c.want {
			if !got[id] {
				t.Errorf("%s's volume list lacks %s: %v", c.name, id, got)
			}
		}
	}
	if ss := bob.Snapshots(); len(ss) != 1 || ss[0].Owner != "bob" {
		t.Errorf("bob's snapshot list: %+v", ss)
	}
	if ss := admin.Snapshots(); len(ss) != 2 {
		t.Errorf("admin's snapshot list has %d snapshots, want 2", len(ss))
	}

	// Admin may act on anyone's volume (by id).
	var ext Volume
	admin.OK(&ext, "volume", "extend", bv.ID, "--size", "3GiB")
	if ext.SizeBytes != 3*GiB || ext.Owner != "bob" {
		t.Errorf("admin's extend of bob's volume: %+v", ext)
	}
	// A clone belongs to whoever makes it.
	clone := alice.CreateVolume("--from-snapshot", "snap")
	if clone.Owner != "alice" {
		t.Errorf("alice's clone is owned by %q", clone.Owner)
	}
}
