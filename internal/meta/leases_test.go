package meta

import (
	"context"
	"testing"
	"time"
)

// TestVolumeLeaseReleasedElsewhere: a node that is not a volume lease's
// holder only marks the key released; the key stays its holder's (no
// other node can take it) until the holder deletes it or its etcd lease
// ends. The holder acquiring again clears the mark. A watch started after
// the mark reports it.
func TestVolumeLeaseReleasedElsewhere(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	vol := uniq("vol")
	grant := func() int64 {
		id, err := s.GrantLease(ctx, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.RevokeLease(context.Background(), id) })
		return id
	}
	idA, idB := grant(), grant()
	acquire := func(node string, id int64) *VolumeLease {
		t.Helper()
		l, err := s.AcquireVolumeLease(ctx, vol, node, id)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	held := acquire("a", idA)
	if held.Node != "a" || held.Released {
		t.Fatalf("first acquisition: %+v", held)
	}
	none := uniq("vol")
	if hs, err := s.VolumeLeaseHolders(ctx, []string{vol, none}); err != nil || len(hs) != 2 || hs[vol] == nil || *hs[vol] != *held || hs[none] != nil {
		t.Fatalf("VolumeLeaseHolders: %+v, %v; want %s held as %+v, %s held by nobody", hs, err, vol, held, none)
	}

	if err := s.ReleaseVolumeLease(ctx, vol, "b", idB); err != nil {
		t.Fatal(err)
	}
	if l := acquire("b", idB); l.Node != "a" || !l.Released || l.Token != held.Token {
		t.Fatalf("b acquires after releasing a's lease: %+v, want a's key (token %d) marked released", l, held.Token)
	}
	seen := make(chan VolumeLeaseEvent, 16)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go s.WatchVolumeLeases(wctx, func(ev VolumeLeaseEvent) {
		if ev.Volume == vol {
			seen <- ev
		}
	})
	select {
	case ev := <-seen:
		if ev.Lease == nil || ev.Lease.Node != "a" || !ev.Lease.Released {
			t.Fatalf("watch started after the mark reports %+v", ev)
		}
	case <-ctx.Done():
		t.Fatal("a watch started after the mark did not report it")
	}

	if l := acquire("a", idA); l.Node != "a" || l.Released || l.Token != held.Token {
		t.Fatalf("a acquires its released lease again: %+v", l)
	}
	if l, err := s.VolumeLeaseHolder(ctx, vol); err != nil || l == nil || l.Released {
		t.Fatalf("after a took it again: %+v %v, want it held, unmarked", l, err)
	}

	// Marked again, the key goes with a's etcd lease, not before.
	if err := s.ReleaseVolumeLease(ctx, vol, "b", idB); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeLease(ctx, idA); err != nil {
		t.Fatal(err)
	}
	if l := acquire("b", idB); l.Node != "b" || l.Token <= held.Token {
		t.Fatalf("b acquires once a's etcd lease ended: %+v", l)
	}

	// The holder's own release deletes the key.
	if err := s.ReleaseVolumeLease(ctx, vol, "b", idB); err != nil {
		t.Fatal(err)
	}
	if l, err := s.VolumeLeaseHolder(ctx, vol); err != nil || l != nil {
		t.Fatalf("after the holder's release: %+v %v, want none", l, err)
	}
}

// TestVolumeLeaseDeletionWhileWatchDown: a lease key seen by the watch and
// deleted while the watch was down (a break: an election, a lost
// connection) is reported deleted when the watch starts again, at the
// revision it listed the keys at; a key still there is reported as it
// stands.
func TestVolumeLeaseDeletionWhileWatchDown(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	id, err := s.GrantLease(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.RevokeLease(context.Background(), id)
	gone, stays := uniq("vol"), uniq("vol")
	for _, vol := range []string{gone, stays} {
		if _, err := s.AcquireVolumeLease(ctx, vol, "a", id); err != nil {
			t.Fatal(err)
		}
	}
	known := map[string]bool{}
	listed := func() map[string]*VolumeLeaseEvent {
		t.Helper()
		wctx, stop := context.WithCancel(ctx)
		got := map[string]*VolumeLeaseEvent{}
		go func() { time.Sleep(300 * time.Millisecond); stop() }() // the watch "breaks"
		s.watchVolumeLeases(wctx, known, func(ev VolumeLeaseEvent) {
			if ev.Volume == gone || ev.Volume == stays {
				got[ev.Volume] = &ev
			}
		})
		return got
	}
	if got := listed(); got[gone] == nil || got[gone].Lease == nil || got[stays] == nil || got[stays].Lease == nil {
		t.Fatalf("first listing: %+v", got)
	}
	if err := s.ReleaseVolumeLease(ctx, gone, "a", id); err != nil { // while the watch is down
		t.Fatal(err)
	}
	r, err := s.cli.Get(ctx, keyCluster)
	if err != nil {
		t.Fatal(err)
	}
	got := listed()
	if ev := got[gone]; ev == nil || ev.Lease != nil || ev.Rev < r.Header.Revision {
		t.Fatalf("key deleted while the watch was down: %+v, want a deletion at revision ≥ %d", ev, r.Header.Revision)
	}
	if ev := got[stays]; ev == nil || ev.Lease == nil || ev.Lease.Node != "a" {
		t.Fatalf("key still held: %+v", ev)
	}
	if got := listed(); got[gone] != nil {
		t.Fatalf("a deletion reported twice: %+v", got[gone])
	}
}
