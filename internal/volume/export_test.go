package volume

import (
	"context"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
	"github.com/basalt-storage/basalt/internal/nbd"
	"github.com/basalt-storage/basalt/internal/store"
)

// runExports makes s's NBD exports and runs them until the test ends.
func runExports(t *testing.T, s *Service) *Exports {
	x := s.NewExports(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		x.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return x
}

// attached creates a volume and attaches it in mode.
func attached(t *testing.T, s *Service, mode string) *meta.Attachment {
	t.Helper()
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: uniq("v"), SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Attach(ctx, alice, v.ID, "hv1", mode)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// writersOf counts the rw exports the node keeps for volume vol.
func (x *Exports) writersOf(vol string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.writers[vol])
}

func revoked(exp *nbd.Export) bool {
	select {
	case <-exp.Revoked:
		return true
	default:
		return false
	}
}

func waitRevoked(t *testing.T, exp *nbd.Export, what string) {
	t.Helper()
	select {
	case <-exp.Revoked:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the export's connections are not revoked", what)
	}
}

// TestExportWritersBounded: every rw open (a connection, or an INFO query
// such as nbdinfo's) is forgotten when released, so a node serving an
// attachment for months does not grow a record per connection; one still
// open is remembered, and losing the write lease revokes it.
func TestExportWritersBounded(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	a := attached(t, s, meta.ModeRW)
	x := runExports(t, s)

	held, err := x.Open(ctx, a.Export, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		exp, err := x.Open(ctx, a.Export, nil)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		exp.Release()
	}
	if n := x.writersOf(a.VolumeID); n != 1 {
		t.Fatalf("after 200 opens and releases with one export held, %d writers recorded, want 1", n)
	}
	x.fenced(a.VolumeID)
	if !revoked(held) {
		t.Fatal("losing the write lease did not revoke the open export")
	}
	held.Release()
	if n := x.writersOf(a.VolumeID); n != 0 {
		t.Fatalf("%d writers recorded after all were released", n)
	}
}

// TestDetachRevokesHere: the node that serves a detach closes the
// attachment's connections before it answers, whatever its watch of
// deletions is doing (here: nothing, it never started).
func TestDetachRevokesHere(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	a := attached(t, s, meta.ModeRO)
	x := s.NewExports(nil)
	x.readyOnce.Do(func() { close(x.ready) }) // Open need not wait for Run
	exp, err := x.Open(ctx, a.Export, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Release()
	if err := s.Detach(ctx, adminCaller, a.ID); err != nil {
		t.Fatal(err)
	}
	if !revoked(exp) {
		t.Fatal("Detach returned with the attachment's connection on this node still open")
	}
}

// TestDetachDuringWatchBreak: node A serves attachments; node B detaches
// them while A's watch of deletions is broken — once with the history
// still there, once compacted away before the watch comes back. Both
// connections are closed: the watch resumes where it broke, and after a
// compaction A takes stock of what is gone.
func TestDetachDuringWatchBreak(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	mA := metatest.Shared(t).Connect(t)
	watches := metatest.BreakableWatches(mA)
	sA := New(mA, e.st, Config{Node: e.node, ImageGrace: -1}, quietLog())
	t.Cleanup(sA.Stop)
	if err := sA.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Node B: another node, with a data root of its own.
	stB, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sB := New(e.meta, stB, Config{Node: uniq("nodeb"), ImageGrace: -1}, quietLog())
	t.Cleanup(sB.Stop)
	if err := sB.Start(ctx); err != nil {
		t.Fatal(err)
	}
	first, second := attached(t, sA, meta.ModeRO), attached(t, sA, meta.ModeRO)
	xA := runExports(t, sA)
	exp1, err := xA.Open(ctx, first.Export, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer exp1.Release()
	exp2, err := xA.Open(ctx, second.Export, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer exp2.Release()

	release, _ := watches.BreakAndHold()
	if err := sB.Detach(ctx, adminCaller, first.ID); err != nil {
		t.Fatal(err)
	}
	if revoked(exp1) {
		t.Fatal("revoked while the watch was broken: the test breaks nothing")
	}
	release()
	waitRevoked(t, exp1, "detached during a break")
	if revoked(exp2) {
		t.Fatal("an attachment still attached was revoked")
	}

	release, _ = watches.BreakAndHold()
	if err := sB.Detach(ctx, adminCaller, second.ID); err != nil {
		t.Fatal(err)
	}
	attached(t, sB, meta.ModeRO) // history after the deletion, so compaction removes it
	cli := e.meta.Client()
	r, err := cli.Get(ctx, "compact")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, r.Header.Revision); err != nil {
		t.Fatal(err)
	}
	release()
	waitRevoked(t, exp2, "detached during a break, history compacted")
}
