package volume

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/meta"
)

// openRW attaches a fresh volume rw and returns the node's exports and the
// attachment.
func openRW(t *testing.T, s *Service) (*Exports, *meta.Attachment) {
	t.Helper()
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: uniq("v"), SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Attach(ctx, alice, v.ID, "hv1", meta.ModeRW)
	if err != nil {
		t.Fatal(err)
	}
	return s.NewExports(nil), a
}

// writersOf counts the rw exports the node keeps for volume vol.
func (x *Exports) writersOf(vol string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.writers[vol])
}

// TestExportWritersBounded: every rw open (a connection, or an INFO query
// such as nbdinfo's) is forgotten when released, so a node serving an
// attachment for months does not grow a record per connection; one still
// open is remembered, and losing the write lease revokes it.
func TestExportWritersBounded(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	x, a := openRW(t, s)

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
	select {
	case <-held.Revoked:
	default:
		t.Fatal("losing the write lease did not revoke the open export")
	}
	held.Release()
	if n := x.writersOf(a.VolumeID); n != 0 {
		t.Fatalf("%d writers recorded after all were released", n)
	}
}
