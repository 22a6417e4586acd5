package volume

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
	"github.com/basalt-storage/basalt/internal/store"
)

// TestListsReadOwnRecords is the scale property of lists: alice has 3
// volumes — one attached, one snapshotted — among 500 volumes, 500
// snapshots and 500 attachments of others; her lists read her records
// only, and the attachments of one volume are read by the ids its record
// names. An admin's page of 2 of everything reads 2 records of its kind,
// and paging through everything gives every record once, in order.
// (Before the owned index, each of these lists read every record of its
// kind in the cluster.)
func TestListsReadOwnRecords(t *testing.T) {
	m := metatest.Shared(t).Connect(t) // its reads all go through its client
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := New(m, st, Config{Node: uniq("node"), ImageGrace: -1}, quietLog())
	t.Cleanup(s.Stop)
	ctx := ctxT(t)
	alice := caller("alice")
	now := time.Now().UTC()
	var vols, snaps []string
	var atts []*meta.Attachment
	update := func(fn func(tx *meta.Tx)) {
		t.Helper()
		if err := m.Update(ctx, func(tx *meta.Tx) error { fn(tx); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for i := range max(len(vols), len(snaps), len(atts)) {
			m.Update(context.Background(), func(tx *meta.Tx) error {
				if i < len(atts) {
					tx.DeleteAttachment(atts[i])
				}
				if i < len(snaps) {
					tx.DeleteSnapshot(snaps[i])
				}
				if i < len(vols) {
					tx.DeleteVolume(vols[i])
				}
				return nil
			})
		}
	})
	// Records only (no stacks, no capacity): lists read metadata alone.
	for range 5 {
		update(func(tx *meta.Tx) {
			for range 100 {
				owner := uniq("crowd")
				v := &meta.Volume{ID: newID("vol-"), OwnerID: owner, Status: meta.StatusInUse, CreatedAt: now}
				a := &meta.Attachment{ID: newID("att-"), VolumeID: v.ID, OwnerID: owner, Host: "h", Mode: meta.ModeRO, Export: exportSecret(), CreatedAt: now}
				v.Attachments = []string{a.ID}
				sn := &meta.Snapshot{ID: newID("snap-"), OwnerID: owner, VolumeID: v.ID, Status: meta.StatusAvailable, CreatedAt: now}
				tx.PutVolume(v)
				tx.PutAttachment(a)
				tx.PutSnapshot(sn)
				vols, snaps, atts = append(vols, v.ID), append(snaps, sn.ID), append(atts, a)
			}
		})
	}
	var mine []*meta.Volume
	update(func(tx *meta.Tx) {
		for i := range 3 {
			v := &meta.Volume{ID: newID("vol-"), OwnerID: alice.ID, Owner: alice.Name,
				Status: meta.StatusAvailable, CreatedAt: now.Add(time.Duration(i) * time.Second)}
			mine = append(mine, v)
		}
		a := &meta.Attachment{ID: newID("att-"), VolumeID: mine[0].ID, OwnerID: alice.ID, Host: "h", Mode: meta.ModeRW, Export: exportSecret(), CreatedAt: now}
		mine[0].Attachments, mine[0].Status = []string{a.ID}, meta.StatusInUse
		sn := &meta.Snapshot{ID: newID("snap-"), OwnerID: alice.ID, VolumeID: mine[1].ID, Status: meta.StatusAvailable, CreatedAt: now}
		for _, v := range mine {
			tx.PutVolume(v)
			vols = append(vols, v.ID)
		}
		tx.PutAttachment(a)
		tx.PutSnapshot(sn)
		snaps, atts = append(snaps, sn.ID), append(atts, a)
	})

	reads := metatest.CountReads(m)
	read := func(what string, records string, want int) {
		t.Helper()
		if n := reads.Count(meta.Prefix + records + "/"); n != want {
			t.Errorf("%s read %d %s records, want %d", what, n, records, want)
		}
		reads.Reset()
	}
	vs, err := s.Volumes(ctx, alice)
	if err != nil || len(vs) != 3 || vs[0].ID != mine[0].ID || vs[2].ID != mine[2].ID {
		t.Fatalf("alice's volumes: %d, %v", len(vs), err)
	}
	read("alice's volume list", "volumes", 3)
	ss, err := s.Snapshots(ctx, alice, "")
	if err != nil || len(ss) != 1 {
		t.Fatalf("alice's snapshots: %d, %v", len(ss), err)
	}
	read("alice's snapshot list", "snapshots", 1)
	as, err := s.Attachments(ctx, alice, "")
	if err != nil || len(as) != 1 {
		t.Fatalf("alice's attachments: %d, %v", len(as), err)
	}
	read("alice's attachment list", "attachments", 1)

	// One volume's: its record, then its own.
	if ss, err := s.Snapshots(ctx, alice, mine[1].ID); err != nil || len(ss) != 1 {
		t.Fatalf("snapshots of %s: %d, %v", mine[1].ID, len(ss), err)
	}
	read("the snapshot list of one volume", "snapshots", 1)
	if as, err := s.Attachments(ctx, alice, mine[0].ID); err != nil || len(as) != 1 || as[0].VolumeID != mine[0].ID {
		t.Fatalf("attachments of %s: %d, %v", mine[0].ID, len(as), err)
	}
	read("the attachment list of one volume", "attachments", 1)
	if as, err := s.Attachments(ctx, adminCaller, mine[0].ID); err != nil || len(as) != 1 {
		t.Fatalf("admin: attachments of %s: %d, %v", mine[0].ID, len(as), err)
	}
	read("an admin's attachment list of one volume", "attachments", 1)

	// An admin's page of everything reads the page's records, not every
	// record of the cluster (before the all-owners index, all 501 to 503),
	// from the first and from the middle (after the median of this
	// test's, all made at once: ties ordered by id).
	median := func(ids []string) *meta.Position {
		ids = slices.Sorted(slices.Values(ids))
		return &meta.Position{Created: now, ID: ids[len(ids)/2]}
	}
	var attIDs []string
	for _, a := range atts {
		attIDs = append(attIDs, a.ID)
	}
	for _, after := range []bool{false, true} {
		p := meta.Page{Limit: 2}
		if after {
			p.After = median(vols)
		}
		vs, err := s.VolumesPage(ctx, adminCaller, p)
		if err != nil || len(vs) != 2 || after && !p.After.Before(vs[0].Position()) {
			t.Fatalf("an admin's page %+v of volumes: %d, %v", p, len(vs), err)
		}
		read("an admin's page of 2 volumes", "volumes", 2)
		if after {
			p.After = median(snaps)
		}
		ss, err := s.SnapshotsPage(ctx, adminCaller, "", p)
		if err != nil || len(ss) != 2 || after && !p.After.Before(ss[0].Position()) {
			t.Fatalf("an admin's page %+v of snapshots: %d, %v", p, len(ss), err)
		}
		read("an admin's page of 2 snapshots", "snapshots", 2)
		if after {
			p.After = median(attIDs)
		}
		as, err := s.AttachmentsPage(ctx, adminCaller, "", p)
		if err != nil || len(as) != 2 || after && !p.After.Before(as[0].Position()) {
			t.Fatalf("an admin's page %+v of attachments: %d, %v", p, len(as), err)
		}
		read("an admin's page of 2 attachments", "attachments", 2)
	}

	// An admin still sees everyone's: paged through, every record once,
	// in order, this test's among them.
	allPages := func(what string, page func(meta.Page) ([]positioned, error), want []string) {
		t.Helper()
		var seen []meta.Position
		p := meta.Page{Limit: 7}
		for {
			got, err := page(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range got {
				pos := r.Position()
				if len(seen) > 0 && !seen[len(seen)-1].Before(pos) {
					t.Fatalf("an admin's %s: %v after %v", what, pos, seen[len(seen)-1])
				}
				seen = append(seen, pos)
			}
			if len(got) < p.Limit {
				break
			}
			last := got[len(got)-1].Position()
			p.After = &last
		}
		for _, id := range want {
			if !slices.ContainsFunc(seen, func(pos meta.Position) bool { return pos.ID == id }) {
				t.Errorf("an admin's %s miss %s", what, id)
			}
		}
	}
	allPages("volumes", func(p meta.Page) ([]positioned, error) {
		rs, err := s.VolumesPage(ctx, adminCaller, p)
		return asPositioned(rs), err
	}, vols)
	allPages("snapshots", func(p meta.Page) ([]positioned, error) {
		rs, err := s.SnapshotsPage(ctx, adminCaller, "", p)
		return asPositioned(rs), err
	}, snaps)
	allPages("attachments", func(p meta.Page) ([]positioned, error) {
		rs, err := s.AttachmentsPage(ctx, adminCaller, "", p)
		return asPositioned(rs), err
	}, attIDs)
}

func asPositioned[T positioned](rs []T) []positioned {
	out := make([]positioned, len(rs))
	for i, r := range rs {
		out[i] = r
	}
	return out
}
