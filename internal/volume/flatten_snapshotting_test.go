package volume

import (
	"bytes"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestFlattenDuringStrandedSnapshot: a snapshot whose freeze is done but
// whose record does not name its image yet (its commit lost its reply:
// stranded until the sweep finishes it) is held by nothing but the
// volume's chain. A flatten started meanwhile would cut the chain there,
// and the collection after it would remove the frozen image (and its
// ancestors), which the sweep then records as the snapshot's: a snapshot
// of nothing. The flatten waits for the snapshot, as an extend or a
// delete does; the snapshot, once finished, holds its data.
func TestFlattenDuringStrandedSnapshot(t *testing.T) {
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
	done()
	frozen := bytes.Clone(model)
	e.fill(s, v.ID, model, 2, [2]int64{0, 8192})

	_, err = s.StartJob(ctx, alice, v.ID, meta.JobFlatten)
	switch {
	case err == nil:
		e.flattened(v.ID, "flatten during a stranded snapshot")
		e.settle()
	case !errs.IsCode(err, errs.CodeVolumeBusy):
		t.Fatalf("flatten during a stranded snapshot: %v, want it run or refused as busy", err)
	}
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
	e.sameVolume(s, c.ID, frozen, "clone of the snapshot taken before the flatten")
	e.sameVolume(s, v.ID, model, "volume")
}
