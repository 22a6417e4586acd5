package volume

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
	"github.com/basalt-storage/basalt/internal/objects"
	"github.com/basalt-storage/basalt/internal/store"
)

// newPrivateEnv is newEnv over a metadata member of the test's own: a
// service that adopts orphans acts on every record in the store, and the
// shared member holds other tests' records of nodes that are long gone.
func newPrivateEnv(t *testing.T) *env {
	m := metatest.Private(t).Meta
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, meta: m, st: st, node: uniq("node")}
}

// alive keeps node's liveness key, as a running server does, until gone
// is called: then the key is revoked, as when the node stops or its lease
// expires.
func (e *env) alive(node string) (gone func()) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.meta.KeepAlive(ctx, node)
	}()
	var once sync.Once
	gone = func() { once.Do(func() { cancel(); <-done }) }
	e.t.Cleanup(gone)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if a, err := e.meta.Alive(ctx); err == nil && a[node] {
			return gone
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("liveness key of %s never appeared", node)
		}
	}
}

// liveNode names a node that runs nothing but keeps its liveness key
// until gone is called: a node whose recorded workflows are not to be
// adopted until then.
func (e *env) liveNode() (name string, gone func()) {
	e.t.Helper()
	name = uniq("b")
	return name, e.alive(name)
}

// adopting starts a service that adopts orphaned workflows, with its
// liveness key.
func (e *env) adopting(cfg Config) *Service {
	e.t.Helper()
	cfg.Node, cfg.AdoptOrphans = uniq("a"), true
	s := e.started(cfg)
	e.alive(s.cfg.Node)
	return s
}

// holdingWriter makes a node, with its liveness key, that holds vol's
// write lease as a job of its would, and runs nothing (not started): gone
// ends its liveness key, its leases.stop the write-lease key.
func (e *env) holdingWriter(vol string) (b *Service, gone func()) {
	e.t.Helper()
	ctx := ctxT(e.t)
	b = e.service(Config{Node: uniq("b")})
	gone = e.alive(b.cfg.Node)
	b.leases.renew(ctx)
	if holder, _, err := b.leases.use(ctx, vol); err != nil || holder != b.cfg.Node {
		e.t.Fatalf("%s takes the write lease of %s: %q %v", b.cfg.Node, vol, holder, err)
	}
	return b, gone
}

// noLease waits a little for volume vol to have no write-lease holder: a
// job's node gives the lease up just after it records the job's outcome.
func (e *env) noLease(vol, when string) {
	e.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		h, err := e.meta.VolumeLeaseHolder(ctxT(e.t), vol)
		if err == nil && h == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("write lease of %s %s: %+v %v, want none", vol, when, h, err)
		}
	}
}

// stillFor checks, for a while, that vol's job stays recorded for node.
func (e *env) stillFor(vol, node, why string) {
	e.t.Helper()
	for end := time.Now().Add(600 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if j := e.volume(vol).Job; j == nil || j.Node != node {
			e.t.Fatalf("%s: the job left %s: %+v", why, node, j)
		}
	}
}

// keptFor asks a for a sweep and checks, a moment later, that volume id
// is still in status, driven by node: a live node's workflow is nobody
// else's to adopt.
func (e *env) keptFor(a *Service, id, status, node string) {
	e.t.Helper()
	a.lookForOrphans()
	time.Sleep(300 * time.Millisecond)
	if cur := e.volume(id); cur.Status != status || cur.Node != node {
		e.t.Fatalf("a workflow of live node %s adopted: volume %s is %s on %q", node, id, cur.Status, cur.Node)
	}
}

// leaves waits until volume id is no longer in status and returns it.
func (e *env) leaves(id, status string) *meta.Volume {
	e.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if v := e.volume(id); v.Status != status {
			return v
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("volume %s is still %s", id, status)
		}
	}
}

// snapshotResult is what a CreateSnapshot call returned.
type snapshotResult struct {
	sn  *meta.Snapshot
	err error
}

// handSnapshot asks a for a snapshot of vol, which writer writes, and
// returns the snapshot record once it is handed to writer, and where the
// call's result will arrive.
func (e *env) handSnapshot(a *Service, c Caller, vol string, writer *Service) (*meta.Snapshot, <-chan snapshotResult) {
	e.t.Helper()
	res := make(chan snapshotResult, 1)
	go func() {
		sn, err := a.CreateSnapshot(ctxT(e.t), c, vol, "", "")
		res <- snapshotResult{sn, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if cur := e.volume(vol); len(cur.Snapshotting) == 1 {
			sn := e.snapshot(cur.Snapshotting[0])
			if sn.Node != writer.cfg.Node {
				e.t.Fatalf("snapshot recorded for %q, want the writer %s", sn.Node, writer.cfg.Node)
			}
			return sn, res
		}
		if time.Now().After(deadline) {
			e.t.Fatal("the snapshot was never handed to the volume's writer")
		}
	}
}

// writerDiesWithSnapshot asks a for a snapshot of vol while another node
// writes vol, and makes that node die (its liveness key and write-lease
// key gone) once the snapshot is handed to it, before it takes it; it
// returns that node (its service, not started), the handed snapshot and
// where a's call will answer.
func (e *env) writerDiesWithSnapshot(a *Service, c Caller, vol string) (*Service, *meta.Snapshot, <-chan snapshotResult) {
	e.t.Helper()
	b, bGone := e.holdingWriter(vol)
	handed, res := e.handSnapshot(a, c, vol, b)
	bGone()
	b.leases.stop()
	return b, handed, res
}

// importing makes, through a, a volume recorded as being imported by node
// from a new object of be's bucket, as node's import records it when it
// begins, and returns the volume and the object's bytes.
func (e *env) importing(a *Service, c Caller, be *objects.Backend, bucket, node string) (*meta.Volume, []byte) {
	e.t.Helper()
	ctx := ctxT(e.t)
	model := pattern(11, 1<<20)
	if _, err := be.PutImage(ctx, objects.ImageInput{Bucket: bucket, Key: "in.raw", Fill: func(f *os.File) error {
		_, err := f.Write(model)
		return err
	}}); err != nil {
		e.t.Fatal(err)
	}
	url := "s3://" + bucket + "/in.raw"
	v, err := a.CreateVolume(ctx, c, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		e.t.Fatal(err)
	}
	e.editVolume(v.ID, func(cur *meta.Volume) {
		cur.Status, cur.Node, cur.SourceObject = meta.StatusCreating, node, url
		cur.Job = &meta.Job{Kind: meta.JobImport, Node: node, StartedAt: now(), Object: url}
	})
	return e.volume(v.ID), model
}

// TestOrphanedJobAdopted: a job recorded for a node that is gone — no
// liveness key, no write lease, no rw attachment that a takeover would
// follow — is adopted by a live node and run there; while its node is
// alive, nobody touches it.
func TestOrphanedJobAdopted(t *testing.T) {
	e := newPrivateEnv(t)
	a := e.adopting(Config{})
	b, bGone := e.liveNode()
	ctx := ctxT(t)
	alice := caller("alice")
	_, _, model, clone := e.slowClone(a, alice, 64<<12)
	c := clone()
	e.setJob(c, flattenFor(b))
	a.lookForOrphans()
	e.stillFor(c, b, "node alive")
	_, err := a.StartJob(ctx, alice, c, meta.JobFlatten)
	wantCode(t, err, errs.CodeVolumeBusy) // the record holds the job

	bGone()
	e.flattened(c, "the adopted flatten")
	if ch := e.chain(c); len(ch) != 1 {
		t.Fatalf("clone still on %d images after the adopted flatten: %v", len(ch), ch)
	}
	e.sameVolume(a, c, model, "clone flattened by the node that adopted the job")
	e.noLease(c, "after the adopted job (no rw attachment)")
	cleanupAll(t, a, alice)
}

// TestOrphanWaitsForLeaseKey: a job recorded for a node that is gone but
// whose write-lease key on the volume is still there (its etcd lease has
// not expired yet) is not adopted — the lease would only hand it back —
// until the key goes; then it is, at once.
func TestOrphanWaitsForLeaseKey(t *testing.T) {
	e := newPrivateEnv(t)
	a := e.adopting(Config{})
	alice := caller("alice")
	_, _, model, clone := e.slowClone(a, alice, 64<<12)
	c := clone()
	b, bGone := e.holdingWriter(c)
	e.setJob(c, flattenFor(b.cfg.Node))

	bGone() // its liveness key goes first; its write lease is another etcd lease
	a.lookForOrphans()
	e.stillFor(c, b.cfg.Node, "write-lease key of the gone node still there")

	start := time.Now()
	b.leases.stop() // the key goes
	e.flattened(c, "the adopted flatten")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("adopted %v after the write-lease key went; want at once", d)
	}
	e.sameVolume(a, c, model, "clone flattened by the node that adopted the job")
	cleanupAll(t, a, alice)
}

// TestOrphanedExtendAdopted: an extend recorded for a node that is gone
// (its first transaction done, the bytes provisioned) is finished by a live
// node: the volume takes its new size, its data intact, and the
// provisioned bytes stay counted once.
func TestOrphanedExtendAdopted(t *testing.T) {
	e := newPrivateEnv(t)
	a := e.adopting(Config{})
	b, bGone := e.liveNode()
	alice := caller("alice")
	v, model := e.filledVolume(a, alice, 1<<20, 3)
	before := e.provisioned()
	e.extending(v.ID, 2<<20, b)
	e.keptFor(a, v.ID, meta.StatusExtending, b)

	bGone()
	got := e.leaves(v.ID, meta.StatusExtending)
	if got.Status != meta.StatusAvailable || got.SizeBytes != 2<<20 || got.Node != "" || got.StatusMessage != "" {
		t.Fatalf("volume after the adopted extend: %s %q, %d bytes, node %q", got.Status, got.StatusMessage, got.SizeBytes, got.Node)
	}
	if p := e.provisioned(); p != before+1<<20 {
		t.Errorf("provisioned %d bytes after the extend, want %d", p, before+1<<20)
	}
	e.sameVolume(a, v.ID, append(model, make([]byte, 1<<20)...), "volume extended by the node that adopted the extend")
	cleanupAll(t, a, alice)
}

// TestOrphanedSnapshotDeleteAdopted: a snapshot delete whose node died
// after its first transaction (the snapshot in status deleting) is
// finished by a live node: the record goes and its bytes are given back.
func TestOrphanedSnapshotDeleteAdopted(t *testing.T) {
	e := newPrivateEnv(t)
	a := e.adopting(Config{})
	b, bGone := e.liveNode()
	ctx := ctxT(t)
	alice := caller("alice")
	v, _ := e.filledVolume(a, alice, 1<<20, 5)
	sn, err := a.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	before := e.provisioned()
	e.editSnapshot(sn.ID, func(cur *meta.Snapshot) { cur.Status, cur.Node = meta.StatusDeleting, b })
	a.lookForOrphans()
	time.Sleep(300 * time.Millisecond)
	if cur := e.snapshot(sn.ID); cur.Status != meta.StatusDeleting || cur.Node != b {
		t.Fatalf("delete of a live node adopted: %s on %q", cur.Status, cur.Node)
	}

	bGone()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := e.meta.Snapshot(ctx, sn.ID); errs.IsCode(err, errs.CodeNotFound) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the snapshot is still there: %v", err)
		}
	}
	if p := e.provisioned(); p != before-sn.SizeBytes {
		t.Errorf("provisioned %d bytes after the delete, want %d", p, before-sn.SizeBytes)
	}
	cleanupAll(t, a, alice)
}

// TestOrphanedSnapshotAdopted: a snapshot handed to the volume's writer,
// which dies before freezing it, is frozen by the node that adopts it; the
// create call that handed it over sees it available, holding the data
// written before it.
func TestOrphanedSnapshotAdopted(t *testing.T) {
	e := newPrivateEnv(t)
	a := e.adopting(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, model := e.filledVolume(a, alice, 1<<20, 7)
	_, _, res := e.writerDiesWithSnapshot(a, alice, v.ID)
	r := <-res
	if r.err != nil || r.sn.Status != meta.StatusAvailable {
		t.Fatalf("snapshot after its writer died: %+v %v", r.sn, r.err)
	}
	cl, err := a.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: r.sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	e.sameVolume(a, cl.ID, model, "clone of the adopted snapshot")
	cleanupAll(t, a, alice)
}

// objectStore is a real object store over the env's data root with one
// bucket of owner's (whose user record it writes); it returns the store
// and the bucket's name.
func (e *env) objectStore(owner Caller) (*objects.Backend, string) {
	e.t.Helper()
	e.update(func(tx *meta.Tx) error {
		tx.PutUser(&meta.User{Name: owner.Name, ID: owner.ID, CreatedAt: now()})
		return nil
	})
	buckets := objects.MetaBuckets{Meta: e.meta}
	be, err := objects.New(objects.Config{Root: e.st.BucketsDir(), Work: e.st.ObjectsDir(), Buckets: buckets})
	if err != nil {
		e.t.Fatal(err)
	}
	name := uniq("img")
	if err := buckets.CreateBucket(ctxT(e.t), objects.Bucket{Name: name, Owner: owner.Name, CreatedAt: now()}); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(e.st.BucketsDir(), name), 0o755); err != nil {
		e.t.Fatal(err)
	}
	return be, name
}

// TestOrphanedExportAdopted: a snapshot export recorded for a node that is
// gone is adopted and run by a live node: the object holds the snapshot.
func TestOrphanedExportAdopted(t *testing.T) {
	e := newPrivateEnv(t)
	alice := caller("alice")
	be, bucket := e.objectStore(alice)
	a := e.adopting(Config{Objects: be})
	b, bGone := e.liveNode()
	ctx := ctxT(t)
	v, model := e.filledVolume(a, alice, 1<<20, 9)
	sn, err := a.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	url := "s3://" + bucket + "/s.raw"
	e.editSnapshot(sn.ID, func(cur *meta.Snapshot) {
		cur.Job = &meta.Job{Kind: meta.JobExport, Node: b, StartedAt: now(), Object: url, Total: cur.SizeBytes, Phase: "copy"}
	})
	a.lookForOrphans()
	time.Sleep(300 * time.Millisecond)
	if j := e.snapshot(sn.ID).Job; j == nil || j.Node != b {
		t.Fatalf("export of a live node adopted: %+v", j)
	}

	bGone()
	var got *meta.Snapshot
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got = e.snapshot(sn.ID); got.Job == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("export still recorded: %+v", got.Job)
		}
	}
	if lj := got.LastJob; lj == nil || lj.Kind != meta.JobExport || lj.Error != "" {
		t.Fatalf("outcome of the adopted export: %+v", lj)
	}
	f, _, err := be.OpenImage(ctx, bucket, "s.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if b, err := io.ReadAll(f); err != nil || !sameBytes(b, model) {
		t.Fatalf("the object exported by the adopting node differs from the snapshot (%d bytes, %v)", len(b), err)
	}
	cleanupAll(t, a, alice)
}

// TestReturningNodeLeavesAdoptedExport: a node that read its export's
// record and copied, then was paused or cut off long enough for another
// node to adopt the export and finish it, and the user wrote the object
// since, must not publish its copy over the user's object (nor record its
// progress on the snapshot's job any more).
func TestReturningNodeLeavesAdoptedExport(t *testing.T) {
	e := newPrivateEnv(t)
	alice := caller("alice")
	be, bucket := e.objectStore(alice)
	a := e.adopting(Config{Objects: be})
	b := e.service(Config{Node: uniq("b"), Objects: be}) // no liveness key: cut off
	ctx := ctxT(t)
	v, _ := e.filledVolume(a, alice, 1<<20, 9)
	sn, err := a.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	url := "s3://" + bucket + "/s.raw"
	e.editSnapshot(sn.ID, func(cur *meta.Snapshot) {
		cur.Job = &meta.Job{Kind: meta.JobExport, Node: b.cfg.Node, StartedAt: now(), Object: url, Total: cur.SizeBytes, Phase: "copy"}
	})
	read := e.snapshot(sn.ID) // what b's run read before it was cut off
	a.lookForOrphans()
	for deadline := time.Now().Add(20 * time.Second); e.snapshot(sn.ID).Job != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("adopted export still recorded: %+v", e.snapshot(sn.ID).Job)
		}
	}
	user := []byte("the user's object, written after the export")
	if _, err := be.PutImage(ctx, objects.ImageInput{Bucket: bucket, Key: "s.raw", Fill: func(f *os.File) error {
		_, err := f.Write(user)
		return err
	}}); err != nil {
		t.Fatal(err)
	}
	// A new export of b's, recorded while its old run was away.
	e.editSnapshot(sn.ID, func(cur *meta.Snapshot) {
		cur.Job = &meta.Job{Kind: meta.JobExport, Node: b.cfg.Node, StartedAt: now(), Object: "s3://" + bucket + "/t.raw", Total: cur.SizeBytes, Phase: "copy"}
	})
	if _, err := b.export(ctx, read); err == nil {
		t.Fatal("the returning node published an export another node had adopted and finished")
	}
	f, _, err := be.OpenImage(ctx, bucket, "s.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got, err := io.ReadAll(f); err != nil || !sameBytes(got, user) {
		t.Fatalf("the user's object was replaced by the returning node's copy (%d bytes, %v)", len(got), err)
	}
	if j := e.snapshot(sn.ID).Job; j == nil || j.Done != 0 || j.Object != "s3://"+bucket+"/t.raw" {
		t.Fatalf("the new export's job after the old run: %+v", j)
	}
	e.editSnapshot(sn.ID, func(cur *meta.Snapshot) { cur.Job = nil })
	cleanupAll(t, a, alice)
}

// TestOrphanedImportAdopted: a volume being made from an object by a node
// that is gone is finished by a live node, writing as the volume's writer.
func TestOrphanedImportAdopted(t *testing.T) {
	e := newPrivateEnv(t)
	alice := caller("alice")
	be, bucket := e.objectStore(alice)
	a := e.adopting(Config{Objects: be})
	b, bGone := e.liveNode()
	v, model := e.importing(a, alice, be, bucket, b)
	e.keptFor(a, v.ID, meta.StatusCreating, b)

	bGone()
	got := e.leaves(v.ID, meta.StatusCreating)
	if got.Status != meta.StatusAvailable || got.LastJob == nil || got.LastJob.Kind != meta.JobImport || got.LastJob.Error != "" {
		t.Fatalf("volume after the adopted import: %s %q, last job %+v", got.Status, got.StatusMessage, got.LastJob)
	}
	e.sameVolume(a, v.ID, model, "volume imported by the adopting node")
	e.noLease(v.ID, "after the import")
	cleanupAll(t, a, alice)
}

// TestReturningNodeLeavesAdoptedImport: a node that read its import's
// record, then was cut off while it waited for the write lease, comes back
// after another node adopted the import, finished it and the volume was
// written. It must neither import again over the user's writes nor mark
// the volume failed — whether the lease is free then or another node
// writes the volume.
func TestReturningNodeLeavesAdoptedImport(t *testing.T) {
	for _, holder := range []bool{false, true} {
		t.Run(map[bool]string{false: "lease free", true: "another writer"}[holder], func(t *testing.T) {
			e := newPrivateEnv(t)
			alice := caller("alice")
			be, bucket := e.objectStore(alice)
			a := e.adopting(Config{Objects: be})
			b := e.service(Config{Node: uniq("b"), Objects: be}) // no liveness key: cut off
			ctx := ctxT(t)
			read, model := e.importing(a, alice, be, bucket, b.cfg.Node) // read: what b's startImport read
			v := read
			a.lookForOrphans()
			e.leaves(v.ID, meta.StatusCreating)
			e.noLease(v.ID, "after the adopted import")
			later := append([]byte(nil), model...)
			e.fill(a, v.ID, later, 99, [2]int64{0, 64 << 10}) // the user's writes
			if holder {
				e.holdingWriter(v.ID)
			}

			b.leases.renew(ctx)
			if _, err := b.finishImport(ctx, read); err == nil {
				t.Fatal("the returning node finished an import another node had finished")
			}
			if got := e.volume(v.ID); got.Status != meta.StatusAvailable || got.LastJob == nil || got.LastJob.Error != "" {
				t.Fatalf("the volume after the returning node: %s %q, last job %+v", got.Status, got.StatusMessage, got.LastJob)
			}
			e.sameVolume(a, v.ID, later, "the user's writes after the returning node")
		})
	}
}

// TestReturningNodeLeavesAdoptedSnapshot: a node that was handed a
// snapshot, was cut off, and comes back — its watch, resumed from its last
// revision, delivering the hand-over — after another node adopted the
// snapshot and the volume was written and snapshotted again, must neither
// freeze the snapshot again (it would hold the later writes) nor mark it
// failed.
func TestReturningNodeLeavesAdoptedSnapshot(t *testing.T) {
	for _, holder := range []bool{false, true} {
		t.Run(map[bool]string{false: "lease free", true: "another writer"}[holder], func(t *testing.T) {
			e := newPrivateEnv(t)
			a := e.adopting(Config{})
			ctx := ctxT(t)
			alice := caller("alice")
			v, model := e.filledVolume(a, alice, 1<<20, 7)
			b, handed, res := e.writerDiesWithSnapshot(a, alice, v.ID)
			if r := <-res; r.err != nil {
				t.Fatal(r.err)
			}
			taken := e.snapAvailable(handed.ID)
			e.fill(a, v.ID, append([]byte(nil), model...), 55, [2]int64{0, 64 << 10})
			if _, err := a.CreateSnapshot(ctx, alice, v.ID, "", ""); err != nil {
				t.Fatal(err)
			}
			if holder {
				e.holdingWriter(v.ID)
			}

			b.leases.renew(ctx)
			b.runDelegatedSnapshot(ctx, handed)
			got := e.snapshot(handed.ID)
			if got.Status != meta.StatusAvailable || got.Image != taken.Image {
				t.Fatalf("the snapshot after the returning node: %s %q, image %s (was %s)", got.Status, got.StatusMessage, got.Image, taken.Image)
			}
			cl, err := a.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: got.ID})
			if err != nil {
				t.Fatal(err)
			}
			e.sameVolume(a, cl.ID, model, "clone of the adopted snapshot")
		})
	}
}

// TestOrphanedSnapshotFailsAfterWrites: a snapshot whose node died before
// freezing it, on a volume another node has taken for writing since, can
// no longer hold exactly the writes made before it was asked for: the node
// that adopts it fails it, saying why, rather than freeze it late.
func TestOrphanedSnapshotFailsAfterWrites(t *testing.T) {
	e := newPrivateEnv(t)
	a := e.started(Config{Node: uniq("a")}) // adopts nothing
	e.alive(a.cfg.Node)
	alice := caller("alice")
	v, _ := e.filledVolume(a, alice, 1<<20, 7)
	_, handed, res := e.writerDiesWithSnapshot(a, alice, v.ID)
	c, _ := e.holdingWriter(v.ID) // takes the volume for writing

	e.adopting(Config{})
	var got *meta.Snapshot
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got = e.snapshot(handed.ID); got.Status != meta.StatusCreating {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the orphaned snapshot is still being created")
		}
	}
	if got.Status != meta.StatusError || !strings.Contains(got.StatusMessage, c.cfg.Node) || got.Image != "" {
		t.Fatalf("orphaned snapshot after another node wrote the volume: %s %q image %q", got.Status, got.StatusMessage, got.Image)
	}
	if cur := e.volume(v.ID); len(cur.Snapshotting) != 0 {
		t.Fatalf("the volume still records the snapshot as under way: %v", cur.Snapshotting)
	}
	if r := <-res; r.sn == nil || r.sn.Status != meta.StatusError {
		t.Fatalf("the create call that handed the snapshot over returned %+v, %v", r.sn, r.err)
	}
}

// TestSnapshotFailsWhenLeasePasses: a snapshot recorded for the volume's
// writer fails the moment another node takes the write lease — here after
// the writer, alive, let it go before taking the snapshot — since that
// node is about to write the volume and the snapshot could no longer be
// taken without its writes. No sweep is involved: none would fail a live
// node's snapshot, and after the new writer let the lease go too, a
// sweep would find nobody writing.
func TestSnapshotFailsWhenLeasePasses(t *testing.T) {
	e := newPrivateEnv(t)
	a := e.started(Config{Node: uniq("a")})
	e.alive(a.cfg.Node)
	alice := caller("alice")
	v, _ := e.filledVolume(a, alice, 1<<20, 7)
	b, _ := e.holdingWriter(v.ID)
	handed, res := e.handSnapshot(a, alice, v.ID, b)
	b.leases.unuse(ctxT(t), v.ID)
	e.noLease(v.ID, "after the writer let it go")
	if got := e.snapshot(handed.ID); got.Status != meta.StatusCreating {
		t.Fatalf("snapshot %s before another node took the lease, want creating", got.Status)
	}
	c, _ := e.holdingWriter(v.ID)
	got := e.snapshot(handed.ID)
	if got.Status != meta.StatusError || !strings.Contains(got.StatusMessage, c.cfg.Node) || !strings.Contains(got.StatusMessage, b.cfg.Node) {
		t.Fatalf("snapshot once %s took the lease from %s: %s %q, want error naming both", c.cfg.Node, b.cfg.Node, got.Status, got.StatusMessage)
	}
	if cur := e.volume(v.ID); len(cur.Snapshotting) != 0 {
		t.Fatalf("the volume still records the snapshot as under way: %v", cur.Snapshotting)
	}
	if r := <-res; r.sn == nil || r.sn.Status != meta.StatusError {
		t.Fatalf("the create call returned %+v, %v", r.sn, r.err)
	}
}
