package volume

import (
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
)

// lossyEnv is an env whose service talks to etcd over a connection of its
// own that the test can make lose a commit's reply (metatest.LoseReply).
func lossyEnv(t *testing.T, cfg Config) (*env, *Service, *metatest.KV) {
	e := newEnv(t)
	e.meta = metatest.Shared(t).Connect(t)
	kv := metatest.StallableKV(e.meta)
	return e, e.started(cfg), kv
}

// writes reports whether key is the record of kind ("volumes",
// "snapshots") with id (any id: "").
func writes(kind, id string) func(string) bool {
	return func(key string) bool {
		i := strings.LastIndex(key, "/"+kind+"/")
		return i >= 0 && (id == "" || key[i+len(kind)+2:] == id)
	}
}

// waitRecord polls get until ok accepts its record, for up to 10 s.
func waitRecord[T any](t *testing.T, what string, get func() T, ok func(T) bool) T {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		r := get()
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %+v", what, r)
		}
	}
}

// TestStrandedExtendResumed: an extend whose recording commit lost its
// reply fails for its caller, but the record is there — extending, for
// this node — and nothing else drives it until a restart; meanwhile the
// volume refuses every other workflow. The node's sweep finishes it.
func TestStrandedExtendResumed(t *testing.T) {
	every, after := orphanSweepEvery, strandedAfter
	orphanSweepEvery, strandedAfter = 100*time.Millisecond, 300*time.Millisecond
	t.Cleanup(func() { orphanSweepEvery, strandedAfter = every, after })
	e, s, kv := lossyEnv(t, Config{AdoptOrphans: true})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	kv.LoseReply(writes("volumes", v.ID))
	if _, err := s.ExtendVolume(ctx, alice, v.ID, 2<<20); !errs.IsCode(err, errs.CodeMetadataUnavailable) {
		t.Fatalf("extend whose commit lost its reply: %v, want %s", err, errs.CodeMetadataUnavailable)
	}
	if got := e.volume(v.ID); got.Status != meta.StatusExtending {
		t.Fatalf("after the lost reply the volume is %s, want %s (the record committed)", got.Status, meta.StatusExtending)
	}
	got := waitRecord(t, "stranded extend", func() *meta.Volume { return e.volume(v.ID) },
		func(v *meta.Volume) bool { return v.Status == meta.StatusAvailable })
	if got.SizeBytes != 2<<20 || got.TargetSize != 0 {
		t.Errorf("after the sweep: size %d, target %d; want %d, 0", got.SizeBytes, got.TargetSize, 2<<20)
	}
	if _, err := s.ExtendVolume(ctx, alice, v.ID, 3<<20); err != nil {
		t.Errorf("next extend: %v", err)
	}
}

// strandedSnapshot makes a snapshot of a new volume whose recording commit
// loses its reply, so the call fails and the record stays creating.
func strandedSnapshot(t *testing.T, s *Service, kv *metatest.KV) (alice Caller, v *meta.Volume, sn *meta.Snapshot) {
	ctx := ctxT(t)
	alice = caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	kv.LoseReply(writes("snapshots", ""))
	if _, err := s.CreateSnapshot(ctx, alice, v.ID, "s1", ""); !errs.IsCode(err, errs.CodeMetadataUnavailable) {
		t.Fatalf("snapshot whose commit lost its reply: %v, want %s", err, errs.CodeMetadataUnavailable)
	}
	if sn, err = s.Snapshot(ctx, alice, "s1"); err != nil || sn.Status != meta.StatusCreating {
		t.Fatalf("after the lost reply: %+v, %v; want it recorded, creating", sn, err)
	}
	return alice, v, sn
}

// TestStrandedSnapshotFails: a stranded snapshot that was never frozen
// fails (frozen now, it would hold writes made after it was asked for),
// and the volume takes snapshots again.
func TestStrandedSnapshotFails(t *testing.T) {
	defer func(after time.Duration) { strandedAfter = after }(strandedAfter)
	strandedAfter = 0
	e, s, kv := lossyEnv(t, Config{})
	alice, v, sn := strandedSnapshot(t, s, kv)
	ctx := ctxT(t)
	s.resumeStranded(ctx)
	got := waitRecord(t, "stranded snapshot", func() *meta.Snapshot { return e.snapshot(sn.ID) },
		func(sn *meta.Snapshot) bool { return sn.Status != meta.StatusCreating })
	if got.Status != meta.StatusError || !strings.Contains(got.StatusMessage, "before the volume was frozen") {
		t.Errorf("stranded snapshot: %s %q; want error, not frozen", got.Status, got.StatusMessage)
	}
	if len(e.volume(v.ID).Snapshotting) != 0 {
		t.Errorf("volume still snapshotting %v", e.volume(v.ID).Snapshotting)
	}
	if err := s.DeleteSnapshot(ctx, alice, sn.ID); err != nil {
		t.Errorf("delete the failed snapshot: %v", err)
	}
	if _, err := s.CreateSnapshot(ctx, alice, v.ID, "s2", ""); err != nil {
		t.Errorf("next snapshot: %v", err)
	}
}

// TestStrandedSnapshotFrozenFinished: a stranded snapshot whose freeze was
// done (only the commit after it failed) is finished: the freeze was exact.
func TestStrandedSnapshotFrozenFinished(t *testing.T) {
	defer func(after time.Duration) { strandedAfter = after }(strandedAfter)
	strandedAfter = 0
	e, s, kv := lossyEnv(t, Config{})
	_, v, sn := strandedSnapshot(t, s, kv)
	ctx := ctxT(t)
	done, token, err := s.asWriter(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	froze, err := s.freeze(e.volume(v.ID), sn.ID, token)
	done()
	if err != nil {
		t.Fatal(err)
	}
	s.resumeStranded(ctx)
	got := waitRecord(t, "stranded frozen snapshot", func() *meta.Snapshot { return e.snapshot(sn.ID) },
		func(sn *meta.Snapshot) bool { return sn.Status != meta.StatusCreating })
	if got.Status != meta.StatusAvailable || got.Image != froze {
		t.Errorf("stranded frozen snapshot: %s %q, image %q; want available, image %q", got.Status, got.StatusMessage, got.Image, froze)
	}
}

// TestSweepLeavesClaimedWorkflows: a record whose driver in this process
// claims it is not stranded, however old; without the claim it is.
func TestSweepLeavesClaimedWorkflows(t *testing.T) {
	defer func(after time.Duration) { strandedAfter = after }(strandedAfter)
	strandedAfter = 0
	e, s, kv := lossyEnv(t, Config{})
	_, _, sn := strandedSnapshot(t, s, kv)
	ctx := ctxT(t)
	s.claim("snapshot/" + sn.ID)
	s.resumeStranded(ctx)
	time.Sleep(300 * time.Millisecond)
	if got := e.snapshot(sn.ID); got.Status != meta.StatusCreating {
		t.Fatalf("a sweep settled a claimed snapshot: %s %q", got.Status, got.StatusMessage)
	}
	s.unclaim("snapshot/" + sn.ID)
	strandedAfter = time.Hour
	s.resumeStranded(ctx)
	time.Sleep(300 * time.Millisecond)
	if got := e.snapshot(sn.ID); got.Status != meta.StatusCreating {
		t.Fatalf("a sweep settled a snapshot recorded a moment ago: %s %q", got.Status, got.StatusMessage)
	}
	strandedAfter = 0
	s.resumeStranded(ctx)
	waitRecord(t, "unclaimed stranded snapshot", func() *meta.Snapshot { return e.snapshot(sn.ID) },
		func(sn *meta.Snapshot) bool { return sn.Status == meta.StatusError })
}
