package volume

import (
	"errors"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestReleaseWaitsForWritesPastTheFence: giving a volume's write lease up
// waited only for the writes that hold the volume's gate (NBD's); a write
// no gate holds — a mirror's resync, a job's copy — that had passed its
// stack's fence was not waited for, and, stalled in the file system,
// could land after the next holder's first write. The lease key now goes
// only once every write its fences let through is done.
func TestReleaseWaitsForWritesPastTheFence(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	att, err := s.Attach(ctx, alice, v.ID, "host", meta.ModeRW)
	if err != nil {
		t.Fatal(err)
	}
	s.leases.mu.Lock()
	token := s.leases.held[v.ID]
	s.leases.mu.Unlock()
	f, forget := s.leases.fenceFor(v.ID, token)
	defer forget()
	if err := f.Enter(); err != nil { // a resync's write, under way
		t.Fatal(err)
	}
	detached := make(chan error, 1)
	go func() { detached <- s.Detach(ctx, alice, att.ID) }()
	time.Sleep(300 * time.Millisecond)
	if h, err := e.meta.VolumeLeaseHolder(ctx, v.ID); err != nil || h == nil || h.Node != s.cfg.Node {
		t.Fatalf("with a write past the fence under way the lease key is %+v (%v); want it still %s's", h, err, s.cfg.Node)
	}
	if err := f.Enter(); !errors.Is(err, block.ErrFenced) {
		f.Exit()
		t.Fatalf("a write after the release began was let through (%v)", err)
	}
	f.Exit()
	select {
	case err := <-detached:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the detach did not return once the write was done")
	}
	if h, err := e.meta.VolumeLeaseHolder(ctx, v.ID); err != nil || h != nil {
		t.Fatalf("after the write ended and the detach returned, the lease is %+v (%v)", h, err)
	}
	cleanupAll(t, s, alice)
}
