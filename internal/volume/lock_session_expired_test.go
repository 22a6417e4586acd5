package volume

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/lock"
)

// TestLockSessionExpired: the etcd lease of the node's workflow-lock
// session ends while the node is cut off or paused for longer than its
// TTL; the node's keepalives find that out only a while later. Until
// then every workflow that takes a lock was answered 503
// MetadataUnavailable ("requested lease not found") although the
// metadata cluster answered all along, the extend and the snapshot
// below included. The lock is taken on a new session instead.
func TestLockSessionExpired(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "db", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// The session's lease, read off a lock taken on it, ends as an
	// expiry ends it.
	probe := "probe-" + v.ID
	wl, err := s.lockFor(ctx, "volume", probe, lock.Read)
	if err != nil {
		t.Fatal(err)
	}
	q, err := s.lockr.Queue(ctx, "volume/"+probe)
	if err != nil || len(q) != 1 {
		t.Fatalf("queue of the probe lock: %v, %v", q, err)
	}
	wl.unlock()
	if _, err := e.meta.Client().Revoke(ctx, q[0].Lease); err != nil {
		t.Fatal(err)
	}

	out, err := s.ExtendVolume(ctx, alice, v.ID, 2<<20)
	if err != nil || out.SizeBytes != 2<<20 {
		t.Fatalf("extend after the lock session's lease ended: %+v, %v; want it extended", out, err)
	}
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "nightly", "")
	if err != nil {
		t.Fatalf("snapshot after the lock session's lease ended: %v", err)
	}
	e.snapAvailable(sn.ID)
	if err := s.DeleteSnapshot(ctx, alice, sn.ID); err != nil {
		t.Fatalf("snapshot delete: %v", err)
	}
}
