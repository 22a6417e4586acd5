package meta

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

func putAttachment(t *testing.T, s *Store) *Attachment {
	t.Helper()
	a := &Attachment{ID: uniq("att"), VolumeID: uniq("vol"), Host: "h", Mode: ModeRW, Export: uniq("exp")}
	if err := s.Update(ctxT(t), func(tx *Tx) error { tx.PutAttachment(a); return nil }); err != nil {
		t.Fatal(err)
	}
	return a
}

func deleteAttachment(t *testing.T, s *Store, a *Attachment) {
	t.Helper()
	if err := s.Update(ctxT(t), func(tx *Tx) error { tx.DeleteAttachment(a); return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestWatchAttachmentDeletesFromRevision: the watch delivers every
// deletion after the revision it is given, also those made before it
// started (a watch that resumes, or starts after AttachmentIDs, misses
// nothing), in order; when that history has been compacted away it ends
// with ErrHistoryCompacted rather than deliver less.
func TestWatchAttachmentDeletesFromRevision(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	a, b, c := putAttachment(t, s), putAttachment(t, s), putAttachment(t, s)
	ids, rev, err := s.AttachmentIDs(ctx)
	if err != nil || !ids[a.ID] || !ids[b.ID] || !ids[c.ID] {
		t.Fatalf("AttachmentIDs: %v, %v", ids, err)
	}
	deleteAttachment(t, s, a)
	deleteAttachment(t, s, b)

	wctx, cancel := context.WithCancel(ctx)
	got := make(chan string, 16)
	ended := make(chan error, 1)
	go func() { ended <- s.WatchAttachmentDeletes(wctx, rev, func(id string) { got <- id }) }()
	for _, want := range []string{a.ID, b.ID} {
		select {
		case id := <-got:
			if id != want {
				t.Fatalf("delivered %s, want %s", id, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("deletion of %s, made before the watch started, not delivered", want)
		}
	}
	deleteAttachment(t, s, c)
	select {
	case id := <-got:
		if id != c.ID {
			t.Fatalf("delivered %s, want %s", id, c.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("deletion of %s not delivered", c.ID)
	}
	cancel()
	if err := <-ended; err != nil {
		t.Fatalf("watch ended by its context: %v", err)
	}

	// Compact past rev: watching from it can no longer see everything.
	d := putAttachment(t, s)
	defer deleteAttachment(t, s, d)
	r, err := s.cli.Get(ctx, keyCluster)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.cli.Compact(ctx, r.Header.Revision); err != nil {
		t.Fatal(err)
	}
	err = s.WatchAttachmentDeletes(ctx, rev, func(id string) { t.Errorf("delivered %s from compacted history", id) })
	if !errors.Is(err, ErrHistoryCompacted) {
		t.Fatalf("watch from a compacted revision: %v, want ErrHistoryCompacted", err)
	}
	ids, rev2, err := s.AttachmentIDs(ctx)
	if err != nil || ids[a.ID] || ids[b.ID] || ids[c.ID] || !ids[d.ID] || rev2 < r.Header.Revision {
		t.Fatalf("AttachmentIDs after the deletions: %v at %d (compacted at %d), %v", ids, rev2, r.Header.Revision, err)
	}
}

// TestWatchFromResumes: the watch behind WatchVolumes and WatchSnapshots,
// resumed after a break at the revision after the last event it
// delivered, delivers the writes made while it was down, then the new
// ones, advancing its revision past each; from compacted history it
// reports that, so that the caller lists the records instead.
func TestWatchFromResumes(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	r, err := s.cli.Get(ctx, keyCluster)
	if err != nil {
		t.Fatal(err)
	}
	from := r.Header.Revision + 1
	put := func(v *Volume) {
		if err := s.Update(ctx, func(tx *Tx) error { tx.PutVolume(v); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	v1 := &Volume{ID: uniq("vol"), Name: "while-down"}
	put(v1) // while "down": before the watch (re)starts

	wctx, cancel := context.WithCancel(ctx)
	got := make(chan string, 16)
	next := from
	ended := make(chan bool, 1)
	go func() {
		ended <- watchFrom(wctx, s, prefixVolumes, &next, func(kv *mvccpb.KeyValue) { got <- string(kv.Key) })
	}()
	v2 := &Volume{ID: uniq("vol"), Name: "after"}
	put(v2)
	var keys []string
	for len(keys) < 2 {
		select {
		case k := <-got:
			if k == volumeKey(v1.ID) || k == volumeKey(v2.ID) { // the shared member has other tests' writes
				keys = append(keys, k)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("delivered %v, want the writes of %s then %s", keys, v1.ID, v2.ID)
		}
	}
	if keys[0] != volumeKey(v1.ID) || keys[1] != volumeKey(v2.ID) {
		t.Fatalf("delivered %v, want %s then %s", keys, volumeKey(v1.ID), volumeKey(v2.ID))
	}
	cancel()
	if ok := <-ended; !ok {
		t.Fatal("watch ended by its context reported compaction")
	}
	r2, err := s.cli.Get(ctx, volumeKey(v2.ID))
	if err != nil || len(r2.Kvs) != 1 {
		t.Fatalf("read back %s: %v", v2.ID, err)
	}
	if next <= r2.Kvs[0].ModRevision {
		t.Fatalf("next revision %d not past the last delivered write's %d", next, r2.Kvs[0].ModRevision)
	}

	r3, err := s.cli.Get(ctx, keyCluster)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.cli.Compact(ctx, r3.Header.Revision); err != nil {
		t.Fatal(err)
	}
	old := from
	if watchFrom(ctx, s, prefixVolumes, &old, func(kv *mvccpb.KeyValue) {}) {
		t.Fatal("watch from compacted history reported no compaction")
	}
	for _, v := range []*Volume{v1, v2} {
		if err := s.Update(ctx, func(tx *Tx) error { tx.DeleteVolume(v.ID); return nil }); err != nil {
			t.Fatal(err)
		}
	}
}
