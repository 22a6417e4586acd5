package volume

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// Regression tests: a snapshot or extend that another node takes over —
// adopting it from this node, cut off from the metadata cluster after it
// recorded the workflow for itself, or failing it as the volume's write
// lease moves — answered 500 InternalError: the bare errAdopted, or
// errLeaseLost, or the other node's failure wrapped as internal. Each
// situation is foreseeable and now answered as what it is: the record as
// a delegated workflow's (202 while it runs elsewhere), a conflict
// (VolumeBusy) when the writer changed, or MetadataUnavailable when this
// node's lease lapsed.

// adoptingNode is the node the tests' adoptions move a workflow to, as
// orphans.go moves that of a node it finds gone; it runs nothing.
const adoptingNode = "adopting-node"

// TestSnapshotTakenOverWhileCutOff: this node records a snapshot for
// itself and, before freezing the volume, is found gone; the snapshot is
// adopted by another node. The call answers the snapshot as that node
// has it — creating (202), or failed because the volume's writer changed
// (409 VolumeBusy, saying to take it again) — not 500.
func TestSnapshotTakenOverWhileCutOff(t *testing.T) {
	for _, c := range []struct {
		name   string
		adopt  func(sn *meta.Snapshot, self string)
		status string
		code   string
	}{
		{"adopter takes it", func(sn *meta.Snapshot, self string) {
			sn.Node, sn.RequestedBy = adoptingNode, self
		}, meta.StatusCreating, ""},
		{"adopter fails it", func(sn *meta.Snapshot, self string) {
			sn.Status, sn.Node = meta.StatusError, ""
			sn.StatusMessage = "node " + self + ", which was taking this snapshot, is gone, and node c writes the volume now: " + staleSnapshot
		}, meta.StatusError, errs.CodeVolumeBusy},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newPrivateEnv(t)
			s := e.started(Config{})
			ctx := ctxT(t)
			alice := caller("alice")
			v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			testHookSnapshotRecorded = func(sn *meta.Snapshot) {
				e.update(func(tx *meta.Tx) error {
					cur, err := tx.Snapshot(sn.ID)
					if err != nil {
						return err
					}
					c.adopt(cur, s.cfg.Node)
					if cur.Status == meta.StatusError {
						if err := dropFromVolume(tx, cur.VolumeID, cur.ID); err != nil {
							return err
						}
					}
					tx.PutSnapshot(cur)
					return nil
				})
			}
			t.Cleanup(func() { testHookSnapshotRecorded = nil })
			sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
			testHookSnapshotRecorded = nil
			if sn == nil || sn.Status != c.status {
				t.Fatalf("snapshot taken over: %+v, %v; want status %s", sn, err, c.status)
			}
			if c.code == "" {
				if err != nil {
					t.Fatalf("snapshot being taken by the adopter: error %v, want the record (202)", err)
				}
				if sn.Node != adoptingNode {
					t.Errorf("snapshot recorded for %q, want %s", sn.Node, adoptingNode)
				}
				return
			}
			wantCode(t, err, c.code)
			if e, _ := errs.As(err); !strings.Contains(e.Message, "take it again") || !strings.Contains(e.Message, sn.ID) {
				t.Errorf("message %q: want the snapshot and what to do", e.Message)
			}
		})
	}
}

// TestSnapshotLeaseLapsedBeforeFreeze: this node records a snapshot and
// loses the volume's write lease (it could not renew it: cut off) before
// freezing the volume. The call answers 503 MetadataUnavailable saying
// the snapshot was not taken, not 500 with the lease's internal error.
func TestSnapshotLeaseLapsedBeforeFreeze(t *testing.T) {
	e := newPrivateEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	testHookSnapshotRecorded = func(sn *meta.Snapshot) {
		s.leases.mu.Lock()
		delete(s.leases.held, sn.VolumeID)
		s.leases.mu.Unlock()
	}
	t.Cleanup(func() { testHookSnapshotRecorded = nil })
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
	testHookSnapshotRecorded = nil
	wantCode(t, err, errs.CodeMetadataUnavailable)
	if e, _ := errs.As(err); !strings.Contains(e.Message, "was not taken") || !strings.Contains(e.Message, "take it again") {
		t.Errorf("message %q: want what happened and what to do", e.Message)
	}
	if sn != nil {
		t.Errorf("returned %+v with the error", sn)
	}
	// As the message says: left in error, so the volume is free for
	// another snapshot.
	list, err := s.Snapshots(ctx, alice, v.ID)
	if err != nil || len(list) != 1 || list[0].Status != meta.StatusError {
		t.Fatalf("snapshots of the volume: %+v, %v; want one, in error", list, err)
	}
	if cur := e.volume(v.ID); len(cur.Snapshotting) != 0 {
		t.Fatalf("volume still records snapshots under way %v", cur.Snapshotting)
	}
}

// TestExtendTakenOverWhileCutOff: this node records an extend for itself
// and, before taking the volume's write lease to grow it, is found gone;
// another node adopts the extend. The call answers the volume still
// extending there (202, as a delegated extend not done yet), not 500.
func TestExtendTakenOverWhileCutOff(t *testing.T) {
	e := newPrivateEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	s.leases.keyMade = func(vol string) {
		if vol == v.ID {
			once.Do(func() {
				e.editVolume(vol, func(cur *meta.Volume) { cur.Node, cur.RequestedBy = adoptingNode, s.cfg.Node })
			})
		}
	}
	out, err := s.ExtendVolume(ctx, alice, v.ID, 2<<20)
	if err != nil || out == nil || out.Status != meta.StatusExtending || out.Node != adoptingNode || out.TargetSize != 2<<20 {
		t.Fatalf("extend taken over: %+v, %v; want the volume extending on %s", out, err, adoptingNode)
	}
}

// TestDelegatedSnapshotFailsWhenLeasePassesIsConflict: a snapshot handed
// to the volume's writer fails when another node takes the write lease
// before it is taken (TestSnapshotFailsWhenLeasePasses). The call that
// handed it over answers 409 VolumeBusy with the reason, not 500.
func TestDelegatedSnapshotFailsWhenLeasePassesIsConflict(t *testing.T) {
	e := newPrivateEnv(t)
	a := e.started(Config{Node: uniq("a")})
	e.alive(a.cfg.Node)
	alice := caller("alice")
	v, _ := e.filledVolume(a, alice, 1<<20, 7)
	b, _ := e.holdingWriter(v.ID)
	_, res := e.handSnapshot(a, alice, v.ID, b)
	b.leases.unuse(ctxT(t), v.ID)
	e.noLease(v.ID, "after the writer let it go")
	c, _ := e.holdingWriter(v.ID)
	r := <-res
	if r.sn == nil || r.sn.Status != meta.StatusError {
		t.Fatalf("the create call returned %+v, %v", r.sn, r.err)
	}
	wantCode(t, r.err, errs.CodeVolumeBusy)
	if e, _ := errs.As(r.err); !strings.Contains(e.Message, c.cfg.Node) || !strings.Contains(e.Message, "take it again") {
		t.Errorf("message %q: want the new writer and what to do", e.Message)
	}
}

// TestExtendLeaseLapsedBeforeResize: this node records an extend and
// loses its lease of the metadata cluster (it could not renew it in time:
// cut off) as it takes the volume's write lease to grow it. The call
// answers 503 MetadataUnavailable saying the volume was not extended, and
// the volume is back at rest at its size, not 500 with the lease's
// internal error.
func TestExtendLeaseLapsedBeforeResize(t *testing.T) {
	e := newPrivateEnv(t)
	// Not started: no renewal loop to make the lapsed lease valid again.
	s := e.service(Config{})
	ctx := ctxT(t)
	s.leases.renew(ctx)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s.leases.keyMade = func(string) {
		s.leases.mu.Lock()
		s.leases.valid = time.Time{}
		s.leases.mu.Unlock()
	}
	out, err := s.ExtendVolume(ctx, alice, v.ID, 2<<20)
	wantCode(t, err, errs.CodeMetadataUnavailable)
	if e, _ := errs.As(err); !strings.Contains(e.Message, "was not extended") || !strings.Contains(e.Message, "retry") {
		t.Errorf("message %q: want what happened and what to do", e.Message)
	}
	if out != nil {
		t.Errorf("returned %+v with the error", out)
	}
	if cur := e.volume(v.ID); cur.Status != meta.StatusAvailable || cur.SizeBytes != 1<<20 {
		t.Fatalf("volume after the failed extend: %s, %d bytes", cur.Status, cur.SizeBytes)
	}
}
