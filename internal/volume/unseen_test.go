package volume

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestNoCollapseUnderUnreadableImage: a clone's image whose image.sb
// cannot be read for the moment (an I/O error, a file server hiccup, no
// file descriptor left) may sit on the image a collapse would merge: the
// collapse job must leave the image alone, as the collector does (an
// unreadable live image hides its parent), not take the clone's image for
// a failed creation's leftover. Merged, the image would hold the volume's
// newer data where the clone reads its snapshot's.
func TestNoCollapseUnderUnreadableImage(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	const size = 1 << 20
	v, model := e.filledVolume(s, alice, size, 1)
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "s", "")
	if err != nil {
		t.Fatal(err)
	}
	img := e.snapAvailable(sn.ID).Image
	clone, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	cloneData := slices.Clone(model)
	e.fill(s, v.ID, model, 2, [2]int64{0, size}) // the volume's top overrides every chunk
	if err := s.DeleteSnapshot(ctx, alice, sn.ID); err != nil {
		t.Fatal(err)
	}
	if ch := e.waitChain(v.ID, 2); ch[1] != img {
		t.Fatalf("with a clone on it the volume reads %v, want %s kept below its top", ch, img)
	}
	// The clone's image.sb is unreadable while the job decides.
	sb := filepath.Join(e.st.ImagesDir(), e.top(clone.ID), "image.sb")
	if err := os.Rename(sb, sb+".away"); err != nil {
		t.Fatal(err)
	}
	var rep any
	e.withStack(s, v.ID, func(l block.Layer) { rep, err = s.collapseJob(ctx, v.ID, l, nil) })
	if err := os.Rename(sb+".away", sb); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := rep.(CollapseReport); !ok || r.Collapsed != "" {
		t.Errorf("collapse with an unreadable image in the store: %+v", rep)
	}
	e.sameVolume(s, clone.ID, cloneData, "clone of the deleted snapshot")
	e.sameVolume(s, v.ID, model, "the volume")
	cleanupAll(t, s, alice)
	checkProvisioned(t)
}

// TestCollectKeepsSnapshotTakenMeanwhile: a collection reads the snapshot
// records, then (waiting for this node's creations, or simply later on
// another node sharing the store) lists the images and reads the volumes'
// tops. A snapshot committed in between, whose volume lets go of its image
// in between too, is in neither: the image — the volume's top when the
// records were read — must be kept all the same. The volume lets go by
// being deleted (with --image-grace 0: the top the snapshot made is not
// spared either) or by a flatten (whatever the grace: that new top no
// longer leads to the image). Service.collect reads the records again
// after the tops.
func TestCollectKeepsSnapshotTakenMeanwhile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		grace time.Duration
		letGo func(e *env, s *Service, c Caller, id string)
	}{
		{"delete", -1, func(e *env, s *Service, c Caller, id string) {
			if err := s.DeleteVolume(ctxT(e.t), c, id); err != nil {
				e.t.Fatal(err)
			}
		}},
		{"flatten", time.Hour, func(e *env, s *Service, c Caller, id string) {
			if _, err := s.StartJob(ctxT(e.t), c, id, meta.JobFlatten); err != nil {
				e.t.Fatal(err)
			}
			e.waitJob(id)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			s := e.started(Config{ImageGrace: tc.grace})
			ctx := ctxT(t)
			alice := caller("alice")
			const size = 1 << 20
			v, model := e.filledVolume(s, alice, size, 1)
			e.settle()
			// CreateSnapshot, up to its freeze: the record, creating.
			sn := &meta.Snapshot{ID: newID("snap-"), Name: "s", Owner: v.Owner, OwnerID: v.OwnerID, VolumeID: v.ID,
				Status: meta.StatusCreating, Node: s.cfg.Node, SizeBytes: v.SizeBytes, Stack: v.Stack, Type: v.Type}
			limit, err := s.Limit()
			if err != nil {
				t.Fatal(err)
			}
			e.update(func(tx *meta.Tx) error {
				cur, err := tx.Volume(v.ID)
				if err != nil {
					return err
				}
				cur.Snapshotting = append(cur.Snapshotting, sn.ID)
				tx.PutVolume(cur)
				tx.PutSnapshot(sn)
				return tx.Provision(sn.SizeBytes, limit)
			})
			_, tok, err := s.leases.acquire(ctx, v.ID)
			if err != nil {
				t.Fatal(err)
			}
			img, err := s.freeze(e.volume(v.ID), sn.ID, tok)
			if err != nil {
				t.Fatal(err)
			}
			past := time.Now().Add(-2 * time.Hour) // made with the volume, long ago
			if err := os.Chtimes(filepath.Join(e.st.ImagesDir(), img), past, past); err != nil {
				t.Fatal(err)
			}
			// A collection reads the records (the snapshot names no
			// image yet) and waits for a creation of this node to let
			// it list the images.
			s.gcMu.RLock()
			done := make(chan struct{})
			go func() { defer close(done); s.collect(ctx) }()
			for s.gcMu.TryRLock() { // until the collection waits for the lock
				s.gcMu.RUnlock()
				time.Sleep(time.Millisecond)
			}
			// Meanwhile the snapshot commits, and its volume lets go.
			e.update(func(tx *meta.Tx) error {
				cur, err := tx.Snapshot(sn.ID)
				if err != nil {
					return err
				}
				if err := dropFromVolume(tx, cur.VolumeID, sn.ID); err != nil {
					return err
				}
				cur.Status, cur.Image, cur.Node = meta.StatusAvailable, img, ""
				tx.PutSnapshot(cur)
				return nil
			})
			tc.letGo(e, s, alice, v.ID)
			s.gcMu.RUnlock()
			<-done
			if !exists(filepath.Join(e.st.ImagesDir(), img)) {
				t.Fatalf("snapshot %s's image %s was removed", sn.ID, img)
			}
			c, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
			if err != nil {
				t.Fatal(err)
			}
			e.sameVolume(s, c.ID, model, "clone of the snapshot")
			cleanupAll(t, s, alice)
			checkProvisioned(t)
		})
	}
}
