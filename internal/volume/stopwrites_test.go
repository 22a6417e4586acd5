package volume

import (
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
)

// TestStopWaitsForWritesInFlight: a node stopping cleanly revokes its
// etcd lease, so that another node takes its volumes over at once — but
// only once the writes already under way here have ended, as when it
// gives one lease up (TestReleaseStopsWritingFirst): the NBD server's
// shutdown gives up on requests still in the device after a while, and a
// write stalled in the file system must not land after the next holder's
// first write.
func TestStopWaitsForWritesInFlight(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Attach(ctx, alice, v.ID, "host", meta.ModeRW); err != nil {
		t.Fatal(err)
	}
	if h, _, err := s.leases.acquire(ctx, v.ID); err != nil || h != s.cfg.Node {
		t.Fatalf("acquire: %q %v", h, err)
	}
	// A write in flight: past the fence, holding the gate's read side.
	gate, drop := s.gate(v.ID)
	defer drop()
	gate.RLock()
	stopped := make(chan struct{})
	go func() { s.Stop(); close(stopped) }()
	time.Sleep(300 * time.Millisecond)
	h, err := e.meta.VolumeLeaseHolder(ctx, v.ID)
	gate.RUnlock()
	if err != nil || h == nil || h.Node != s.cfg.Node {
		t.Fatalf("with a write in flight on the stopping node, the lease key is %+v (%v); want it still %s's", h, err, s.cfg.Node)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return once the write ended")
	}
	if h, err := e.meta.VolumeLeaseHolder(ctx, v.ID); err != nil || h != nil {
		t.Fatalf("after Stop the lease is %+v (%v); want it free", h, err)
	}
}
