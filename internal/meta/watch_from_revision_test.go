package meta

import (
	"context"
	"testing"
	"time"
)

// TestWatchVolumesFromRevision: WatchVolumes from the revision after
// Revision's delivers a record written between the two calls — before
// the watch started. A node's start (volume.Service.Start) reads the
// revision, starts the watch for workflows delegated to it and then lists
// the records: a watch from "now" started a moment after the list missed
// a record delegated in between, left in its transition until the next
// restart.
func TestWatchVolumesFromRevision(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	rev, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v := &Volume{ID: uniq("vol"), Name: "between"}
	if err := s.Update(ctx, func(tx *Tx) error { tx.PutVolume(v); return nil }); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan string, 64)
	go s.WatchVolumes(wctx, rev+1, func(w *Volume) { got <- w.ID })
	for deadline := time.After(10 * time.Second); ; {
		select {
		case id := <-got:
			if id == v.ID {
				return
			}
		case <-deadline:
			t.Fatalf("a volume written after revision %d, before the watch from %d started, was not delivered", rev, rev+1)
		}
	}
}
