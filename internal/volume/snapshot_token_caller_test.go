package volume

import (
	"testing"
)

// A snapshot's client token is its caller's: an admin who snapshots a
// user's volume and retries after the volume is deleted gets the
// snapshot back (before, the token was recorded under the owner and the
// admin's retry, not knowing the owner any more, got NotFound). The same
// token string of another caller is another token, and deleting the
// snapshot frees the token where it was recorded.
func TestSnapshotTokenIsTheCallers(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "src", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sn, err := s.CreateSnapshot(ctx, adminCaller, v.ID, "by-admin", "adm-1")
	if err != nil {
		t.Fatal(err)
	}
	e.snapAvailable(sn.ID)
	if r, err := s.CreateSnapshot(ctx, adminCaller, v.ID, "by-admin", "adm-1"); err != nil || r.ID != sn.ID {
		t.Fatalf("admin's replay: %+v, %v; want %s", r, err, sn.ID)
	}
	// alice's "adm-1" is hers, not the admin's.
	mine, err := s.CreateSnapshot(ctx, alice, v.ID, "mine", "adm-1")
	if err != nil || mine.ID == sn.ID {
		t.Fatalf("alice's snapshot with the admin's token string: %+v, %v", mine, err)
	}
	e.snapAvailable(mine.ID)
	if err := s.DeleteVolume(ctx, alice, v.ID); err != nil {
		t.Fatal(err)
	}
	if r, err := s.CreateSnapshot(ctx, adminCaller, v.ID, "by-admin", "adm-1"); err != nil || r.ID != sn.ID {
		t.Fatalf("admin's replay after the volume's delete: %+v, %v; want %s", r, err, sn.ID)
	}
	if err := s.DeleteSnapshot(ctx, adminCaller, sn.ID); err != nil {
		t.Fatal(err)
	}
	// The token went with the snapshot: on a new volume it makes a new one.
	w, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "next", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.CreateSnapshot(ctx, adminCaller, w.ID, "by-admin", "adm-1")
	if err != nil || again.ID == sn.ID {
		t.Fatalf("admin's token after its snapshot's delete: %+v, %v", again, err)
	}
	e.snapAvailable(again.ID)
	cleanupAll(t, s, alice)
}
