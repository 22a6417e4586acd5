package volume

import (
	"bytes"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block/cow"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestFlattenDuringStrandedSnapshot: a snapshot whose freeze is done but
// whose record does not name its image yet (its commit lost its reply:
// stranded until the sweep finishes it) is held by nothing but the
// volume's chain. A flatten cuts the chain there, and the collection after
// it would remove the frozen image (and its ancestors), which the sweep
// then records as the snapshot's: a snapshot of nothing.
//   - started: a flatten started meanwhile waits for the snapshot, as an
//     extend or a delete does (or, run, must not lose it);
//   - running: a flatten that was running as the snapshot froze (which
//     StartJob could not refuse) detaches the top from the frozen image;
//     a collection keeps it, as the top's record of the freeze names it.
//
// Either way the snapshot, once finished, holds its data.
func TestFlattenDuringStrandedSnapshot(t *testing.T) {
	t.Run("started", func(t *testing.T) {
		strandedFlatten(t, func(e *env, s *Service, alice Caller, v *meta.Volume, _ int64) {
			_, err := s.StartJob(ctxT(t), alice, v.ID, meta.JobFlatten)
			switch {
			case err == nil:
				e.flattened(v.ID, "flatten during a stranded snapshot")
			case !errs.IsCode(err, errs.CodeVolumeBusy):
				t.Fatalf("flatten during a stranded snapshot: %v, want it run or refused as busy", err)
			}
		})
	})
	t.Run("running", func(t *testing.T) {
		strandedFlatten(t, func(e *env, s *Service, _ Caller, v *meta.Volume, token int64) {
			l, release, err := s.acquireWriter(e.volume(v.ID), token)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			c, _ := find[*cow.Layer](l)
			if err := c.Flatten(ctxT(t), nil); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// strandedFlatten strands a frozen snapshot, runs flatten (as the holder
// of the volume's write lease, with its token), lets a collection run,
// and checks that the sweep finishes the snapshot with its data.
func strandedFlatten(t *testing.T, flatten func(e *env, s *Service, alice Caller, v *meta.Volume, token int64)) {
	defer func(after time.Duration) { strandedAfter = after }(strandedAfter)
	strandedAfter = time.Hour // the sweep below, not the background one
	e, s, kv := lossyEnv(t, Config{})
	alice, v, sn := strandedSnapshot(t, s, kv)
	ctx := ctxT(t)
	model := make([]byte, v.SizeBytes)
	e.fill(s, v.ID, model, 1, [2]int64{0, v.SizeBytes})
	done, token, err := s.asWriter(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.freeze(e.volume(v.ID), sn.ID, token); err != nil {
		done()
		t.Fatal(err)
	}
	flatten(e, s, alice, v, token)
	done()
	frozen := bytes.Clone(model)
	e.fill(s, v.ID, model, 2, [2]int64{0, 8192})
	s.collectSoon()
	e.settle()

	strandedAfter = 0
	s.resumeStranded(ctx)
	got := waitRecord(t, "stranded frozen snapshot", func() *meta.Snapshot { return e.snapshot(sn.ID) },
		func(sn *meta.Snapshot) bool { return sn.Status != meta.StatusCreating })
	if got.Status != meta.StatusAvailable {
		t.Fatalf("stranded frozen snapshot: %s %q", got.Status, got.StatusMessage)
	}
	if !e.hasImage(got.Image) {
		t.Fatalf("the snapshot names image %s, which collection removed", got.Image)
	}
	c, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "c", FromSnapshot: sn.ID})
	if err != nil {
		t.Fatalf("clone of the snapshot: %v", err)
	}
	e.sameVolume(s, c.ID, frozen, "clone of the snapshot")
	e.sameVolume(s, v.ID, model, "volume")
}
