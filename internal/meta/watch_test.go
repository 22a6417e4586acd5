package meta

import (
	"context"
	"errors"
	"testing"
	"time"
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
