package volume

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/cow"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestRecoverTransitions: records a node left in a transitional status —
// it died between a workflow's first transaction and its last — are driven
// to rest by that node's next Start, whatever of the data work was done;
// another node's records are left alone. Volume creates and deletes have
// one transaction and no transitional status: a node that died in one
// leaves a stack without a record, which a collection removes.
//
//	A  volume extending, resize not done        -> available, grown
//	A2 volume extending, resize done            -> available, same data
//	B  volume deleted, its stack still there    -> stack gone, images collected
//	C  volume create died building its stack    -> stack gone
//	C2 clone create died before its commit      -> stack gone, snapshot kept
//	D  volume extending, driven by another node -> untouched
//	E  snapshot deleting                        -> gone
//	F  snapshot creating, freeze not done       -> available, exact
//	G  snapshot creating, freeze done           -> available, same image
func TestRecoverTransitions(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	alice := caller("alice")
	s0 := e.started(Config{})
	base := e.provisioned()
	newVol := func(name string, size int64, model []byte, seed uint64) *meta.Volume {
		t.Helper()
		v, err := s0.CreateVolume(ctx, alice, CreateVolume{Name: name, SizeBytes: size})
		if err != nil {
			t.Fatal(err)
		}
		if model != nil {
			e.fill(s0, v.ID, model, seed, [2]int64{0, 8192}, [2]int64{size / 2, 70 << 10})
		}
		return v
	}
	// creatingSnapshot records a snapshot of volume id in progress, as
	// CreateSnapshot's first transaction does.
	creatingSnapshot := func(id, name string) *meta.Snapshot {
		t.Helper()
		t0 := now()
		sn := &meta.Snapshot{ID: newID("snap-"), Name: name, Owner: alice.Name, OwnerID: alice.ID, VolumeID: id,
			Status: meta.StatusCreating, CreatedAt: t0, UpdatedAt: t0, Node: e.node}
		e.update(func(tx *meta.Tx) error {
			v, _ := tx.Volume(id)
			if err := tx.ClaimName(meta.NameSnapshot, alice.ID, name, sn.ID); err != nil {
				return err
			}
			if err := tx.Provision(v.SizeBytes, math.MaxInt64); err != nil {
				return err
			}
			sn.SizeBytes, sn.Stack, sn.Type = v.SizeBytes, v.Stack, v.Type
			v.Snapshotting = append(v.Snapshotting, sn.ID)
			tx.PutVolume(v)
			tx.PutSnapshot(sn)
			return nil
		})
		return sn
	}

	// A: extending 1 MiB -> 4 MiB, the resize not done.
	aData := make([]byte, 1<<20)
	a := newVol("a", 1<<20, aData, 10)
	e.extending(a.ID, 4<<20, e.node)
	// A2: extending 1 MiB -> 3 MiB, the resize done (the node died before
	// its last transaction).
	a2Data := make([]byte, 1<<20)
	a2 := newVol("a2", 1<<20, a2Data, 11)
	e.extending(a2.ID, 3<<20, e.node)
	e.withStack(s0, a2.ID, func(l block.Layer) {
		if err := l.(block.Resizer).Resize(3 << 20); err != nil {
			t.Fatal(err)
		}
	})
	// B: deleted (DeleteVolume's transaction), the stack not removed.
	b := newVol("b", 1<<20, make([]byte, 1<<20), 12)
	bTop := e.top(b.ID)
	e.update(func(tx *meta.Tx) error {
		v, _ := tx.Volume(b.ID)
		tx.ReleaseName(meta.NameVolume, v.OwnerID, v.Name, v.ID)
		tx.DeleteVolume(v.ID)
		return tx.Provision(-v.SizeBytes, 0)
	})
	// C: the node died while building a new volume's stack, leaving a
	// directory with junk and no record.
	cID := newID("vol-")
	if err := os.MkdirAll(e.st.VolumeDir(cID), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.st.VolumeDir(cID), "cow.sb"), []byte("torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	// C2: a clone bigger than its snapshot, its stack built on the
	// snapshot's image, the node dead before the record's commit.
	srcData := make([]byte, 1<<20)
	src := newVol("src", 1<<20, srcData, 13)
	srcSnap, err := s0.CreateSnapshot(ctx, alice, src.ID, "srcsnap", "")
	if err != nil {
		t.Fatal(err)
	}
	c2 := &meta.Volume{ID: newID("vol-"), SizeBytes: 2 << 20, Type: srcSnap.Type, Stack: srcSnap.Stack}
	if err := s0.createStack(c2, srcSnap.Image, nil); err != nil {
		t.Fatal(err)
	}
	c2Top := e.top(c2.ID)
	// D: extending, driven by another node: not ours to finish.
	d := newVol("d", 1<<20, nil, 0)
	e.extending(d.ID, 2<<20, "some-other-node")
	// E: a snapshot left deleting.
	eSnap, err := s0.CreateSnapshot(ctx, alice, src.ID, "e", "")
	if err != nil {
		t.Fatal(err)
	}
	e.update(func(tx *meta.Tx) error {
		sn, _ := tx.Snapshot(eSnap.ID)
		tx.ReleaseName(meta.NameSnapshot, sn.OwnerID, sn.Name, sn.ID)
		sn.Status, sn.Node = meta.StatusDeleting, e.node
		tx.PutSnapshot(sn)
		return nil
	})
	// F: a snapshot creating, the freeze not done.
	fData := make([]byte, 1<<20)
	fv := newVol("fv", 1<<20, fData, 14)
	fTop := e.top(fv.ID)
	fSnap := creatingSnapshot(fv.ID, "f")
	// G: a snapshot creating, the freeze done (the cow layer knows the
	// snapshot's tag) but not recorded.
	gData := make([]byte, 1<<20)
	gv := newVol("gv", 1<<20, gData, 15)
	gSnap := creatingSnapshot(gv.ID, "g")
	var gImage string
	e.withStack(s0, gv.ID, func(l block.Layer) {
		c, ok := find[*cow.Layer](l)
		if !ok {
			t.Fatal("no cow layer in a standard stack")
		}
		if gImage, err = c.Snapshot(gSnap.ID); err != nil {
			t.Fatal(err)
		}
	})
	gChain := e.chain(gv.ID)
	s0.Stop()
	checkProvisioned(t)

	// F's and G's volumes are blocked until their snapshots exist.
	wantCode(t, s0.DeleteVolume(ctx, alice, fv.ID), errs.CodeVolumeBusy)

	// Another node's Start leaves all of it alone.
	other := e.started(Config{Node: uniq("othernode")})
	for _, id := range []string{a.ID, a2.ID} {
		if v := e.volume(id); v.Status == meta.StatusAvailable {
			t.Fatalf("another node finished volume %s: %+v", id, v)
		}
	}
	if sn := e.snapshot(eSnap.ID); sn.Status != meta.StatusDeleting {
		t.Fatalf("another node finished deleting snapshot E: %+v", sn)
	}
	for _, id := range []string{fSnap.ID, gSnap.ID} {
		if sn := e.snapshot(id); sn.Status != meta.StatusCreating || sn.Image != "" {
			t.Fatalf("another node finished snapshot %s: %+v", id, sn)
		}
	}
	other.Stop()

	s1 := e.started(Config{})

	// A: grown, data kept, zeroes after.
	av := e.volume(a.ID)
	if av.Status != meta.StatusAvailable || av.SizeBytes != 4<<20 || av.TargetSize != 0 || av.Node != "" {
		t.Fatalf("A after recovery: %+v", av)
	}
	e.sameVolume(s1, a.ID, append(aData, make([]byte, 3<<20)...), "A")
	// A2: the same, the resize not repeated.
	a2v := e.volume(a2.ID)
	if a2v.Status != meta.StatusAvailable || a2v.SizeBytes != 3<<20 || a2v.TargetSize != 0 || a2v.Node != "" {
		t.Fatalf("A2 after recovery: %+v", a2v)
	}
	e.sameVolume(s1, a2.ID, append(a2Data, make([]byte, 2<<20)...), "A2")
	// B, C, C2: their stacks removed, and the images only they used.
	for _, id := range []string{b.ID, cID, c2.ID} {
		if exists(e.st.VolumeDir(id)) {
			t.Errorf("the stack of %s (no record) survived", id)
		}
	}
	if e.hasImage(bTop) || e.hasImage(c2Top) {
		t.Error("an image of a recordless stack survived")
	}
	if !e.hasImage(srcSnap.Image) {
		t.Error("C2's snapshot lost its image")
	}
	// D: untouched.
	dv := e.volume(d.ID)
	if dv.Status != meta.StatusExtending || dv.SizeBytes != 1<<20 || dv.Node != "some-other-node" {
		t.Fatalf("another node's record was touched: %+v", dv)
	}
	// E: gone.
	if _, err := e.meta.Snapshot(ctx, eSnap.ID); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("E after recovery: %v", err)
	}
	// F: frozen now; exact; the volume released.
	fs := e.snapAvailable(fSnap.ID)
	if fs.Image != fTop {
		t.Fatalf("F froze image %s, want the volume's top %s", fs.Image, fTop)
	}
	if cur := e.volume(fv.ID); len(cur.Snapshotting) != 0 {
		t.Fatalf("F's volume still blocked: %v", cur.Snapshotting)
	}
	// G: the freeze already made is the snapshot; no second one.
	gs := e.snapAvailable(gSnap.ID)
	if gs.Image != gImage {
		t.Fatalf("G's image %s, want %s, the one its interrupted freeze made", gs.Image, gImage)
	}
	if ch := e.chain(gv.ID); !slices.Equal(ch, gChain) {
		t.Fatalf("G's volume chain %v, was %v: froze again", ch, gChain)
	}
	if cur := e.volume(gv.ID); len(cur.Snapshotting) != 0 {
		t.Fatalf("G's volume still blocked: %v", cur.Snapshotting)
	}
	for name, want := range map[string][]byte{"f": fData, "g": gData} {
		c, err := s1.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: name})
		if err != nil {
			t.Fatal(err)
		}
		e.sameVolume(s1, c.ID, want, "clone of recovered snapshot "+name)
	}
	if got := e.provisioned() - base; got < 0 {
		t.Fatalf("provisioned fell below the start: %d", got)
	}
	checkProvisioned(t)

	// Hand D back to rest so that it can be cleaned up.
	e.update(func(tx *meta.Tx) error {
		v, _ := tx.Volume(d.ID)
		v.Status, v.TargetSize, v.Node = meta.StatusAvailable, 0, ""
		tx.PutVolume(v)
		return tx.Provision(-(1 << 20), 0)
	})
	cleanupAll(t, s1, alice)
	if got := e.provisioned(); got != base {
		t.Fatalf("provisioned %d after cleanup, want %d", got, base)
	}
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("images left after cleanup: %v", imgs)
	}
}

// TestAdoptAll: a single-member cluster's node resumes every record at
// Start; any other node only its own — and after Start (the sweeps for
// stranded workflows) even the first node of a cluster runs only its own,
// since others may have joined since (they once found their imports
// failed and their exports run twice by it).
func TestAdoptAll(t *testing.T) {
	e := newEnv(t)
	if s := e.service(Config{}); !s.atStart(e.node) || s.atStart("some-other-node") || s.atStart("") {
		t.Fatal("a node resumes records that are not its own")
	}
	s := e.service(Config{AdoptAll: true})
	if !s.atStart(e.node) || !s.atStart("some-other-node") || !s.atStart("") {
		t.Fatal("AdoptAll does not resume every record at Start")
	}
	if !s.mine(e.node) || s.mine("some-other-node") || s.mine("") {
		t.Fatal("AdoptAll runs other nodes' workflows after Start")
	}
}
