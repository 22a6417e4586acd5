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
// names. (Before the owned index, each of her lists read every record of
// its kind in the cluster.)
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

	// An admin still sees everyone's.
	all, err := s.Volumes(ctx, adminCaller)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range mine {
		if !slices.ContainsFunc(all, func(x *meta.Volume) bool { return x.ID == v.ID }) {
			t.Errorf("the admin's list misses %s", v.ID)
		}
	}
}
