package volume

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/nbd"
)

// twoNodes starts nodes a and b over one store (as two servers over a
// shared file system), with b serving NBD, and lets the collections
// their starts asked for settle before the test creates anything.
func twoNodes(t *testing.T) (e *env, a, b *Service, xb *Exports) {
	t.Helper()
	e = newEnv(t)
	a = e.started(Config{Node: uniq("a")})
	b = e.started(Config{Node: uniq("b")})
	e.settle()
	return e, a, b, runExports(t, b)
}

// servedRO attaches volume vol ro through a and opens the attachment on
// b's NBD exports, as a backup host connected to b does; the connection
// stays open until the test ends (or release is called).
func servedRO(t *testing.T, a *Service, xb *Exports, c Caller, vol string) (*meta.Attachment, *nbd.Export) {
	t.Helper()
	ctx := ctxT(t)
	att, err := a.Attach(ctx, c, vol, "backup", meta.ModeRO)
	if err != nil {
		t.Fatal(err)
	}
	exp, err := xb.Open(ctx, att.Export, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(exp.Release)
	return att, exp
}

// TestReaderStackNotWrittenStale: node b serves a ro attachment of
// a volume, so it has the volume's stack open; then the volume is changed
// through node a (a snapshot: a new top; an extend: a new size), and then
// a workflow that writes the volume runs on b (an extend, a snapshot,
// through b's API). b took the write lease for it, but wrote through the
// stack it had open for the reader, whose state predates a's change: the
// extend grew the snapshot's image and left the volume's real top at the
// old size, the snapshot froze the old size into a new top — either way
// the volume could not be opened any more ("its stack has 1048576 bytes,
// the volume 2097152").
func TestReaderStackNotWrittenStale(t *testing.T) {
	for _, tc := range []struct {
		name         string
		onA, thenOnB string
	}{
		{"snapshot through a, extend through b", "snapshot", "extend"},
		{"extend through a, snapshot through b", "extend", "snapshot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, a, b, xb := twoNodes(t)
			ctx := ctxT(t)
			alice := caller("alice")
			v, model := e.filledVolume(a, alice, 1<<20, 5)
			att, _ := servedRO(t, a, xb, alice, v.ID)
			var sn *meta.Snapshot
			step := func(s *Service, what string) {
				t.Helper()
				var err error
				switch what {
				case "snapshot":
					sn, err = s.CreateSnapshot(ctx, alice, v.ID, "", "")
				case "extend":
					_, err = s.ExtendVolume(ctx, alice, v.ID, 2<<20)
				}
				if err != nil {
					t.Fatalf("%s through %s: %v", what, s.cfg.Node, err)
				}
			}
			step(a, tc.onA)
			step(b, tc.thenOnB)
			if err := a.Detach(ctx, alice, att.ID); err != nil {
				t.Fatal(err)
			}
			e.sameVolume(a, v.ID, slices.Concat(model, make([]byte, 1<<20)), "volume after both")
			cl, err := a.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
			if err != nil {
				t.Fatal(err)
			}
			want := model
			if tc.onA == "extend" {
				want = slices.Concat(model, make([]byte, 1<<20))
			}
			e.sameVolume(a, cl.ID, want, "clone of the snapshot")
		})
	}
}

// TestExtendVisibleToNewConnections: an extend is visible to every
// NBD connection made after it (the API answers with the new size).
// Before, a connection reused the stack its node had open and got the old
// size: on a node serving a ro attachment while the volume was extended
// through another, and on the writer itself when the stack was opened
// from the volume's record read just before the extend committed (an NBD
// open or a job racing with the extend) — for as long as any user kept
// that stack open.
func TestExtendVisibleToNewConnections(t *testing.T) {
	t.Run("ro attachment served by another node", func(t *testing.T) {
		e, a, _, xb := twoNodes(t)
		ctx := ctxT(t)
		alice := caller("alice")
		v, model := e.filledVolume(a, alice, 1<<20, 3)
		att, _ := servedRO(t, a, xb, alice, v.ID) // held open meanwhile
		if _, err := a.ExtendVolume(ctx, alice, v.ID, 2<<20); err != nil {
			t.Fatal(err)
		}
		exp, err := xb.Open(ctx, att.Export, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer exp.Release()
		if n := exp.Device.Size(); n != 2<<20 {
			t.Fatalf("a connection made after the extend to 2 MiB serves %d bytes", n)
		}
		got := make([]byte, 2<<20)
		if err := exp.Device.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !sameBytes(got, slices.Concat(model, make([]byte, 1<<20))) {
			t.Fatal("the extended volume reads wrong through the new connection")
		}
	})
	t.Run("stack opened from a record read before the extend", func(t *testing.T) {
		e := newEnv(t)
		s := e.started(Config{})
		ctx := ctxT(t)
		alice := caller("alice")
		v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		before := e.volume(v.ID) // what a racing open read
		if _, err := s.ExtendVolume(ctx, alice, v.ID, 2<<20); err != nil {
			t.Fatal(err)
		}
		_, release, err := s.acquireWritable(before)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		e.withStack(s, v.ID, func(l block.Layer) {
			if n := l.Size(); n != 2<<20 {
				t.Fatalf("a user after the extend to 2 MiB sees %d bytes", n)
			}
		})
	})
}

// TestDelegatedFailureIsReported: an extend or a snapshot asked of a
// node that does not write the volume is run by the node that does
// (delegate.go). When it fails there, the call must fail as it does when
// it runs where it was asked (docs/api.md: "the call answers with the
// error"). It answered success instead: the extend with the volume at its
// old size, the snapshot with a snapshot in status error (201).
func TestDelegatedFailureIsReported(t *testing.T) {
	e, a, b, _ := twoNodes(t)
	ctx := ctxT(t)
	alice := caller("alice")
	v := e.writtenBy(a, b, alice)
	// The volume's data file is gone: no workflow can open its stack.
	if err := os.Remove(filepath.Join(e.st.ImagesDir(), e.top(v.ID), "data.img")); err != nil {
		t.Fatal(err)
	}
	if out, err := a.ExtendVolume(ctx, alice, v.ID, 2<<20); err == nil {
		t.Errorf("extend that failed on the writer answered success: %d bytes, %s, %q", out.SizeBytes, out.Status, out.StatusMessage)
	}
	if cur := e.volume(v.ID); cur.SizeBytes != 1<<20 || cur.Status != meta.StatusInUse || cur.StatusMessage == "" {
		t.Errorf("volume after the failed extend: %d bytes, %s, %q", cur.SizeBytes, cur.Status, cur.StatusMessage)
	}
	sn, err := a.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err == nil {
		t.Errorf("snapshot that failed on the writer answered success: %s %q", sn.Status, sn.StatusMessage)
	}
	if snaps, _ := a.Snapshots(ctx, alice, v.ID); len(snaps) != 1 || snaps[0].Status != meta.StatusError {
		t.Errorf("snapshots after the failed one: %+v", snaps)
	}
}

// writtenBy creates a volume of 1 MiB through a and attaches it rw
// through b, which then holds its write lease: workflows asked of a are
// handed to b (delegate.go).
func (e *env) writtenBy(a, b *Service, c Caller) *meta.Volume {
	e.t.Helper()
	ctx := ctxT(e.t)
	v, err := a.CreateVolume(ctx, c, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := b.Attach(ctx, c, v.ID, "hv", meta.ModeRW); err != nil {
		e.t.Fatal(err)
	}
	if h, err := e.meta.VolumeLeaseHolder(ctx, v.ID); err != nil || h == nil || h.Node != b.cfg.Node {
		e.t.Fatalf("write lease after attaching through %s: %+v %v", b.cfg.Node, h, err)
	}
	return v
}

// TestReaderStackNotWrittenAfterFlatten: as above, with a flatten
// through node a: the clone's top no longer has a parent, and that parent
// (the deleted snapshot's image) is collected. An extend through b, which
// serves a ro attachment of the clone, wrote the top's superblock from
// b's stack, which still named the parent: the clone then named an image
// that is gone and could not be opened ("superblock: no valid copy").
func TestReaderStackNotWrittenAfterFlatten(t *testing.T) {
	e, a, b, xb := twoNodes(t)
	ctx := ctxT(t)
	alice := caller("alice")
	v, model := e.filledVolume(a, alice, 1<<20, 5)
	sn, err := a.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := a.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	att, _ := servedRO(t, a, xb, alice, cl.ID)
	if _, err := a.StartJob(ctx, alice, cl.ID, meta.JobFlatten); err != nil {
		t.Fatal(err)
	}
	e.flattened(cl.ID, "flatten through a")
	if err := a.DeleteSnapshot(ctx, alice, sn.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteVolume(ctx, alice, v.ID); err != nil {
		t.Fatal(err)
	}
	e.wantImages(a, []string{cl.ID}, nil) // the snapshot's image is gone
	if _, err := b.ExtendVolume(ctx, alice, cl.ID, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := a.Detach(ctx, alice, att.ID); err != nil {
		t.Fatal(err)
	}
	e.sameVolume(a, cl.ID, slices.Concat(model, make([]byte, 1<<20)), "clone after the extend through b")
}

// TestMultiattachReaderFollowsWriter: an ro attachment of a multiattach
// volume reads through the stack of the node serving it, which sees
// another node's writes only as they were when it opened the volume (its
// allocation maps, its top image). So while another node writes the
// volume, that node serves the ro attachment too: an open elsewhere is
// refused, naming it (ServedByAnotherNode, as for rw), ServingNode (the
// attachment's nbd_uri) names it on every node, and the ro connections a
// node had open before the writer appeared are closed.
func TestMultiattachReaderFollowsWriter(t *testing.T) {
	_, a, b, xb := twoNodes(t)
	xa := runExports(t, a)
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := a.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20, Multiattach: true})
	if err != nil {
		t.Fatal(err)
	}
	ro, err := a.Attach(ctx, alice, v.ID, "reader", meta.ModeRO)
	if err != nil {
		t.Fatal(err)
	}
	// Nobody writes the volume: b serves the reader itself.
	early, err := xb.Open(ctx, ro.Export, nil)
	if err != nil {
		t.Fatalf("ro open with no writer: %v", err)
	}
	defer early.Release()
	if node, err := b.ServingNode(ctx, ro); err != nil || node != b.cfg.Node {
		t.Fatalf("serving node of the ro attachment on b with no writer: %q %v", node, err)
	}
	// a begins to write it.
	rw, err := a.Attach(ctx, alice, v.ID, "writer", meta.ModeRW)
	if err != nil {
		t.Fatal(err)
	}
	w, err := xa.Open(ctx, rw.Export, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release()
	select {
	case <-early.Revoked:
	case <-time.After(10 * time.Second):
		t.Fatal("b kept serving the ro attachment after a began to write the volume")
	}
	_, err = xb.Open(ctx, ro.Export, nil)
	if !errs.IsCode(err, CodeServedElsewhere) {
		t.Fatalf("ro open on b while a writes: %v, want %s", err, CodeServedElsewhere)
	}
	for _, s := range []*Service{a, b} {
		if node, err := s.ServingNode(ctx, ro); err != nil || node != a.cfg.Node {
			t.Fatalf("serving node of the ro attachment on %s: %q %v, want %s", s.cfg.Node, node, err, a.cfg.Node)
		}
	}
	r, err := xa.Open(ctx, ro.Export, nil)
	if err != nil {
		t.Fatalf("ro open on the writer: %v", err)
	}
	defer r.Release()
	// A write through a reads back through a's reader at once.
	p := bytes.Repeat([]byte{9}, 4096)
	if err := w.Device.WriteAt(p, 8192, false); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(p))
	if err := r.Device.ReadAt(got, 8192); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("reader on the writer's node: %v", err)
	}
}

// TestOpenNeedsCurrentAttachment: an NBD open whose check of the
// attachment could only be answered from the node's own copy (the quorum
// lost: a detach made through another node may be missing from it) is
// refused, retryably, and the export name keeps working once the check
// is current again. (A stale read stands in for the lost quorum: both
// are answered from the local copy.)
func TestOpenNeedsCurrentAttachment(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	x := runExports(t, s)
	att := attached(t, s, meta.ModeRO)
	if _, err := x.Open(meta.Stale(ctxT(t)), att.Export, nil); !errs.IsCode(err, errs.CodeMetadataUnavailable) {
		t.Fatalf("open checked against the local copy: %v, want %s", err, errs.CodeMetadataUnavailable)
	}
	exp, err := x.Open(ctxT(t), att.Export, nil)
	if err != nil {
		t.Fatalf("open with a current check: %v", err)
	}
	exp.Release()
}
