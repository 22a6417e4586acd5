package meta

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/pki"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ownedKeys lists the owned-index keys of owner's records of kind k.
func ownedKeys(t *testing.T, s *Store, k ownedKind, owner string) []string {
	t.Helper()
	resp, err := s.cli.Get(ctxT(t), k.prefix(owner), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

// allKeysOf lists the all-owners index keys of record id of kind k.
func allKeysOf(t *testing.T, s *Store, k ownedKind, id string) []string {
	t.Helper()
	resp, err := s.cli.Get(ctxT(t), k.allPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		if strings.HasSuffix(string(kv.Key), "/"+id) {
			out = append(out, string(kv.Key))
		}
	}
	return out
}

func update(t *testing.T, s *Store, fn func(tx *Tx)) {
	t.Helper()
	if err := s.Update(ctxT(t), func(tx *Tx) error { fn(tx); return nil }); err != nil {
		t.Fatal(err)
	}
}

func idsOf[T interface{ Position() Position }](rs []T) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.Position().ID)
	}
	return out
}

// checkPaging pages through list with every limit from 1 to 8, each
// page after the last one's final position, and checks that each paging
// returns want, in order, and no page more than its limit.
func checkPaging(t *testing.T, want []string, list func(Page) ([]*Volume, error)) {
	t.Helper()
	for limit := 1; limit <= 8; limit++ {
		var paged []string
		p := Page{Limit: limit}
		for {
			got, err := list(p)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) > limit {
				t.Fatalf("limit %d: a page of %d", limit, len(got))
			}
			paged = append(paged, idsOf(got)...)
			if len(got) < limit {
				break
			}
			after := got[len(got)-1].Position()
			p.After = &after
		}
		if !slices.Equal(paged, want) {
			t.Errorf("paged by %d: %v, want %v", limit, paged, want)
		}
	}
}

// TestOwnedIndexMaintained: the Tx methods that write and delete volumes,
// snapshots and attachments keep exactly a record's owned-index keys,
// named by its owner and creation time; a record rewritten with another
// creation time or owner (nothing does that, but nothing forbids it)
// moves its keys.
func TestOwnedIndexMaintained(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	owner, other := uniq("owner"), uniq("owner")
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 5, time.UTC)
	v := &Volume{ID: uniq("vol"), OwnerID: owner, Status: StatusAvailable, CreatedAt: t0}
	sn := &Snapshot{ID: uniq("snap"), OwnerID: owner, VolumeID: v.ID, Status: StatusAvailable, CreatedAt: t0.Add(time.Second)}
	a := &Attachment{ID: uniq("att"), OwnerID: owner, VolumeID: v.ID, Export: uniq("exp"), CreatedAt: t0.Add(2 * time.Second)}
	update(t, s, func(tx *Tx) { tx.PutVolume(v); tx.PutSnapshot(sn); tx.PutAttachment(a) })
	for _, c := range []struct {
		k    ownedKind
		id   string
		when time.Time
	}{{ownedVolumes, v.ID, v.CreatedAt}, {ownedSnapshots, sn.ID, sn.CreatedAt}, {ownedAttachments, a.ID, a.CreatedAt}} {
		if got, want := ownedKeys(t, s, c.k, owner), []string{c.k.key(owner, c.when, c.id)}; !slices.Equal(got, want) {
			t.Errorf("%s index after create: %v, want %v", c.k.name, got, want)
		}
		if got, want := allKeysOf(t, s, c.k, c.id), []string{c.k.allKey(c.when, c.id)}; !slices.Equal(got, want) {
			t.Errorf("%s all-owners index after create: %v, want %v", c.k.name, got, want)
		}
	}

	// An update keeps the one key.
	v.Status, v.SizeBytes = StatusInUse, 4096
	sn.Status = StatusDeleting
	update(t, s, func(tx *Tx) { tx.PutVolume(v); tx.PutSnapshot(sn); tx.PutAttachment(a) })
	if n := len(ownedKeys(t, s, ownedVolumes, owner)) + len(ownedKeys(t, s, ownedSnapshots, owner)) + len(ownedKeys(t, s, ownedAttachments, owner)); n != 3 {
		t.Errorf("%d index keys after an update, want 3", n)
	}
	vs, err := s.OwnedVolumes(ctx, owner, Page{})
	if err != nil || len(vs) != 1 || vs[0].Status != StatusInUse {
		t.Fatalf("OwnedVolumes after update: %+v, %v", vs, err)
	}

	// A changed creation time or owner moves the key.
	v.CreatedAt = t0.Add(time.Hour)
	update(t, s, func(tx *Tx) { tx.PutVolume(v) })
	if got, want := ownedKeys(t, s, ownedVolumes, owner), []string{ownedVolumes.key(owner, v.CreatedAt, v.ID)}; !slices.Equal(got, want) {
		t.Errorf("volume index after a new created_at: %v, want %v", got, want)
	}
	if got, want := allKeysOf(t, s, ownedVolumes, v.ID), []string{ownedVolumes.allKey(v.CreatedAt, v.ID)}; !slices.Equal(got, want) {
		t.Errorf("volume all-owners index after a new created_at: %v, want %v", got, want)
	}
	sn.OwnerID = other
	update(t, s, func(tx *Tx) { tx.PutSnapshot(sn) })
	if got := ownedKeys(t, s, ownedSnapshots, owner); len(got) != 0 {
		t.Errorf("the old owner keeps snapshot keys %v", got)
	}
	if got, err := s.OwnedSnapshots(ctx, other, Page{}, nil); err != nil || !slices.Equal(idsOf(got), []string{sn.ID}) {
		t.Errorf("the new owner's snapshots: %v, %v", idsOf(got), err)
	}
	if got, want := allKeysOf(t, s, ownedSnapshots, sn.ID), []string{ownedSnapshots.allKey(sn.CreatedAt, sn.ID)}; !slices.Equal(got, want) {
		t.Errorf("snapshot all-owners index after a new owner: %v, want %v", got, want)
	}
	// Two writes of one record in one transaction leave the last one's key.
	update(t, s, func(tx *Tx) {
		a.CreatedAt = t0.Add(3 * time.Second)
		tx.PutAttachment(a)
		a.CreatedAt = t0.Add(4 * time.Second)
		tx.PutAttachment(a)
	})
	if got, want := ownedKeys(t, s, ownedAttachments, owner), []string{ownedAttachments.key(owner, a.CreatedAt, a.ID)}; !slices.Equal(got, want) {
		t.Errorf("attachment index after two writes in one transaction: %v, want %v", got, want)
	}
	if got, want := allKeysOf(t, s, ownedAttachments, a.ID), []string{ownedAttachments.allKey(a.CreatedAt, a.ID)}; !slices.Equal(got, want) {
		t.Errorf("attachment all-owners index after two writes in one transaction: %v, want %v", got, want)
	}

	update(t, s, func(tx *Tx) { tx.DeleteAttachment(a); tx.DeleteSnapshot(sn.ID); tx.DeleteVolume(v.ID) })
	for _, o := range []string{owner, other} {
		for _, k := range ownedKinds {
			if got := ownedKeys(t, s, k, o); len(got) != 0 {
				t.Errorf("%s index keys left after delete: %v", k.name, got)
			}
		}
	}
	for _, c := range []struct {
		k  ownedKind
		id string
	}{{ownedVolumes, v.ID}, {ownedSnapshots, sn.ID}, {ownedAttachments, a.ID}} {
		if got := allKeysOf(t, s, c.k, c.id); len(got) != 0 {
			t.Errorf("%s all-owners index keys left after delete: %v", c.k.name, got)
		}
	}
	// Deleting what is not there is harmless.
	update(t, s, func(tx *Tx) { tx.DeleteVolume(v.ID); tx.DeleteSnapshot(sn.ID) })
}

// TestOwnedPage: an owner's list through the index is in (created, id)
// order, holds only the owner's records, and pages with after and limit:
// a page goes on after its position even when that record is gone.
func TestOwnedPage(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	owner, other := uniq("owner"), uniq("owner")
	base := time.Now().UTC().Truncate(time.Second)
	var mine []*Volume
	update(t, s, func(tx *Tx) {
		for i, d := range []int{3, 1, 2, 2, 2, 0, 5} { // ties at 2 are ordered by id
			v := &Volume{ID: "vol-" + string(rune('g'-i)) + uniq(""), OwnerID: owner, Status: StatusAvailable,
				CreatedAt: base.Add(time.Duration(d) * time.Millisecond)}
			tx.PutVolume(v)
			mine = append(mine, v)
			tx.PutVolume(&Volume{ID: uniq("vol"), OwnerID: other, Status: StatusAvailable, CreatedAt: v.CreatedAt})
		}
	})
	t.Cleanup(func() {
		s.Update(context.Background(), func(tx *Tx) error {
			for _, v := range mine {
				tx.DeleteVolume(v.ID)
			}
			for _, v := range errOf2(s.OwnedVolumes(context.Background(), other, Page{})) {
				tx.DeleteVolume(v.ID)
			}
			return nil
		})
	})
	slices.SortFunc(mine, func(a, b *Volume) int {
		if a.Position().Before(b.Position()) {
			return -1
		}
		return 1
	})
	want := idsOf(mine)
	all, err := s.OwnedVolumes(ctx, owner, Page{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(idsOf(all), want) {
		t.Fatalf("OwnedVolumes: %v, want %v", idsOf(all), want)
	}
	checkPaging(t, want, func(p Page) ([]*Volume, error) { return s.OwnedVolumes(ctx, owner, p) })
	// After a position whose record is gone.
	gone := mine[2].Position()
	update(t, s, func(tx *Tx) { tx.DeleteVolume(gone.ID) })
	got, err := s.OwnedVolumes(ctx, owner, Page{After: &gone, Limit: 2})
	if err != nil || !slices.Equal(idsOf(got), want[3:5]) {
		t.Errorf("after a deleted record: %v, %v; want %v", idsOf(got), err, want[3:5])
	}
	// A position between records, and one past the end.
	mid := Position{Created: mine[0].CreatedAt.Add(time.Microsecond)}
	if got, _ := s.OwnedVolumes(ctx, owner, Page{After: &mid}); !slices.Equal(idsOf(got), slices.Delete(slices.Clone(want[1:]), 1, 2)) {
		t.Errorf("after %v: %v", mid, idsOf(got))
	}
	end := Position{Created: base.Add(time.Hour)}
	if got, err := s.OwnedVolumes(ctx, owner, Page{After: &end}); err != nil || len(got) != 0 {
		t.Errorf("after the end: %v, %v", idsOf(got), err)
	}
	if got, err := s.OwnedVolumes(ctx, uniq("nobody"), Page{}); err != nil || len(got) != 0 {
		t.Errorf("an owner without volumes: %v, %v", idsOf(got), err)
	}
}

// TestOwnedSnapshotsKeep: a filtered list pages over the kept records
// only, however few of the owner's records are kept.
func TestOwnedSnapshotsKeep(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	owner := uniq("owner")
	vol := uniq("vol")
	base := time.Now().UTC()
	var want []string
	var made []string
	update(t, s, func(tx *Tx) {
		for i := range 150 {
			sn := &Snapshot{ID: uniq("snap"), OwnerID: owner, VolumeID: uniq("vol"), Status: StatusAvailable, CreatedAt: base.Add(time.Duration(i) * time.Millisecond)}
			if i%70 == 3 {
				sn.VolumeID = vol
				want = append(want, sn.ID)
			}
			tx.PutSnapshot(sn)
			made = append(made, sn.ID)
		}
	})
	t.Cleanup(func() {
		s.Update(context.Background(), func(tx *Tx) error {
			for _, id := range made {
				tx.DeleteSnapshot(id)
			}
			return nil
		})
	})
	keep := func(sn *Snapshot) bool { return sn.VolumeID == vol }
	var paged []string
	p := Page{Limit: 1}
	for {
		got, err := s.OwnedSnapshots(ctx, owner, p, keep)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, idsOf(got)...)
		if len(got) < 1 {
			break
		}
		after := got[0].Position()
		p.After = &after
	}
	if !slices.Equal(paged, want) {
		t.Errorf("kept snapshots paged by 1: %v, want %v", paged, want)
	}
	if got, err := s.OwnedSnapshots(ctx, owner, Page{}, keep); err != nil || !slices.Equal(idsOf(got), want) {
		t.Errorf("kept snapshots: %v, %v", idsOf(got), err)
	}
}

func errOf2[T any](v T, _ error) T { return v }

// countingKV counts the keys etcd answers with under prefix, in Gets and
// in the Gets of transactions.
type countingKV struct {
	clientv3.KV
	prefix string
	n      atomic.Int64
}

func (k *countingKV) count(kvs int, key func(int) string) {
	for i := range kvs {
		if strings.HasPrefix(key(i), k.prefix) {
			k.n.Add(1)
		}
	}
}

func (k *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if err == nil {
		k.count(len(resp.Kvs), func(i int) string { return string(resp.Kvs[i].Key) })
	}
	return resp, err
}

func (k *countingKV) Txn(ctx context.Context) clientv3.Txn {
	return &countingTxn{Txn: k.KV.Txn(ctx), k: k}
}

type countingTxn struct {
	clientv3.Txn
	k *countingKV
}

func (t *countingTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *countingTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *countingTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *countingTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil {
		for _, r := range resp.Responses {
			if rr := r.GetResponseRange(); rr != nil {
				t.k.count(len(rr.Kvs), func(i int) string { return string(rr.Kvs[i].Key) })
			}
		}
	}
	return resp, err
}

// TestOwnedReadsOwnRecords is the scale property: an owner's list reads
// the owner's records only — 3, not the 500 others' — and a page reads
// about its limit.
func TestOwnedReadsOwnRecords(t *testing.T) {
	openTestStore(t)
	ctx := ctxT(t)
	// A store of its own on the member, without a member of its own:
	// every read goes through its client, where it is counted.
	s := clientStore(t)
	owner := uniq("owner")
	var made []string
	for range 5 {
		update(t, s, func(tx *Tx) {
			for range 100 {
				v := &Volume{ID: uniq("vol"), OwnerID: uniq("crowd"), Status: StatusAvailable, CreatedAt: time.Now().UTC()}
				tx.PutVolume(v)
				made = append(made, v.ID)
			}
		})
	}
	update(t, s, func(tx *Tx) {
		for range 3 {
			v := &Volume{ID: uniq("vol"), OwnerID: owner, Status: StatusAvailable, CreatedAt: time.Now().UTC()}
			tx.PutVolume(v)
			made = append(made, v.ID)
		}
	})
	t.Cleanup(func() {
		for ids := range slices.Chunk(made, 200) {
			s.Update(context.Background(), func(tx *Tx) error {
				for _, id := range ids {
					tx.DeleteVolume(id)
				}
				return nil
			})
		}
	})
	records := &countingKV{KV: s.cli.KV, prefix: prefixVolumes}
	s.cli.KV = records
	vs, err := s.OwnedVolumes(ctx, owner, Page{})
	if err != nil || len(vs) != 3 {
		t.Fatalf("OwnedVolumes: %d volumes, %v", len(vs), err)
	}
	if n := records.n.Swap(0); n != 3 {
		t.Errorf("an owner's list of 3 among 503 read %d volume records, want 3", n)
	}
	if vs, err := s.OwnedVolumes(ctx, owner, Page{Limit: 2}); err != nil || len(vs) != 2 {
		t.Fatalf("OwnedVolumes limit 2: %d volumes, %v", len(vs), err)
	}
	if n := records.n.Swap(0); n != 2 {
		t.Errorf("a page of 2 read %d volume records, want 2", n)
	}
	// A page of everyone's reads about its limit too: from the first,
	// and from the middle (after the crowd's 251st).
	mid, err := s.Volume(ctx, made[250])
	if err != nil {
		t.Fatal(err)
	}
	records.n.Swap(0)
	midPos := mid.Position()
	for _, p := range []Page{{Limit: 2}, {After: &midPos, Limit: 2}} {
		vs, err := s.AllVolumes(ctx, p)
		if err != nil || len(vs) != 2 || p.After != nil && !p.After.Before(vs[0].Position()) {
			t.Fatalf("AllVolumes %+v: %d volumes, %v", p, len(vs), err)
		}
		if n := records.n.Swap(0); n != 2 {
			t.Errorf("a page of 2 of everyone's (after %v) read %d volume records, want 2", p.After, n)
		}
	}
	if _, err := s.Volumes(ctx); err != nil {
		t.Fatal(err)
	}
	if n := records.n.Swap(0); n < 503 {
		t.Errorf("the whole list read %d volume records (the counter misses reads?)", n)
	}
}

// TestAllPage: the list of everyone's records through the all-owners
// index is in (created, id) order — ties by id, the zero time of records
// that never set one first — pages with after and limit, every record
// exactly once, and holds exactly the records a read of every record
// finds.
func TestAllPage(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	base := time.Now().UTC().Truncate(time.Second)
	var made []*Volume
	var snaps []string
	update(t, s, func(tx *Tx) {
		for i, d := range []int{3, 1, 2, 2, 2, -1, 5, -1, 2} { // ties at 2; -1: zero created_at
			v := &Volume{ID: "vol-" + string(rune('p'-i)) + uniq(""), OwnerID: uniq("owner"), Status: StatusAvailable}
			if d >= 0 {
				v.CreatedAt = base.Add(time.Duration(d) * time.Millisecond)
			}
			tx.PutVolume(v)
			made = append(made, v)
			sn := &Snapshot{ID: uniq("snap"), OwnerID: v.OwnerID, VolumeID: v.ID, Status: StatusAvailable, CreatedAt: v.CreatedAt}
			tx.PutSnapshot(sn)
			snaps = append(snaps, sn.ID)
		}
	})
	t.Cleanup(func() {
		s.Update(context.Background(), func(tx *Tx) error {
			for i, v := range made {
				tx.DeleteVolume(v.ID)
				tx.DeleteSnapshot(snaps[i])
			}
			return nil
		})
	})
	byPos := func(a, b *Volume) int {
		if a.Position().Before(b.Position()) {
			return -1
		}
		return 1
	}
	// Everything, as a read of every record finds it.
	every, err := s.Volumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(every, byPos)
	want := idsOf(every)
	all, err := s.AllVolumes(ctx, Page{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(idsOf(all), want) {
		t.Fatalf("AllVolumes: %v, want %v", idsOf(all), want)
	}
	// This test's in order among them.
	slices.SortFunc(made, byPos)
	var ours []string
	for _, id := range want {
		if slices.ContainsFunc(made, func(v *Volume) bool { return v.ID == id }) {
			ours = append(ours, id)
		}
	}
	if !slices.Equal(ours, idsOf(made)) {
		t.Errorf("this test's volumes in AllVolumes: %v, want %v", ours, idsOf(made))
	}
	checkPaging(t, want, func(p Page) ([]*Volume, error) { return s.AllVolumes(ctx, p) })
	// Snapshots, and attachments (none of this test's), the same way.
	everySnap, err := s.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(everySnap, func(a, b *Snapshot) int {
		if a.Position().Before(b.Position()) {
			return -1
		}
		return 1
	})
	if got, err := s.AllSnapshots(ctx, Page{}); err != nil || !slices.Equal(idsOf(got), idsOf(everySnap)) {
		t.Errorf("AllSnapshots: %v, %v; want %v", idsOf(got), err, idsOf(everySnap))
	}
	if got, err := s.AllAttachments(ctx, Page{Limit: 3}); err != nil || len(got) > 3 {
		t.Errorf("AllAttachments: %v, %v", idsOf(got), err)
	}

	// After a position whose record is gone, and one between records.
	i := slices.Index(want, made[3].ID)
	gone := made[3].Position()
	update(t, s, func(tx *Tx) { tx.DeleteVolume(gone.ID) })
	if got, err := s.AllVolumes(ctx, Page{After: &gone, Limit: 2}); err != nil || !slices.Equal(idsOf(got), want[i+1:min(i+3, len(want))]) {
		t.Errorf("after a deleted record: %v, %v; want %v", idsOf(got), err, want[i+1:min(i+3, len(want))])
	}
	zero := Position{ID: "~"} // after every zero-time record (ids are ASCII)
	got, err := s.AllVolumes(ctx, Page{After: &zero, Limit: 1})
	if err != nil || len(got) != 1 || got[0].CreatedAt.IsZero() {
		t.Errorf("after the zero-time records: %v, %v", idsOf(got), err)
	}
}

// TestOwnedIndexChurn: after creates, updates (new owners and creation
// times among them) and deletes in many transactions, the index agrees
// with the records, and everyone's list and each owner's hold exactly
// the records left.
func TestOwnedIndexChurn(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	owners := []string{uniq("churn"), uniq("churn"), uniq("churn")}
	base := time.Now().UTC()
	live := map[string]*Volume{}
	var ids []string
	t.Cleanup(func() {
		s.Update(context.Background(), func(tx *Tx) error {
			for _, id := range ids {
				tx.DeleteVolume(id)
				tx.DeleteSnapshot("s" + id)
			}
			return nil
		})
	})
	for round := range 12 {
		update(t, s, func(tx *Tx) {
			for j := range 10 {
				n := round*10 + j
				switch {
				case n%7 == 3 && len(ids) > 0: // delete one
					id := ids[n%len(ids)]
					tx.DeleteVolume(id)
					tx.DeleteSnapshot("s" + id)
					delete(live, id)
				case n%5 == 1 && len(ids) > 0: // update one: a new owner or creation time
					if v := live[ids[(n*3)%len(ids)]]; v != nil {
						v.OwnerID = owners[n%len(owners)]
						v.CreatedAt = base.Add(time.Duration(n) * time.Millisecond)
						v.SizeBytes = int64(n) * 512
						tx.PutVolume(v)
					}
				default: // create
					v := &Volume{ID: uniq("vol"), OwnerID: owners[n%len(owners)], Status: StatusAvailable, CreatedAt: base.Add(time.Duration(n%4) * time.Second)}
					tx.PutVolume(v)
					tx.PutSnapshot(&Snapshot{ID: "s" + v.ID, OwnerID: v.OwnerID, VolumeID: v.ID, CreatedAt: v.CreatedAt})
					live[v.ID] = v
					ids = append(ids, v.ID)
				}
			}
		})
	}
	if problems, err := s.CheckOwnedIndex(ctx); err != nil || len(problems) != 0 {
		t.Fatalf("CheckOwnedIndex after churn: %v, %v", problems, err)
	}
	all, err := s.AllVolumes(ctx, Page{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range all {
		if live[v.ID] != nil {
			n++
			if !v.CreatedAt.Equal(live[v.ID].CreatedAt) || v.OwnerID != live[v.ID].OwnerID {
				t.Errorf("everyone's list has %s as %v, %s; want %v, %s", v.ID, v.CreatedAt, v.OwnerID, live[v.ID].CreatedAt, live[v.ID].OwnerID)
			}
		} else if slices.Contains(ids, v.ID) {
			t.Errorf("everyone's list has deleted %s", v.ID)
		}
	}
	if n != len(live) {
		t.Errorf("everyone's list holds %d of the %d volumes left", n, len(live))
	}
	m := 0
	for _, o := range owners {
		vs, err := s.OwnedVolumes(ctx, o, Page{})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			if live[v.ID] == nil || live[v.ID].OwnerID != o {
				t.Errorf("%s's list has %s", o, v.ID)
			}
		}
		m += len(vs)
	}
	if m != len(live) {
		t.Errorf("the owners' lists hold %d of the %d volumes left", m, len(live))
	}
}

// rawRecord writes a record behind the Store's back, as a version
// without the owned index did.
func rawRecord(t *testing.T, cli *clientv3.Client, key string, r any) {
	t.Helper()
	if _, err := cli.Put(ctxT(t), key, encode(r)); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileOwnedIndex: a start indexes the records a version without
// the index wrote and deletes the keys of records it deleted, writing
// only the differences (nothing when there are none); it is idempotent,
// safe on two nodes at once, and misses no record written while it runs.
func TestReconcileOwnedIndex(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	o := newOpener(t)
	s, url := o.open("m1", freeAddr(t), nil, "")
	cli := s.cli
	check := func(what string) {
		t.Helper()
		problems, err := s.CheckOwnedIndex(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(problems) != 0 {
			t.Fatalf("%s: %v", what, problems)
		}
	}
	t0 := time.Date(2024, 1, 2, 3, 4, 5, 6, time.UTC)
	var alice, bob []string // volume ids, in order
	for i := range 7 {
		v := &Volume{Schema: 1, ID: "vol-" + string(rune('z'-i)), OwnerID: "alice", Status: StatusAvailable, CreatedAt: t0.Add(time.Duration(i) * time.Second)}
		rawRecord(t, cli, volumeKey(v.ID), v)
		alice = append(alice, v.ID)
	}
	for i := range 3 {
		v := &Volume{Schema: 1, ID: "vol-b" + string(rune('a'+i)), OwnerID: "bob", Status: StatusAvailable}
		rawRecord(t, cli, volumeKey(v.ID), v) // zero created_at
		bob = append(bob, v.ID)
	}
	rawRecord(t, cli, snapshotKey("snap-1"), &Snapshot{Schema: 1, ID: "snap-1", OwnerID: "alice", VolumeID: alice[0], CreatedAt: t0})
	rawRecord(t, cli, attachmentKey("att-1"), &Attachment{Schema: 1, ID: "att-1", OwnerID: "bob", VolumeID: bob[0], Export: "x", CreatedAt: t0})
	// An entry of a half-done run: the rest must follow.
	if _, err := cli.Put(ctx, ownedVolumes.key("alice", t0, alice[0]), alice[0]); err != nil {
		t.Fatal(err)
	}
	// 12 records, two keys each, one there.
	if problems, err := s.CheckOwnedIndex(ctx); err != nil || len(problems) != 23 {
		t.Fatalf("the check before the index is built: %d problems %v, %v; want 23", len(problems), problems, err)
	}

	// Records written and deleted while it runs are not missed, nor
	// their keys left behind: the hook runs between the read of the
	// first batch (bob's first two volumes) and its commit, and creates
	// a volume behind the scan, deletes one of the batch and one ahead.
	defer func(n int) { ownedIndexBatch, ownedIndexHook = n, nil }(ownedIndexBatch)
	ownedIndexBatch = 2
	var during []string
	var hookOnce sync.Once
	ownedIndexHook = func() {
		hookOnce.Do(func() {
			v := &Volume{ID: "vol-0during", OwnerID: "alice", Status: StatusAvailable, CreatedAt: t0.Add(time.Minute)}
			if err := s.Update(ctx, func(tx *Tx) error {
				tx.PutVolume(v)
				tx.DeleteVolume(alice[6])
				tx.DeleteVolume(bob[1])
				return nil
			}); err != nil {
				t.Error(err)
			}
			during = append(during, v.ID)
		})
	}
	wrote, err := s.ReconcileOwnedIndex(ctx)
	if err != nil || !wrote {
		t.Fatalf("ReconcileOwnedIndex: %v, %v", wrote, err)
	}
	check("after the first start")
	wantAlice := append(slices.Clone(alice[:6]), during...)
	if vs, err := s.OwnedVolumes(ctx, "alice", Page{}); err != nil || !slices.Equal(idsOf(vs), wantAlice) {
		t.Errorf("alice's volumes: %v, %v; want %v", idsOf(vs), err, wantAlice)
	}
	if vs, err := s.OwnedVolumes(ctx, "bob", Page{}); err != nil || !slices.Equal(idsOf(vs), []string{bob[0], bob[2]}) {
		t.Errorf("bob's volumes: %v, %v; want %v", idsOf(vs), err, []string{bob[0], bob[2]})
	}
	if ss, err := s.OwnedSnapshots(ctx, "alice", Page{}, nil); err != nil || !slices.Equal(idsOf(ss), []string{"snap-1"}) {
		t.Errorf("alice's snapshots: %v, %v", idsOf(ss), err)
	}
	if as, err := s.OwnedAttachments(ctx, "bob", Page{}); err != nil || !slices.Equal(idsOf(as), []string{"att-1"}) {
		t.Errorf("bob's attachments: %v, %v", idsOf(as), err)
	}
	// Everyone's: bob's, of zero created_at, first.
	wantAll := append([]string{bob[0], bob[2]}, wantAlice...)
	if vs, err := s.AllVolumes(ctx, Page{}); err != nil || !slices.Equal(idsOf(vs), wantAll) {
		t.Errorf("everyone's volumes: %v, %v; want %v", idsOf(vs), err, wantAll)
	}
	if as, err := s.AllAttachments(ctx, Page{}); err != nil || !slices.Equal(idsOf(as), []string{"att-1"}) {
		t.Errorf("everyone's attachments: %v, %v", idsOf(as), err)
	}

	// In step: the next start writes nothing.
	ownedIndexHook = nil
	rev := func() int64 {
		r, err := cli.Get(ctx, keyCluster)
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	before := rev()
	if wrote, err := s.ReconcileOwnedIndex(ctx); err != nil || wrote {
		t.Fatalf("a second ReconcileOwnedIndex: %v, %v; want nothing to do", wrote, err)
	}
	if after := rev(); after != before {
		t.Errorf("a second ReconcileOwnedIndex wrote (revision %d to %d)", before, after)
	}

	// An older node still running (a rolling upgrade) creates a record
	// and deletes another behind the index's back — as many records as
	// before, as many keys — and the next start, on two nodes at once,
	// repairs both.
	rawRecord(t, cli, volumeKey("vol-old"), &Volume{Schema: 1, ID: "vol-old", OwnerID: "bob", CreatedAt: t0})
	if _, err := cli.Delete(ctx, volumeKey(bob[2])); err != nil {
		t.Fatal(err)
	}
	other, err := Open(ctx, Config{Endpoints: []string{url}, ExternalTLS: testEnvTLS(t, o.base, o.ca)}, s.log)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var wg sync.WaitGroup
	for _, st := range []*Store{s, other} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := st.ReconcileOwnedIndex(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	check("after an older node's create and delete, and two starts at once")
	if vs, err := s.OwnedVolumes(ctx, "bob", Page{}); err != nil || !slices.Equal(idsOf(vs), []string{bob[0], "vol-old"}) {
		t.Errorf("bob's volumes: %v, %v; want %v", idsOf(vs), err, []string{bob[0], "vol-old"})
	}
	// vol-old, of t0 as alice[0] ("vol-z"), comes before it by id.
	wantAll = append([]string{bob[0], "vol-old"}, wantAlice...)
	if vs, err := s.AllVolumes(ctx, Page{}); err != nil || !slices.Equal(idsOf(vs), wantAll) {
		t.Errorf("everyone's volumes: %v, %v; want %v", idsOf(vs), err, wantAll)
	}
}

// TestReconcileAllOwnersKeys: a cluster the previous version ran — each
// record with its owner's key only, no all-owners key — gets the
// all-owners keys at the next start, in batches of two writes a record
// (within MaxTxnOps at the default batch), and loses the all-owners keys
// of records deleted behind the index's back; everyone's lists then hold
// every record, in order.
func TestReconcileAllOwnersKeys(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	o := newOpener(t)
	s, _ := o.open("m1", freeAddr(t), nil, "")
	cli := s.cli
	t0 := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	// Records as the previous version wrote them: record and owner key
	// in one transaction; 300 volumes, so that the first batch of 256
	// needs 512 writes. Then some with no key at all (older still).
	var want []string
	for b := range 3 {
		var ops []clientv3.Op
		for i := range 100 {
			n := b*100 + i
			v := &Volume{Schema: 1, ID: "vol-" + strconv.Itoa(1000+n), OwnerID: "u" + strconv.Itoa(n%7), Status: StatusAvailable,
				CreatedAt: t0.Add(time.Duration(n%10) * time.Second)} // ties: 30 a second
			if n%50 == 0 {
				v.CreatedAt = time.Time{} // zero created_at
			}
			ops = append(ops, clientv3.OpPut(volumeKey(v.ID), encode(v)),
				clientv3.OpPut(ownedVolumes.key(v.OwnerID, v.CreatedAt, v.ID), v.ID))
			want = append(want, v.ID)
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"snap-a", "snap-b"} {
		rawRecord(t, cli, snapshotKey(id), &Snapshot{Schema: 1, ID: id, OwnerID: "u1", VolumeID: "vol-1001", CreatedAt: t0})
	}
	rawRecord(t, cli, attachmentKey("att-a"), &Attachment{Schema: 1, ID: "att-a", OwnerID: "u2", VolumeID: "vol-1002", Export: "e", CreatedAt: t0})
	// An all-owners key whose record a previous-version node deleted
	// (with its owner key): stale.
	if _, err := cli.Put(ctx, ownedVolumes.allKey(t0, "vol-gone"), "vol-gone"); err != nil {
		t.Fatal(err)
	}

	if vs, err := s.AllVolumes(ctx, Page{}); err != nil || len(vs) != 0 {
		t.Fatalf("everyone's volumes before the start: %d, %v; want none yet", len(vs), err)
	}
	problems, err := s.CheckOwnedIndex(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 300 all-owners keys missing, 3 records with no key (6), 1 stale key.
	if len(problems) != 307 {
		t.Fatalf("the check before the start: %d problems, want 307", len(problems))
	}

	if wrote, err := s.ReconcileOwnedIndex(ctx); err != nil || !wrote {
		t.Fatalf("ReconcileOwnedIndex: %v, %v", wrote, err)
	}
	if problems, err := s.CheckOwnedIndex(ctx); err != nil || len(problems) != 0 {
		t.Fatalf("the check after the start: %d problems %v…, %v", len(problems), problems[:min(3, len(problems))], err)
	}
	every, err := s.Volumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(every, func(a, b *Volume) int {
		if a.Position().Before(b.Position()) {
			return -1
		}
		return 1
	})
	if got := slices.Sorted(slices.Values(idsOf(every))); !slices.Equal(got, want) {
		t.Fatalf("%d volumes, want the %d written", len(every), len(want))
	}
	var paged []string
	p := Page{Limit: 7}
	for {
		vs, err := s.AllVolumes(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, idsOf(vs)...)
		if len(vs) < p.Limit {
			break
		}
		after := vs[len(vs)-1].Position()
		p.After = &after
	}
	if !slices.Equal(paged, idsOf(every)) {
		t.Errorf("everyone's volumes paged by 7 after the start: %d, want the %d records in order", len(paged), len(every))
	}
	if ss, err := s.AllSnapshots(ctx, Page{}); err != nil || !slices.Equal(idsOf(ss), []string{"snap-a", "snap-b"}) {
		t.Errorf("everyone's snapshots: %v, %v", idsOf(ss), err)
	}
	if as, err := s.AllAttachments(ctx, Page{}); err != nil || !slices.Equal(idsOf(as), []string{"att-a"}) {
		t.Errorf("everyone's attachments: %v, %v", idsOf(as), err)
	}
	if vs, err := s.OwnedVolumes(ctx, "u3", Page{}); err != nil || len(vs) != 43 {
		t.Errorf("u3's volumes: %d, %v; want 43", len(vs), err)
	}
	if wrote, err := s.ReconcileOwnedIndex(ctx); err != nil || wrote {
		t.Fatalf("a second ReconcileOwnedIndex: %v, %v; want nothing to do", wrote, err)
	}
}

// testEnvTLS is a client TLS configuration for a member memberOpener
// started under base.
func testEnvTLS(t *testing.T, base string, ca *pki.CA) *tls.Config {
	t.Helper()
	c, _ := (&memberOpener{t: t, base: base, ca: ca}).config("client", freeAddr(t), nil, "")
	return c.ClientTLS
}

// oneMember is a store on a cluster of one member, and a context for the
// test's calls.
func oneMember(t *testing.T) (*Store, context.Context) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	s, _ := newOpener(t).open("m1", freeAddr(t), nil, "")
	return s, ctx
}

// TestRollingUpgradeKeepsAllOwnersKeys: during a rolling upgrade, a
// node of the version before the all-owners keys starts and reconciles
// its owners' index — every key under owned/<kind>/ that is not a
// record's owner key is deleted as stale (previousReconcile, that
// version's rule). The all-owners keys live elsewhere, so an admin's
// lists on upgraded nodes keep every record. And the keys the first
// version with all-owners keys wrote under owned/<kind>/*/ are stale
// to this one: its start deletes them.
func TestRollingUpgradeKeepsAllOwnersKeys(t *testing.T) {
	s, ctx := oneMember(t)
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	var want []string
	for i := range 5 {
		v := &Volume{Schema: 1, ID: "vol-" + strconv.Itoa(i), OwnerID: "u" + strconv.Itoa(i%2), Status: StatusAvailable, CreatedAt: t0.Add(time.Duration(i) * time.Second)}
		if err := s.Update(ctx, func(tx *Tx) error { tx.PutVolume(v); return nil }); err != nil {
			t.Fatal(err)
		}
		want = append(want, v.ID)
	}
	// Keys as the version at owned/<kind>/*/ left them.
	old := "/basalt/owned/volumes/*/" + Position{t0, "vol-0"}.Key()
	if _, err := s.cli.Put(ctx, old, "vol-0"); err != nil {
		t.Fatal(err)
	}

	if n := previousReconcile(t, s.cli, ownedVolumes); n != 1 {
		t.Errorf("the previous version's start deleted %d keys, want 1 (the owned/volumes/*/ one)", n)
	}
	if vs, err := s.AllVolumes(ctx, Page{}); err != nil || !slices.Equal(idsOf(vs), want) {
		t.Errorf("everyone's volumes after an older node's start: %v, %v; want %v", idsOf(vs), err, want)
	}
	if problems, err := s.CheckOwnedIndex(ctx); err != nil || len(problems) != 0 {
		t.Errorf("the check after an older node's start: %v, %v", problems, err)
	}

	// The first all-owners version's key again; this version's start
	// deletes it.
	if _, err := s.cli.Put(ctx, old, "vol-0"); err != nil {
		t.Fatal(err)
	}
	if problems, err := s.CheckOwnedIndex(ctx); err != nil || len(problems) != 1 {
		t.Errorf("the check with an owned/volumes/*/ key: %v, %v; want one problem", problems, err)
	}
	if wrote, err := s.ReconcileOwnedIndex(ctx); err != nil || !wrote {
		t.Fatalf("ReconcileOwnedIndex: %v, %v", wrote, err)
	}
	if resp, err := s.cli.Get(ctx, old); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("%s after the start: %v, %v; want deleted", old, resp.Kvs, err)
	}
	if problems, err := s.CheckOwnedIndex(ctx); err != nil || len(problems) != 0 {
		t.Errorf("the check after the start: %v, %v", problems, err)
	}
}

// previousReconcile is the owned index's reconciliation as the version
// before the all-owners keys ran it at every start, reduced to its
// deletions: every key under owned/<kind>/ that is not the owner key of
// a record is stale. It returns how many keys it deleted.
func previousReconcile(t *testing.T, cli *clientv3.Client, k ownedKind) int {
	t.Helper()
	recs, err := cli.Get(ctxT(t), k.records, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, kv := range recs.Kvs {
		var f ownedFields
		if err := json.Unmarshal(kv.Value, &f); err != nil {
			t.Fatal(err)
		}
		want[k.key(f.OwnerID, f.CreatedAt, strings.TrimPrefix(string(kv.Key), k.records))] = true
	}
	keys, err := cli.Get(ctxT(t), prefixOwned+k.name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kv := range keys.Kvs {
		if !want[string(kv.Key)] {
			if _, err := cli.Delete(ctxT(t), string(kv.Key)); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	return n
}

// TestReconcileStaleKeysBesideAWrite: the cluster as the version with
// owned/<kind>/*/ keys left it, every record also with its ordered/ key
// (written by an upgraded node). While this version's start reconciles,
// one volume is rewritten (a job's progress). The */ keys are stale
// whatever their records do: every one is deleted, though they share a
// delete batch with that volume's.
func TestReconcileStaleKeysBesideAWrite(t *testing.T) {
	s, ctx := oneMember(t)
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	var vols []*Volume
	for i := range 10 {
		v := &Volume{Schema: 1, ID: "vol-" + strconv.Itoa(i), OwnerID: "u" + strconv.Itoa(i%2), Status: StatusAvailable, CreatedAt: t0.Add(time.Duration(i) * time.Second)}
		if err := s.Update(ctx, func(tx *Tx) error { tx.PutVolume(v); return nil }); err != nil {
			t.Fatal(err)
		}
		vols = append(vols, v)
		star := "/basalt/owned/volumes/*/" + v.Position().Key()
		if _, err := s.cli.Put(ctx, star, v.ID); err != nil {
			t.Fatal(err)
		}
	}
	defer func() { ownedIndexHook = nil }()
	var once sync.Once
	ownedIndexHook = func() {
		once.Do(func() {
			// An ordinary write of this version to one record.
			if err := s.Update(ctx, func(tx *Tx) error { tx.PutVolume(vols[0]); return nil }); err != nil {
				t.Error(err)
			}
		})
	}
	if _, err := s.ReconcileOwnedIndex(ctx); err != nil {
		t.Fatal(err)
	}
	ownedIndexHook = nil
	resp, err := s.cli.Get(ctx, "/basalt/owned/volumes/*/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Errorf("after the start, %d of the 10 stale owned/volumes/*/ keys remain", len(resp.Kvs))
	}
	if problems, err := s.CheckOwnedIndex(ctx); err != nil || len(problems) != 0 {
		t.Errorf("the check after the start: %v, %v", problems, err)
	}
}

// TestReconcileRereadBatch: a put batch whose commit fails (a record of
// it changed) is read again, its records' revisions too: a record of the
// batch deleted in between behind the index's back (by an older node,
// which leaves its ordered/ key) is then absent, and its left-over key is
// deleted as stale.
func TestReconcileRereadBatch(t *testing.T) {
	s, ctx := oneMember(t)
	cli := s.cli
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	// vol-a: fully indexed (this version wrote it).
	va := &Volume{Schema: 1, ID: "vol-a", OwnerID: "u1", Status: StatusAvailable, CreatedAt: t0}
	if err := s.Update(ctx, func(tx *Tx) error { tx.PutVolume(va); return nil }); err != nil {
		t.Fatal(err)
	}
	// vol-b: written by an owners-only node (owner key, no ordered key).
	vb := &Volume{Schema: 1, ID: "vol-b", OwnerID: "u1", Status: StatusAvailable, CreatedAt: t0}
	rawRecord(t, cli, volumeKey(vb.ID), vb)
	if _, err := cli.Put(ctx, ownedVolumes.key(vb.OwnerID, vb.CreatedAt, vb.ID), vb.ID); err != nil {
		t.Fatal(err)
	}
	defer func(n int) { ownedIndexBatch, ownedIndexHook = n, nil }(ownedIndexBatch)
	ownedIndexBatch = 2
	var once sync.Once
	ownedIndexHook = func() {
		once.Do(func() {
			// An owners-only node deletes vol-a (record and owner key: its
			// ordered key stays behind) and rewrites vol-b.
			if _, err := cli.Txn(ctx).Then(
				clientv3.OpDelete(volumeKey(va.ID)),
				clientv3.OpDelete(ownedVolumes.key(va.OwnerID, va.CreatedAt, va.ID)),
				clientv3.OpPut(volumeKey(vb.ID), encode(vb)),
			).Commit(); err != nil {
				t.Error(err)
			}
		})
	}
	if _, err := s.ReconcileOwnedIndex(ctx); err != nil {
		t.Fatal(err)
	}
	ownedIndexHook = nil
	if problems, err := s.CheckOwnedIndex(ctx); err != nil || len(problems) != 0 {
		t.Errorf("the check after the start: %v, %v (the ordered/ key of vol-a, deleted behind the index's back, was kept)", problems, err)
	}
}

// TestReconcileSpoiledDeletes: stale keys that something else deletes
// while a start reconciles — another node's start, at the same time —
// spoil the batches they sit in; each spoiled batch then costs a read and
// one more transaction, not a transaction for each of its keys.
func TestReconcileSpoiledDeletes(t *testing.T) {
	s, ctx := oneMember(t)
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	const n = 1000
	var keys []string
	for i := range n {
		keys = append(keys, "/basalt/owned/volumes/*/"+Position{t0, "vol-" + strconv.Itoa(i)}.Key())
	}
	for i := 0; i < n; i += 100 {
		var ops []clientv3.Op
		for _, key := range keys[i : i+100] {
			ops = append(ops, clientv3.OpPut(key, "x"))
		}
		if _, err := s.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	raftIndex := func() uint64 {
		st, err := s.cli.Status(ctx, s.cli.Endpoints()[0])
		if err != nil {
			t.Fatal(err)
		}
		return st.RaftIndex
	}
	defer func() { ownedIndexHook = nil }()
	var once sync.Once
	ownedIndexHook = func() {
		once.Do(func() {
			// Another start deletes every hundredth key.
			for i := 0; i < n; i += 100 {
				if _, err := s.cli.Delete(ctx, keys[i]); err != nil {
					t.Error(err)
				}
			}
		})
	}
	before := raftIndex()
	if _, err := s.ReconcileOwnedIndex(ctx); err != nil {
		t.Fatal(err)
	}
	ownedIndexHook = nil
	// 10 deletes by the other start; per batch of 256 keys (4), a
	// transaction that fails and one that commits; the other kinds, none.
	if got := raftIndex() - before; got > 10+2*4+5 {
		t.Errorf("the start took %d raft entries for %d stale keys", got, n)
	}
	if resp, err := s.cli.Get(ctx, "/basalt/owned/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Errorf("after the start: %d stale keys left, %v", resp.Count, err)
	}
}

// TestCheckOwnedIndexEmptyValue: an index key naming no id (its value
// empty) is a disagreement the check reports, and the start deletes; a
// record's key naming another id, one the start rewrites.
func TestCheckOwnedIndexEmptyValue(t *testing.T) {
	s, _ := oneMember(t)
	key := ownedVolumes.allKey(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), "vol-x")
	if _, err := s.cli.Put(ctxT(t), key, ""); err != nil {
		t.Fatal(err)
	}
	if problems, err := s.CheckOwnedIndex(ctxT(t)); err != nil || len(problems) != 1 {
		t.Errorf("the check with %s empty: %v, %v; want one problem", key, problems, err)
	}
	// A record's own key naming another id is rewritten at the start.
	v := &Volume{Schema: 1, ID: "vol-y", OwnerID: "u1", Status: StatusAvailable, CreatedAt: time.Date(2025, 1, 2, 3, 4, 6, 0, time.UTC)}
	if err := s.Update(ctxT(t), func(tx *Tx) error { tx.PutVolume(v); return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.cli.Put(ctxT(t), ownedVolumes.allKey(v.CreatedAt, v.ID), "vol-other"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReconcileOwnedIndex(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if problems, err := s.CheckOwnedIndex(ctxT(t)); err != nil || len(problems) != 0 {
		t.Errorf("the check after the start: %v, %v", problems, err)
	}
	if vs, err := s.AllVolumes(ctxT(t), Page{}); err != nil || !slices.Equal(idsOf(vs), []string{"vol-y"}) {
		t.Errorf("everyone's volumes after the start: %v, %v", idsOf(vs), err)
	}
}

// TestOwnerSegmentSeparate: no owner's segment holds a separator
// (url.PathEscape escapes byte by byte, "/" included), so a read of
// one owner's keys never reaches another's.
func TestOwnerSegmentSeparate(t *testing.T) {
	for b := range 256 {
		if seg := ownerSegment(string([]byte{byte(b)})); strings.Contains(seg, "/") {
			t.Errorf("the segment of owner %q is %q", []byte{byte(b)}, seg)
		}
	}
}
