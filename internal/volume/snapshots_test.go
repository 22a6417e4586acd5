package volume

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/cow"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestSnapshotAndClone: a snapshot holds exactly the volume's bytes when
// it was taken; later writes to the volume do not reach it; clones read
// exactly the snapshot's bytes and are independent of it and of each
// other; volume, snapshot and clones can be deleted in any order, and the
// images nothing needs any more are collected.
func TestSnapshotAndClone(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	base := e.provisioned()
	const size = 4 << 20
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "src", SizeBytes: size})
	if err != nil {
		t.Fatal(err)
	}
	a := make([]byte, size) // A: the volume when the snapshot is taken
	e.fill(s, v.ID, a, 1, [2]int64{0, 4096}, [2]int64{2 << 20, 1<<20 + 512}, [2]int64{size - 512, 512})
	topBefore := e.top(v.ID)

	sn, err := s.CreateSnapshot(ctx, alice, "src", "s1", "")
	if err != nil {
		t.Fatal(err)
	}
	// Synchronous: available at once, naming the image that was the
	// volume's top; the volume writes a new top on it.
	if sn.Status != meta.StatusAvailable || sn.Node != "" || sn.SizeBytes != size || sn.VolumeID != v.ID ||
		sn.OwnerID != alice.ID || !snapshotIDRE.MatchString(sn.ID) || sn.Type != "standard" || !sameBytes(sn.Stack, v.Stack) {
		t.Fatalf("snapshot record %+v", sn)
	}
	if sn.Image != topBefore {
		t.Fatalf("snapshot image %s, want the volume's top before it, %s", sn.Image, topBefore)
	}
	e.snapAvailable(sn.ID)
	if ch := e.chain(v.ID); len(ch) != 2 || ch[1] != sn.Image {
		t.Fatalf("volume chain after the snapshot: %v", ch)
	}
	if im, err := cow.ReadImage(e.st.ImagesDir(), e.top(v.ID)); err != nil || im.Tag != sn.ID {
		t.Fatalf("new top %+v does not carry the snapshot's tag: %v", im, err)
	}
	if cur := e.volume(v.ID); len(cur.Snapshotting) != 0 || cur.Status != meta.StatusAvailable {
		t.Fatalf("volume after snapshot: %+v", cur)
	}
	if got := e.provisioned() - base; got != 2*size {
		t.Fatalf("provisioned grew by %d, want volume + snapshot = %d", got, 2*size)
	}
	e.sameVolume(s, v.ID, a, "volume right after its snapshot")

	// B: the volume after more writes, over old data and into holes.
	b := slices.Clone(a)
	e.fill(s, v.ID, b, 2, [2]int64{0, 8192}, [2]int64{2<<20 + 100<<10, 4096}, [2]int64{3<<20 + 512, 64 << 10})
	if sameBytes(a, b) {
		t.Fatal("test bug: the second fill changed nothing")
	}
	e.sameVolume(s, v.ID, b, "volume after writes")

	// Clone at the snapshot's size (size 0 = the snapshot's), by name: A.
	c1, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "clone1", FromSnapshot: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if c1.Status != meta.StatusAvailable || c1.SourceSnapshot != sn.ID || c1.SizeBytes != size ||
		c1.Type != "standard" || !sameBytes(c1.Stack, sn.Stack) || c1.Node != "" {
		t.Fatalf("clone record %+v", c1)
	}
	if ch := e.chain(c1.ID); len(ch) != 2 || ch[1] != sn.Image {
		t.Fatalf("clone chain %v, want a new top on %s", ch, sn.Image)
	}
	e.sameVolume(s, c1.ID, a, "clone")
	// Clone bigger: the snapshot's bytes, then zeroes.
	c2, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID, SizeBytes: 2 * size})
	if err != nil {
		t.Fatal(err)
	}
	if c2.Status != meta.StatusAvailable || c2.SizeBytes != 2*size {
		t.Fatalf("bigger clone: %+v", c2)
	}
	e.sameVolume(s, c2.ID, append(slices.Clone(a), make([]byte, size)...), "bigger clone")
	// It takes writes across the snapshot's end.
	a2 := append(slices.Clone(a), make([]byte, size)...)
	e.fill(s, c2.ID, a2, 3, [2]int64{size - 4096, 8192})
	e.sameVolume(s, c2.ID, a2, "bigger clone after a write across the old end")
	// Clone smaller than the snapshot, or of another type: refused.
	_, err = s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID, SizeBytes: size / 2})
	wantCode(t, err, errs.CodeInvalidSize)
	_, err = s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID, Type: "striped"})
	wantCode(t, err, errs.CodeInvalidRequest)
	// Naming the snapshot's own type is fine.
	c3, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID, Type: "standard"})
	if err != nil {
		t.Fatal(err)
	}

	// Clones are independent of their snapshot, of each other and of the
	// source volume.
	c1Data := slices.Clone(a)
	e.fill(s, c1.ID, c1Data, 4, [2]int64{0, 4096}, [2]int64{3<<20 + 8192, 4096})
	e.sameVolume(s, c1.ID, c1Data, "clone after its own writes")
	e.sameVolume(s, c3.ID, a, "a clone after another clone was written")
	e.sameVolume(s, v.ID, b, "the volume after its clone was written")

	// Lists.
	if list, err := s.Snapshots(ctx, alice, "src"); err != nil || len(list) != 1 || list[0].ID != sn.ID {
		t.Fatalf("Snapshots of src: %v, %v", list, err)
	}
	if list, _ := s.Snapshots(ctx, alice, c1.ID); len(list) != 0 {
		t.Fatalf("Snapshots of a clone: %v", list)
	}

	// Delete the source volume first: its own top goes, the snapshot's
	// image stays, and new clones of the snapshot still read A.
	srcTop := e.top(v.ID)
	if err := s.DeleteVolume(ctx, alice, v.ID); err != nil {
		t.Fatal(err)
	}
	if e.hasImage(srcTop) {
		t.Fatal("the deleted volume's top image was not collected")
	}
	e.wantImages(s, []string{c1.ID, c2.ID, c3.ID}, []string{sn.ID})
	c4, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	e.sameVolume(s, c4.ID, a, "clone made after its source volume was deleted")

	// Then the snapshot, though clones of it exist: they keep its image.
	if err := s.DeleteSnapshot(ctx, alice, "s1"); err != nil {
		t.Fatalf("delete a snapshot with finished clones: %v", err)
	}
	if _, err := s.Snapshot(ctx, alice, "s1"); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("deleted snapshot by name: %v", err)
	}
	wantCode(t, s.DeleteSnapshot(ctx, alice, sn.ID), errs.CodeNotFound)
	if !e.hasImage(sn.Image) {
		t.Fatal("the image of a deleted snapshot was collected while clones read it")
	}
	e.wantImages(s, []string{c1.ID, c2.ID, c3.ID, c4.ID}, nil)
	e.sameVolume(s, c1.ID, c1Data, "clone after its snapshot was deleted")
	e.sameVolume(s, c2.ID, a2, "bigger clone after its snapshot was deleted")
	e.sameVolume(s, c4.ID, a, "late clone after its snapshot was deleted")

	// Deleting the clones one by one: the shared image lives until the
	// last one goes.
	for i, c := range []string{c1.ID, c2.ID, c3.ID} {
		if err := s.DeleteVolume(ctx, alice, c); err != nil {
			t.Fatal(err)
		}
		if !e.hasImage(sn.Image) {
			t.Fatalf("shared image collected after deleting clone %d of 4", i+1)
		}
	}
	e.sameVolume(s, c4.ID, a, "the last clone")
	if err := s.DeleteVolume(ctx, alice, c4.ID); err != nil {
		t.Fatal(err)
	}
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("images left after deleting everything: %v", imgs)
	}
	if entries, _ := os.ReadDir(e.st.TempDir()); len(entries) != 0 {
		t.Fatalf("tmp holds %v", entries)
	}
	if got := e.provisioned(); got != base {
		t.Fatalf("provisioned %d after deleting everything, want %d", got, base)
	}
	checkProvisioned(t)
}

// TestSnapshotChain: several snapshots of one volume, each after more
// writes, each hold their own point in time; the volume holds the latest;
// snapshots and clones of clones work; deleting snapshots in any order
// keeps what the others and the volume need.
func TestSnapshotChain(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	const size = 2 << 20
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: size})
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, size)
	var snaps []*meta.Snapshot
	var states [][]byte
	for i := range 4 {
		// Each generation overwrites a shared chunk and adds one of its own.
		e.fill(s, v.ID, model, uint64(10+i), [2]int64{4096, 512}, [2]int64{int64(i) * 256 << 10, 100 << 10})
		sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
		if err != nil {
			t.Fatal(err)
		}
		snaps, states = append(snaps, sn), append(states, slices.Clone(model))
	}
	e.fill(s, v.ID, model, 99, [2]int64{0, size})
	if n := len(e.chain(v.ID)); n != 5 {
		t.Fatalf("volume chain of %d images after 4 snapshots", n)
	}
	var clones []string
	for i, sn := range snaps {
		c, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
		if err != nil {
			t.Fatal(err)
		}
		clones = append(clones, c.ID)
		e.sameVolume(s, c.ID, states[i], "clone of snapshot "+string(rune('0'+i)))
	}
	e.sameVolume(s, v.ID, model, "volume after 4 snapshots")

	// A snapshot of a clone, and a clone of that.
	cm := slices.Clone(states[2])
	e.fill(s, clones[2], cm, 50, [2]int64{1 << 20, 4096})
	sc, err := s.CreateSnapshot(ctx, alice, clones[2], "", "")
	if err != nil {
		t.Fatal(err)
	}
	e.fill(s, clones[2], nil, 51, [2]int64{1 << 20, 4096})
	cc, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sc.ID})
	if err != nil {
		t.Fatal(err)
	}
	e.sameVolume(s, cc.ID, cm, "clone of a clone's snapshot")

	// Delete the snapshots from the middle outwards; after each, the
	// images every remaining reader needs are all there, and no others.
	for k, i := range []int{2, 0, 3, 1} {
		if err := s.DeleteSnapshot(ctx, alice, snaps[i].ID); err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, j := range []int{2, 0, 3, 1}[k+1:] {
			left = append(left, snaps[j].ID)
		}
		e.wantImages(s, append([]string{v.ID, cc.ID}, clones...), append(left, sc.ID))
	}
	for j, c := range clones {
		if j != 2 {
			e.sameVolume(s, c, states[j], "clone after deleting every snapshot")
		}
	}
	e.sameVolume(s, v.ID, model, "volume after deleting every snapshot")
	e.sameVolume(s, cc.ID, cm, "clone of a clone's snapshot, at the end")
	e.wantImages(s, append([]string{v.ID, cc.ID}, clones...), []string{sc.ID})
	cleanupAll(t, s, alice)
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("images left after deleting everything: %v", imgs)
	}
	checkProvisioned(t)
}

// TestSnapshotCopiesNothing: a snapshot of a 10 GiB volume holding some
// data, and a clone of it, copy no data: across every image, the data
// files hold what was written and nothing more; a later write copies up
// one chunk only.
func TestSnapshotCopiesNothing(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	const size = 10 << 30
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: size})
	if err != nil {
		t.Fatal(err)
	}
	exts := [][2]int64{{0, 1 << 20}, {5 << 30, 2 << 20}, {size - 1<<20, 1 << 20}}
	var written int64
	for _, x := range exts {
		written += x[1]
	}
	e.fill(s, v.ID, nil, 1, exts...)
	total := func() int64 {
		var n int64
		for _, f := range e.dataFiles() {
			n += allocated(t, f)
		}
		return n
	}
	before := total()
	if before < written || before > written+256<<10 {
		t.Fatalf("%d bytes written take %d bytes of data files", written, before)
	}

	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := total(); got != before {
		t.Fatalf("snapshot and clone changed the data files' allocation from %d to %d bytes: data was copied", before, got)
	}
	if n := len(e.images()); n != 3 {
		t.Fatalf("%d images, want the frozen one and two empty tops", n)
	}
	for _, top := range []string{e.top(v.ID), e.top(c.ID)} {
		f := filepath.Join(e.st.ImagesDir(), top, "data.img")
		if n, _ := statSize(f); n != size {
			t.Fatalf("top %s data file is %d bytes, want %d", top, n, size)
		}
		if a := allocated(t, f); a != 0 {
			t.Fatalf("new top %s already holds %d bytes", top, a)
		}
	}
	// A 4 KiB write into a frozen chunk copies up that one chunk.
	e.fill(s, v.ID, nil, 2, [2]int64{5<<30 + 8192, 4096})
	if a := allocated(t, filepath.Join(e.st.ImagesDir(), e.top(v.ID), "data.img")); a < cow.DefaultChunk || a > cow.DefaultChunk+16<<10 {
		t.Fatalf("a 4 KiB write into a frozen chunk allocated %d bytes in the top, want one %d-byte chunk", a, cow.DefaultChunk)
	}
	want := pattern(1+7919, 2<<20)
	copy(want[8192:], pattern(2, 4096))
	if got := e.readAt(s, v.ID, 5<<30, 2<<20); !sameBytes(got, want) {
		t.Fatal("volume after the copy-up write is wrong")
	}
	if got := e.readAt(s, c.ID, 5<<30, 2<<20); !sameBytes(got, pattern(1+7919, 2<<20)) {
		t.Fatal("clone reads the volume's later write")
	}
	cleanupAll(t, s, alice)
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("images left after deleting everything: %v", imgs)
	}
	checkProvisioned(t)
}

// splitLayer is a test layer that writes in two halves with a pause in
// between, as layers that keep data and metadata apart (checksum, crypt)
// write through the cow layer below them: only the volume's gate keeps a
// snapshot from landing between the halves.
type splitLayer struct{ block.Layer }

func (l splitLayer) WriteAt(p []byte, off int64, fua bool) error {
	h := len(p) / 2
	if err := l.Layer.WriteAt(p[:h], off, fua); err != nil {
		return err
	}
	time.Sleep(50 * time.Microsecond)
	return l.Layer.WriteAt(p[h:], off+int64(h), fua)
}

func (l splitLayer) Children() []block.Layer { return []block.Layer{l.Layer} }

func init() {
	registerWrapper("testsplit", "writes in two halves", func(c block.Layer) block.Layer { return splitLayer{c} })
}

// TestSnapshotPointInTime: a snapshot holds exactly the writes acknowledged
// before CreateSnapshot was called and none issued after it returned, with
// a writer running throughout. The writer goes through the gated device of
// the NBD path (the volume's gate, read side); each write sets a whole
// chunk to its generation number, so a torn write would show too. On the
// standard stack the cow layer's own chain lock would suffice; on a stack
// whose top layer splits writes (testsplit) only the gate does.
func TestSnapshotPointInTime(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	split := uniq("split")
	if _, err := s.CreateVolumeType(ctxT(t), split, "", json.RawMessage(`{"type":"testsplit","children":[{"type":"cow","children":[`+fileLeaf+`]}]}`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.DeleteVolumeType(context.Background(), split) })
	for _, typ := range []string{"standard", split} {
		t.Run(typ, func(t *testing.T) { testPointInTime(t, e, s, typ) })
	}
}

func testPointInTime(t *testing.T, e *env, s *Service, typ string) {
	e = &env{t: t, meta: e.meta, st: e.st, node: e.node} // helpers fail this subtest
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20, Type: typ})
	if err != nil {
		t.Fatal(err)
	}
	// As an rw attachment's connection: the attachment (which takes the
	// write lease here), then the gated live stack.
	att, err := s.Attach(ctx, alice, v.ID, "host", meta.ModeRW)
	if err != nil {
		t.Fatal(err)
	}
	l, release, err := s.acquireWritable(e.volume(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	gate, drop := s.gate(v.ID)
	defer drop()
	d := &gated{Device: l, gate: gate}
	var issued, acked atomic.Uint64 // generation last started, last returned
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 64<<10)
		for gen := uint64(1); ; gen++ {
			select {
			case <-stop:
				return
			default:
			}
			binary.LittleEndian.PutUint64(buf, gen)
			for n := 8; n < len(buf); n *= 2 {
				copy(buf[n:], buf[:n])
			}
			issued.Store(gen)
			if err := d.WriteAt(buf, 0, false); err != nil {
				t.Error(err)
				return
			}
			acked.Store(gen)
			time.Sleep(20 * time.Microsecond)
		}
	}()
	for acked.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	type taken struct {
		sn     *meta.Snapshot
		lo, hi uint64
	}
	var snaps []taken
	for range 3 {
		lo := acked.Load()
		sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
		hi := issued.Load()
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, taken{sn, lo, hi})
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	release()
	if err := s.Detach(ctx, alice, att.ID); err != nil {
		t.Fatal(err)
	}
	for i, x := range snaps {
		c, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: x.sn.ID})
		if err != nil {
			t.Fatal(err)
		}
		got := e.readAt(s, c.ID, 0, 64<<10)
		gen := binary.LittleEndian.Uint64(got)
		for j := 0; j < len(got); j += 8 {
			if g := binary.LittleEndian.Uint64(got[j:]); g != gen {
				t.Fatalf("snapshot %d holds a torn write: generation %d at byte %d, %d at byte 0", i, g, j, gen)
			}
		}
		if gen < x.lo || gen > x.hi {
			t.Errorf("snapshot %d holds generation %d; %d was acknowledged before the call, %d the last issued when it returned", i, gen, x.lo, x.hi)
		}
	}
	cleanupAll(t, s, alice)
}

// TestConcurrentSnapshots: snapshots of one volume requested at once are
// taken one after another (the volume's gate), each freezing its own image.
func TestConcurrentSnapshots(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, model := e.filledVolume(s, alice, 1<<20, 5)
	const n = 6
	out := make([]*meta.Snapshot, n)
	errsOut := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errsOut[i] = s.CreateSnapshot(ctx, alice, v.ID, "", "")
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range n {
		if errsOut[i] != nil {
			t.Fatalf("snapshot %d: %v", i, errsOut[i])
		}
		sn := e.snapAvailable(out[i].ID)
		if seen[sn.Image] {
			t.Fatalf("two snapshots share image %s", sn.Image)
		}
		seen[sn.Image] = true
	}
	if ch := e.chain(v.ID); len(ch) != n+1 {
		t.Fatalf("chain of %d images after %d snapshots", len(ch), n)
	}
	if cur := e.volume(v.ID); len(cur.Snapshotting) != 0 || cur.Status != meta.StatusAvailable {
		t.Fatalf("volume after concurrent snapshots: %+v", cur)
	}
	c, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: out[n/2].ID})
	if err != nil {
		t.Fatal(err)
	}
	e.sameVolume(s, c.ID, model, "clone of one of the concurrent snapshots")
	cleanupAll(t, s, alice)
	checkProvisioned(t)
}

// TestSnapshotBusyRules: while a snapshot is being taken (recorded in the
// volume's Snapshotting) the volume may not be extended, deleted or
// snapshotted again; while a clone is being created the snapshot may not
// be deleted; a snapshot not yet available may be neither cloned nor
// deleted. The states are crafted in the records (the real window is
// inside one call).
func TestSnapshotBusyRules(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	// A snapshot in progress, driven by a node that is not this one.
	e.update(func(tx *meta.Tx) error {
		cur, _ := tx.Volume(v.ID)
		cur.Snapshotting = []string{"snap-00000000000000aa"}
		tx.PutVolume(cur)
		s2, _ := tx.Snapshot(sn.ID)
		s2.Status = meta.StatusCreating
		tx.PutSnapshot(s2)
		return nil
	})
	_, err = s.ExtendVolume(ctx, alice, v.ID, 2<<20)
	wantCode(t, err, errs.CodeVolumeBusy)
	wantCode(t, s.DeleteVolume(ctx, alice, v.ID), errs.CodeVolumeBusy)
	_, err = s.CreateSnapshot(ctx, alice, v.ID, "", "")
	wantCode(t, err, errs.CodeVolumeBusy)
	wantCode(t, s.DeleteSnapshot(ctx, alice, sn.ID), errs.CodeSnapshotNotReady)
	_, err = s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
	wantCode(t, err, errs.CodeSnapshotNotReady)
	if n := len(e.chain(v.ID)); n != 2 {
		t.Fatalf("refused snapshot changed the chain to %d images", n)
	}
	e.update(func(tx *meta.Tx) error {
		cur, _ := tx.Volume(v.ID)
		cur.Snapshotting = nil
		tx.PutVolume(cur)
		s2, _ := tx.Snapshot(sn.ID)
		s2.Status = meta.StatusAvailable
		tx.PutSnapshot(s2)
		return nil
	})
	// At rest everything is allowed again.
	if _, err := s.ExtendVolume(ctx, alice, v.ID, 2<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSnapshot(ctx, alice, v.ID, "", ""); err != nil {
		t.Fatal(err)
	}
	cleanupAll(t, s, alice)
	checkProvisioned(t)
}

// TestWorkflowFailures: data work that fails leaves records at rest with a
// message, never transitional, and keeps the provisioning counter right.
func TestWorkflowFailures(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	base := e.provisioned()

	// Extend of a volume whose data file vanished: back to available at
	// the old size, with a message, and the reserved bytes are given back.
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "lost", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(e.st.ImagesDir(), e.top(v.ID), "data.img")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ExtendVolume(ctx, alice, v.ID, 2<<20); err == nil {
		t.Fatal("extend of a volume without a data file succeeded")
	}
	cur := e.volume(v.ID)
	if cur.Status != meta.StatusAvailable || cur.SizeBytes != 1<<20 || cur.TargetSize != 0 || cur.StatusMessage == "" || cur.Node != "" {
		t.Fatalf("after a failed extend: %+v", cur)
	}
	if got := e.provisioned() - base; got != 1<<20 {
		t.Fatalf("failed extend kept %d extra provisioned bytes", got-(1<<20))
	}
	checkProvisioned(t)

	// Snapshot of that volume: the freeze fails; the snapshot ends in
	// error with a message and no longer blocks the volume.
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err == nil {
		t.Fatal("snapshot of a volume without a data file succeeded")
	}
	snaps, _ := s.Snapshots(ctx, alice, v.ID)
	if sn != nil || len(snaps) != 1 {
		t.Fatalf("failed snapshot: returned %+v, %d records", sn, len(snaps))
	}
	rec := snaps[0]
	if rec.Status != meta.StatusError || rec.StatusMessage == "" || rec.Node != "" || rec.Image != "" {
		t.Fatalf("snapshot of a volume without a data file: %+v", rec)
	}
	if cur := e.volume(v.ID); len(cur.Snapshotting) != 0 {
		t.Fatalf("failed snapshot still blocks the volume: %v", cur.Snapshotting)
	}
	checkProvisioned(t)
	// A failed snapshot cannot be cloned, but can be deleted; so can the
	// broken volume.
	_, err = s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: rec.ID})
	wantCode(t, err, errs.CodeSnapshotNotReady)
	if err := s.DeleteSnapshot(ctx, alice, rec.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, alice, v.ID); err != nil {
		t.Fatal(err)
	}

	// Clone of a snapshot whose image vanished: refused, and nothing of
	// it is left — no record, no name, no stack, no provisioned bytes.
	v2, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sn2, err := s.CreateSnapshot(ctx, alice, v2.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(e.st.ImagesDir(), sn2.Image)); err != nil {
		t.Fatal(err)
	}
	before := e.volumeDirs()
	c, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "doomed", FromSnapshot: sn2.ID})
	if err == nil {
		t.Fatalf("clone of a snapshot without its image succeeded: %+v", c)
	}
	if _, err := s.Volume(ctx, alice, "doomed"); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("the refused clone is there: %v", err)
	}
	if after := e.volumeDirs(); !slices.Equal(after, before) {
		t.Fatalf("volume directories %v after the refused clone, %v before", after, before)
	}
	if _, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "doomed", SizeBytes: 1 << 20}); err != nil {
		t.Fatalf("the refused clone's name is not free: %v", err)
	}
	checkProvisioned(t)
	cleanupAll(t, s, alice)
	if got := e.provisioned(); got != base {
		t.Fatalf("provisioned %d after cleanup, want %d", got, base)
	}
}

// TestConcurrentExtends: racing extends of one volume; the ones that run
// are serialised, the others are refused, and the record, the device and
// the counter agree at the end.
func TestConcurrentExtends(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, model := e.filledVolume(s, alice, 1<<20, 7)
	const n = 8
	errsOut := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errsOut[i] = s.ExtendVolume(ctx, alice, v.ID, int64(i+2)<<20)
		}()
	}
	wg.Wait()
	ok := 0
	for i, err := range errsOut {
		switch {
		case err == nil:
			ok++
		case errs.IsCode(err, errs.CodeVolumeBusy), errs.IsCode(err, errs.CodeShrinkNotAllowed):
		default:
			t.Errorf("extend %d: %v", i, err)
		}
	}
	if ok < 1 {
		t.Fatal("no extend succeeded")
	}
	cur := e.volume(v.ID)
	if cur.Status != meta.StatusAvailable {
		t.Fatalf("volume is %s", cur.Status)
	}
	// readVolume checks the device's size against the record.
	e.sameVolume(s, v.ID, append(model, make([]byte, cur.SizeBytes-1<<20)...), "after concurrent extends")
	checkProvisioned(t)
	cleanupAll(t, s, alice)
}
