package volume

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestRecoverSnapshotJob: a node stops in the middle of a snapshot copy; a
// new service of the same node, on the same metadata and store, finishes it.
func TestRecoverSnapshotJob(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	alice := caller("alice")
	s1 := e.started(Config{JobBandwidth: 1 << 20})
	v, err := s1.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	want := e.fill(v.ID, 30, [2]int64{0, 8 << 20}, [2]int64{30 << 20, 4096})
	sn, err := s1.CreateSnapshot(ctx, alice, v.ID, "rec", "")
	if err != nil {
		t.Fatal(err)
	}
	tmp := e.st.TempPath(e.st.SnapshotPath(sn.ID))
	e.waitFile(tmp) // the copy is under way (8 MiB at 1 MiB/s)
	s1.Stop()

	// Interrupted: the record stays creating with its job; no final file,
	// no partial file.
	rec, err := e.meta.Snapshot(ctx, sn.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != meta.StatusCreating || rec.Job == nil || rec.Job.Attempts != 0 || rec.Node != e.node {
		t.Fatalf("interrupted snapshot record: %+v", rec)
	}
	if e.st.Exists(e.st.SnapshotPath(sn.ID)) || e.st.Exists(tmp) {
		t.Fatal("interrupted copy left a file")
	}
	if cur, _ := e.meta.Volume(ctx, v.ID); !slices.Contains(cur.Snapshotting, sn.ID) {
		t.Fatal("volume forgot the snapshot in progress")
	}

	// Another node's Start leaves it alone.
	e.started(Config{Node: uniq("othernode")})
	if rec, _ := e.meta.Snapshot(ctx, sn.ID); rec.Status != meta.StatusCreating || rec.Job.Attempts != 0 {
		t.Fatalf("another node adopted the job: %+v", rec)
	}

	// The same node, restarted: resumes and finishes.
	s2 := e.started(Config{})
	rec = e.waitSnapshot(sn.ID, meta.StatusAvailable, meta.StatusError)
	if rec.Status != meta.StatusAvailable || rec.Job != nil || rec.Node != "" {
		t.Fatalf("recovered snapshot: %+v", rec)
	}
	if got := e.read(e.st.SnapshotPath(sn.ID)); !sameBytes(got, want) {
		t.Fatal("recovered snapshot content differs from the volume")
	}
	if cur, _ := e.meta.Volume(ctx, v.ID); len(cur.Snapshotting) != 0 {
		t.Fatalf("volume still lists snapshots in progress: %v", cur.Snapshotting)
	}
	cleanupAll(t, s2, alice)
	checkProvisioned(t)
}

// TestRecoverCloneJob: the same for a clone, including the resize of a
// clone bigger than its snapshot.
func TestRecoverCloneJob(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	alice := caller("alice")
	s0 := e.started(Config{})
	v, err := s0.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	want := e.fill(v.ID, 40, [2]int64{1 << 20, 8 << 20})
	sn, err := s0.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	e.waitSnapshot(sn.ID, meta.StatusAvailable)
	s0.Stop()

	s1 := e.started(Config{JobBandwidth: 1 << 20})
	c, err := s1.CreateVolume(ctx, alice, CreateVolume{Name: "clone", FromSnapshot: sn.ID, SizeBytes: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	tmp := e.st.TempPath(e.st.VolumePath(c.ID))
	e.waitFile(tmp)
	s1.Stop()
	rec, _ := e.meta.Volume(ctx, c.ID)
	if rec.Status != meta.StatusCreating || rec.Job == nil || rec.Job.Kind != meta.JobClone {
		t.Fatalf("interrupted clone record: %+v", rec)
	}
	if e.st.Exists(e.st.VolumePath(c.ID)) || e.st.Exists(tmp) {
		t.Fatal("interrupted clone left a file")
	}
	if snap, _ := e.meta.Snapshot(ctx, sn.ID); !slices.Contains(snap.Cloning, c.ID) {
		t.Fatal("snapshot forgot the clone in progress")
	}

	s2 := e.service(Config{})
	wantCode(t, s2.DeleteSnapshot(ctx, alice, sn.ID), errs.CodeSnapshotInUse)
	if err := s2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rec = e.waitVolume(c.ID, meta.StatusAvailable, meta.StatusError)
	if rec.Status != meta.StatusAvailable || rec.Job != nil || rec.SizeBytes != 32<<20 {
		t.Fatalf("recovered clone: %+v", rec)
	}
	got := e.read(e.st.VolumePath(c.ID))
	if len(got) != 32<<20 || !sameBytes(got[:16<<20], want) || !allZero(got[16<<20:]) {
		t.Fatal("recovered clone content is wrong")
	}
	if snap, _ := e.meta.Snapshot(ctx, sn.ID); len(snap.Cloning) != 0 {
		t.Fatalf("snapshot still pinned by %v", snap.Cloning)
	}
	if v, err := s2.Volume(ctx, alice, "clone"); err != nil || v.ID != c.ID {
		t.Fatalf("recovered clone by name: %v", err)
	}
	cleanupAll(t, s2, alice)
	checkProvisioned(t)
}

// TestRecoverTransitions: records left in creating (no job), extending and
// deleting by a node that died between its two transactions are driven to
// rest by that node's next Start; another node's records are left alone.
func TestRecoverTransitions(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	alice := caller("alice")
	s0 := e.started(Config{})
	base := e.provisioned()

	update := func(fn func(tx *meta.Tx) error) {
		t.Helper()
		if err := e.meta.Update(ctx, fn); err != nil {
			t.Fatal(err)
		}
	}
	// A: extending 1 MiB -> 4 MiB (first transaction done, resize not).
	a, err := s0.CreateVolume(ctx, alice, CreateVolume{Name: "a", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	aData := e.fill(a.ID, 50, [2]int64{0, 4096})
	// E: a snapshot (of A, before A starts extending) left deleting.
	sn, err := s0.CreateSnapshot(ctx, alice, a.ID, "e", "")
	if err != nil {
		t.Fatal(err)
	}
	e.waitSnapshot(sn.ID, meta.StatusAvailable)
	update(func(tx *meta.Tx) error {
		s, _ := tx.Snapshot(sn.ID)
		tx.ReleaseName(meta.NameSnapshot, s.OwnerID, s.Name, s.ID)
		s.Status, s.Node = meta.StatusDeleting, e.node
		tx.PutSnapshot(s)
		return nil
	})
	update(func(tx *meta.Tx) error {
		v, _ := tx.Volume(a.ID)
		v.Status, v.TargetSize, v.Node = meta.StatusExtending, 4<<20, e.node
		tx.PutVolume(v)
		return tx.Provision(3<<20, math.MaxInt64)
	})
	// B: deleting (name released, file still there).
	b, err := s0.CreateVolume(ctx, alice, CreateVolume{Name: "b", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	update(func(tx *meta.Tx) error {
		v, _ := tx.Volume(b.ID)
		tx.ReleaseName(meta.NameVolume, v.OwnerID, v.Name, v.ID)
		v.Status, v.Node = meta.StatusDeleting, e.node
		tx.PutVolume(v)
		return nil
	})
	// C: creating, no job, no file yet.
	cID := newID("vol-")
	update(func(tx *meta.Tx) error {
		if err := tx.ClaimName(meta.NameVolume, alice.ID, "c", cID); err != nil {
			return err
		}
		t0 := now()
		tx.PutVolume(&meta.Volume{ID: cID, Name: "c", Owner: alice.Name, OwnerID: alice.ID, SizeBytes: 2 << 20,
			Status: meta.StatusCreating, Type: "standard", CreatedAt: t0, UpdatedAt: t0, Node: e.node})
		return tx.Provision(2<<20, math.MaxInt64)
	})
	// D: extending, but driven by another node: not ours to finish.
	d, err := s0.CreateVolume(ctx, alice, CreateVolume{Name: "d", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	update(func(tx *meta.Tx) error {
		v, _ := tx.Volume(d.ID)
		v.Status, v.TargetSize, v.Node = meta.StatusExtending, 2<<20, "some-other-node"
		tx.PutVolume(v)
		return tx.Provision(1<<20, math.MaxInt64)
	})
	s0.Stop()
	checkProvisioned(t)

	s1 := e.started(Config{})

	av, err := e.meta.Volume(ctx, a.ID)
	if err != nil || av.Status != meta.StatusAvailable || av.SizeBytes != 4<<20 || av.TargetSize != 0 || av.Node != "" {
		t.Fatalf("A after recovery: %+v, %v", av, err)
	}
	if got := e.read(e.st.VolumePath(a.ID)); len(got) != 4<<20 || !sameBytes(got[:1<<20], aData) {
		t.Fatal("A's file was not extended or lost data")
	}
	if _, err := e.meta.Volume(ctx, b.ID); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("B after recovery: %v", err)
	}
	if e.st.Exists(e.st.VolumePath(b.ID)) {
		t.Fatal("B's file survived")
	}
	cv, err := e.meta.Volume(ctx, cID)
	if err != nil || cv.Status != meta.StatusAvailable || cv.Node != "" {
		t.Fatalf("C after recovery: %+v, %v", cv, err)
	}
	if n, _ := statSize(e.st.VolumePath(cID)); n != 2<<20 {
		t.Fatalf("C's file is %d bytes", n)
	}
	if got, err := s1.Volume(ctx, alice, "c"); err != nil || got.ID != cID {
		t.Fatalf("C by name: %v", err)
	}
	dv, _ := e.meta.Volume(ctx, d.ID)
	if dv.Status != meta.StatusExtending || dv.SizeBytes != 1<<20 || dv.Node != "some-other-node" {
		t.Fatalf("another node's record was touched: %+v", dv)
	}
	if _, err := e.meta.Snapshot(ctx, sn.ID); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("E after recovery: %v", err)
	}
	if e.st.Exists(e.st.SnapshotPath(sn.ID)) {
		t.Fatal("E's file survived")
	}
	wantProv := base + 4<<20 + 2<<20 + 2<<20 // A, C, D (with its target)
	if got := e.provisioned(); got != wantProv {
		t.Fatalf("provisioned %d after recovery, want %d", got, wantProv)
	}
	checkProvisioned(t)

	// Hand D back to rest so that it can be cleaned up.
	update(func(tx *meta.Tx) error {
		v, _ := tx.Volume(d.ID)
		v.Status, v.TargetSize, v.Node = meta.StatusAvailable, 0, ""
		tx.PutVolume(v)
		return tx.Provision(-(1 << 20), 0)
	})
	cleanupAll(t, s1, alice)
	if got := e.provisioned(); got != base {
		t.Fatalf("provisioned %d after cleanup, want %d", got, base)
	}
}

// TestRecoverGivesUp: a snapshot copy interrupted more than maxJobAttempts
// times ends in error with a message, releases its volume, and can be
// deleted.
func TestRecoverGivesUp(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	alice := caller("alice")
	slow := Config{JobBandwidth: 256 << 10}
	s := e.started(slow)
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e.fill(v.ID, 60, [2]int64{0, 8 << 20})
	base := e.provisioned()
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "doomed", "")
	if err != nil {
		t.Fatal(err)
	}
	tmp := e.st.TempPath(e.st.SnapshotPath(sn.ID))
	e.waitFile(tmp)
	s.Stop()

	for i := 1; i <= maxJobAttempts; i++ {
		s := e.started(slow)
		rec, _ := e.meta.Snapshot(ctx, sn.ID)
		if rec.Status != meta.StatusCreating || rec.Job == nil || rec.Job.Attempts != i {
			t.Fatalf("after restart %d: %+v (job %+v)", i, rec, rec.Job)
		}
		e.waitFile(tmp)
		s.Stop()
	}
	last := e.started(slow)
	rec, err := e.meta.Snapshot(ctx, sn.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != meta.StatusError || rec.Job != nil || rec.Node != "" {
		t.Fatalf("after %d interruptions: %+v", maxJobAttempts+1, rec)
	}
	if !strings.Contains(rec.StatusMessage, "interrupted") {
		t.Fatalf("status message %q does not say why", rec.StatusMessage)
	}
	if e.st.Exists(e.st.SnapshotPath(sn.ID)) || e.st.Exists(tmp) {
		t.Fatal("failed snapshot left files")
	}
	if cur, _ := e.meta.Volume(ctx, v.ID); len(cur.Snapshotting) != 0 {
		t.Fatalf("failed snapshot still blocks its volume: %v", cur.Snapshotting)
	}
	// The failed snapshot still counts until deleted; then it is gone.
	if got := e.provisioned() - base; got != 16<<20 {
		t.Fatalf("failed snapshot holds %d provisioned bytes, want %d", got, 16<<20)
	}
	if err := last.DeleteSnapshot(ctx, alice, "doomed"); err != nil {
		t.Fatalf("delete a failed snapshot: %v", err)
	}
	if got := e.provisioned(); got != base {
		t.Fatalf("provisioned %d, want %d", got, base)
	}
	// The volume is usable again.
	if _, err := last.ExtendVolume(ctx, alice, v.ID, 32<<20); err != nil {
		t.Fatal(err)
	}
	cleanupAll(t, last, alice)
	checkProvisioned(t)
}

// TestRecoverCloneGivesUp: a clone whose job has used up its attempts is
// failed at the next Start, and its snapshot is no longer pinned.
func TestRecoverCloneGivesUp(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	alice := caller("alice")
	s0 := e.started(Config{})
	v, err := s0.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e.fill(v.ID, 70, [2]int64{0, 4 << 20})
	sn, err := s0.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	e.waitSnapshot(sn.ID, meta.StatusAvailable)
	s0.Stop()
	s1 := e.started(Config{JobBandwidth: 256 << 10})
	c, err := s1.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	s1.Stop()
	if err := e.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, _ := tx.Volume(c.ID)
		cur.Job.Attempts = maxJobAttempts
		tx.PutVolume(cur)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s2 := e.started(Config{})
	rec, _ := e.meta.Volume(ctx, c.ID)
	if rec.Status != meta.StatusError || rec.Job != nil || !strings.Contains(rec.StatusMessage, "interrupted") {
		t.Fatalf("clone after its last attempt: %+v", rec)
	}
	if snap, _ := e.meta.Snapshot(ctx, sn.ID); len(snap.Cloning) != 0 {
		t.Fatalf("failed clone still pins its snapshot: %v", snap.Cloning)
	}
	if e.st.Exists(e.st.VolumePath(c.ID)) {
		t.Fatal("failed clone has a data file")
	}
	// Both can be deleted.
	if err := s2.DeleteSnapshot(ctx, alice, sn.ID); err != nil {
		t.Fatal(err)
	}
	if err := s2.DeleteVolume(ctx, alice, c.ID); err != nil {
		t.Fatalf("delete a failed clone: %v", err)
	}
	cleanupAll(t, s2, alice)
	checkProvisioned(t)
}
