package meta

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The owned index. Every volume, snapshot and attachment record has two
// keys, both naming it (the value is the id):
//
//	owned/<kind>/<owner id, path-escaped>/<created_at>/<id>   its owner's key
//	ordered/<kind>/<created_at>/<id>                          its all-owners key
//
// (kind: volumes, snapshots, attachments; created_at in createdLayout),
// written and deleted by the transaction that writes or deletes the record
// (Tx.PutVolume … Tx.DeleteAttachment, through index and unindex), so that
// no caller can forget them. One owner's records are then listed in the
// API's order — created_at, then id — by a range read of that owner's keys
// and Gets of the records they name (owned, OwnedVolumes…); every owner's
// records, an admin's lists, the same way from the all-owners keys
// (AllVolumes…). Either costs what the page (or the owner's records)
// holds, not what the cluster does.
//
// Layout:
//   - kind before owner: one prefix per kind and form, under which
//     ReconcileOwnedIndex and CheckOwnedIndex compare the keys with the
//     kind's records.
//   - the all-owners keys under a prefix of their own, not under owned/:
//     the version before them reconciles everything under owned/<kind>/
//     against its owners' keys, and would delete any other key there as
//     stale at its start during a rolling upgrade. (The version that
//     first wrote them put them at owned/<kind>/*/…; this one's
//     reconciliation deletes those as stale.)
//   - created_at as UTC "20060102T150405.000000000Z", not unix nanoseconds:
//     fixed width, so that key order is time order for every time a record
//     can hold — JSON encodes years 0 to 9999, the zero time of records
//     that never set one included, while unix nanoseconds (an int64) only
//     cover 1678 to 2262 — and readable.
//   - the owner path-escaped, since it sits between separators (user ids
//     are hex: escaping leaves them alone): url.PathEscape escapes "/", so
//     each owner's keys are a range of their own, which a read of one
//     owner's never leaves. The id raw and last, so that ids sort as the
//     strings they are, as in the API's order.
//   - the value is the id, not a copy of the record: a list reads the
//     index range, then the records it names, in etcd Txns of at most
//     MaxTxnOps Gets (getMany) — two round trips for a page instead of one,
//     but each record is stored and written once: a copy would double
//     every record write (a volume is rewritten at every step of a job's
//     progress) and its history against etcd's space quota. Not empty: a
//     Tx reads an empty value as an absent key.
//
// A record's write thus writes three keys (the record and its two index
// keys, rewritten with their value unchanged) — a Tx's MaxTxnOps writes
// hold about 340 records.
//
// The owner is OwnedBy (owner_id), what Caller.sees in package volume
// checks: snapshots and attachments are given their volume's owner when
// made. Neither owner nor created_at changes after creation; a write that
// changed one would move the keys (index deletes the record's old ones).

// ownedKind is a kind of record the owned index lists.
type ownedKind struct {
	name    string // its segment in the index keys
	records string // the prefix of its records
}

var (
	ownedVolumes     = ownedKind{"volumes", prefixVolumes}
	ownedSnapshots   = ownedKind{"snapshots", prefixSnaps}
	ownedAttachments = ownedKind{"attachments", prefixAttach}
	ownedKinds       = []ownedKind{ownedVolumes, ownedSnapshots, ownedAttachments}
)

// createdLayout renders created_at in index keys (see above).
const createdLayout = "20060102T150405.000000000Z"

// ownerSegment is owner's segment in its index keys.
func ownerSegment(owner string) string { return url.PathEscape(owner) }

// ownersRoot is the prefix of every owner's key of the kind.
func (k ownedKind) ownersRoot() string { return prefixOwned + k.name + "/" }

// allPrefix is the prefix of the kind's all-owners keys.
func (k ownedKind) allPrefix() string { return prefixOrdered + k.name + "/" }

// legacy reports whether key, under one of the kind's roots, is of a form
// no version writes any more: an all-owners key as the first version with
// them wrote it, under the owner segment "*" (which no owner's segment is:
// url.PathEscape escapes "*"). Stale whatever its record says.
func (k ownedKind) legacy(key string) bool { return strings.HasPrefix(key, k.ownersRoot()+"*/") }

// roots are the prefixes of the kind's index keys, of each form.
func (k ownedKind) roots() [2]string { return [2]string{k.ownersRoot(), k.allPrefix()} }

// prefix is the prefix of owner's index keys of the kind.
func (k ownedKind) prefix(owner string) string { return k.ownersRoot() + ownerSegment(owner) + "/" }

// key is the owner's index key of record id.
func (k ownedKind) key(owner string, created time.Time, id string) string {
	return k.prefix(owner) + Position{created, id}.Key()
}

// allKey is the all-owners key of record id.
func (k ownedKind) allKey(created time.Time, id string) string {
	return k.allPrefix() + Position{created, id}.Key()
}

// keys are both index keys of record id: its owner's, its all-owners.
func (k ownedKind) keys(owner string, created time.Time, id string) [2]string {
	return [2]string{k.key(owner, created, id), k.allKey(created, id)}
}

// ownedFields are what the index needs of a record; every indexed kind
// has them under these names.
type ownedFields struct {
	OwnerID   string    `json:"owner_id"`
	CreatedAt time.Time `json:"created_at"`
}

// keysOf are the index keys of record id stored as val; false when val is
// "" (no record) or names no owner and creation time (corrupt). It does
// not check the schema: a record a newer binary wrote is listed to its
// owner (and admins), whose list then says to upgrade, as every list did
// before.
func (k ownedKind) keysOf(id, val string) ([2]string, bool) {
	var f ownedFields
	if val == "" || json.Unmarshal([]byte(val), &f) != nil {
		return [2]string{}, false
	}
	return k.keys(f.OwnerID, f.CreatedAt, id), true
}

// index keeps the index in step with a write of record id, made before
// the record's own write is buffered: it writes the record's keys and
// deletes the keys of the record as it stood before, where those are
// others. The record is read (usually already read by the transaction)
// and so becomes part of what the commit requires unchanged. A record
// the previous version wrote, with its owner's key only, gets its
// all-owners key here (or at ReconcileOwnedIndex).
func (tx *Tx) index(k ownedKind, id, owner string, created time.Time) {
	keys := k.keys(owner, created, id)
	if old, ok := k.keysOf(id, tx.stm.Get(k.records+id)); ok {
		for i := range old {
			if old[i] != keys[i] { // never one of keys: the forms differ in prefix
				tx.stm.Del(old[i])
			}
		}
	}
	for _, key := range keys {
		tx.stm.Put(key, id)
	}
}

// unindex deletes the index keys of record id, about to be deleted.
func (tx *Tx) unindex(k ownedKind, id string) {
	if old, ok := k.keysOf(id, tx.stm.Get(k.records+id)); ok {
		for _, key := range old {
			tx.stm.Del(key)
		}
	}
}

// Position is a record's place in the order lists are in: oldest first,
// ties by id.
type Position struct {
	Created time.Time
	ID      string
}

// Key renders p as the index keys end: created_at in createdLayout, "/",
// the id. Fixed width up to the id, so two keys sort as their positions
// do, for every time a record can hold (years 0 to 9999).
func (p Position) Key() string { return p.Created.UTC().Format(createdLayout) + "/" + p.ID }

// ParsePosition parses what Key renders; false if s is not such a
// rendering.
func ParsePosition(s string) (Position, bool) {
	ts, id, ok := strings.Cut(s, "/")
	if !ok || id == "" || len(ts) != len(createdLayout) {
		return Position{}, false
	}
	t, err := time.Parse(createdLayout, ts)
	if err != nil {
		return Position{}, false
	}
	return Position{t, id}, true
}

// Before reports whether p comes before q.
func (p Position) Before(q Position) bool {
	if !p.Created.Equal(q.Created) {
		return p.Created.Before(q.Created)
	}
	return p.ID < q.ID
}

// Page asks for part of a list: the records after After (nil: from the
// first; a position, not a record: it need not exist), at most Limit of
// them (0 or less: all).
type Page struct {
	After *Position
	Limit int
}

// Position is where the record sits in lists.
func (v *Volume) Position() Position     { return Position{v.CreatedAt, v.ID} }
func (s *Snapshot) Position() Position   { return Position{s.CreatedAt, s.ID} }
func (a *Attachment) Position() Position { return Position{a.CreatedAt, a.ID} }

// indexed is what owned needs of a record.
type indexed interface {
	versioned
	OwnedBy() string
	Position() Position
}

// OwnedVolumes lists the volumes of owner (a user's ID) that p asks for,
// in Position order. It reads the owner's index keys and the records
// they name, nothing else.
func (s *Store) OwnedVolumes(ctx context.Context, owner string, p Page) ([]*Volume, error) {
	return owned(ctx, s, ownedVolumes, whose{owner: owner}, p, func() *Volume { return &Volume{} }, nil)
}

// OwnedSnapshots lists the snapshots of owner that keep accepts (nil:
// all) and p asks for, as OwnedVolumes does; the limit counts accepted
// snapshots, and the owner's others are read to find them.
func (s *Store) OwnedSnapshots(ctx context.Context, owner string, p Page, keep func(*Snapshot) bool) ([]*Snapshot, error) {
	return owned(ctx, s, ownedSnapshots, whose{owner: owner}, p, func() *Snapshot { return &Snapshot{} }, keep)
}

// OwnedAttachments lists the attachments of owner that p asks for, as
// OwnedVolumes does.
func (s *Store) OwnedAttachments(ctx context.Context, owner string, p Page) ([]*Attachment, error) {
	return owned(ctx, s, ownedAttachments, whose{owner: owner}, p, func() *Attachment { return &Attachment{} }, nil)
}

// AllVolumes lists the volumes of every owner that p asks for, in
// Position order (an admin's list). It reads the all-owners index keys
// from p's position and the records they name, nothing else: a page
// costs its limit, not the cluster's volumes.
func (s *Store) AllVolumes(ctx context.Context, p Page) ([]*Volume, error) {
	return owned(ctx, s, ownedVolumes, everyone, p, func() *Volume { return &Volume{} }, nil)
}

// AllSnapshots lists the snapshots of every owner that p asks for, as
// AllVolumes does.
func (s *Store) AllSnapshots(ctx context.Context, p Page) ([]*Snapshot, error) {
	return owned(ctx, s, ownedSnapshots, everyone, p, func() *Snapshot { return &Snapshot{} }, nil)
}

// AllAttachments lists the attachments of every owner that p asks for,
// as AllVolumes does.
func (s *Store) AllAttachments(ctx context.Context, p Page) ([]*Attachment, error) {
	return owned(ctx, s, ownedAttachments, everyone, p, func() *Attachment { return &Attachment{} }, nil)
}

// whose names the records owned lists: one owner's, or everyone's.
type whose struct {
	all   bool   // everyone's: the all-owners keys
	owner string // else this owner's: the owner's keys
}

// everyone is every owner's records.
var everyone = whose{all: true}

// prefix is the prefix of the index keys of kind k that list w's records.
func (w whose) prefix(k ownedKind) string {
	if w.all {
		return k.allPrefix()
	}
	return k.prefix(w.owner)
}

// key is the index key of kind k at which a record r lists in w's list.
func (w whose) key(k ownedKind, r indexed) string {
	pos := r.Position()
	if w.all {
		return k.allKey(pos.Created, pos.ID)
	}
	return k.key(r.OwnedBy(), pos.Created, pos.ID)
}

// ownedScan is how many index keys a filtered list reads at least at a
// time: a filter may drop most of them.
const ownedScan = 64

// owned lists the records of kind k of w — one owner's, or everyone's —
// through the index:
// a range read of the index keys from p's position (as many as the page
// still needs, at most MaxTxnOps), then the records they name, until the
// page is full or the keys run out. Both reads are linearizable as
// Store.read's are (and fall back to the local copy as they do). An index
// key whose record is gone, or is no longer at that key (another owner,
// another creation time), is skipped: one transaction writes both, so
// none should be.
func owned[T indexed](ctx context.Context, s *Store, k ownedKind, w whose, p Page, mk func() T, keep func(T) bool) ([]T, error) {
	prefix := w.prefix(k)
	from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	if p.After != nil {
		// The first key after the position's own (which need not exist).
		from = prefix + p.After.Key() + "\x00"
	}
	out := []T{}
	for p.Limit <= 0 || len(out) < p.Limit {
		n := MaxTxnOps
		if p.Limit > 0 {
			need := p.Limit - len(out)
			if keep != nil {
				need = max(need, ownedScan)
			}
			n = min(n, need)
		}
		resp, err := s.read(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(n)))
		if err != nil {
			return nil, wrap("list", err)
		}
		if len(resp.Kvs) == 0 {
			break
		}
		keys := make([]string, len(resp.Kvs))
		for i, kv := range resp.Kvs {
			keys[i] = k.records + string(kv.Value)
		}
		recs, err := s.getMany(ctx, keys)
		if err != nil {
			return nil, err
		}
		for i, kv := range recs {
			if kv == nil {
				continue
			}
			r := mk()
			if err := decode(keys[i], kv.Value, r); err != nil {
				return nil, err
			}
			if w.key(k, r) != string(resp.Kvs[i].Key) {
				continue
			}
			if keep != nil && !keep(r) {
				continue
			}
			out = append(out, r)
			if len(out) == p.Limit {
				break
			}
		}
		if !resp.More {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return out, nil
}

// AttachmentsByID reads the attachments ids name (a volume's
// Attachments), in that order, in batched Gets; those that do not exist
// are left out.
func (s *Store) AttachmentsByID(ctx context.Context, ids []string) ([]*Attachment, error) {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = attachmentKey(id)
	}
	kvs, err := s.getMany(ctx, keys)
	if err != nil {
		return nil, err
	}
	out := make([]*Attachment, 0, len(ids))
	for i, kv := range kvs {
		if kv == nil {
			continue
		}
		a := &Attachment{}
		if err := decode(keys[i], kv.Value, a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// getMany reads keys in etcd Txns of at most MaxTxnOps Gets (readTxn);
// keys[i]'s value is at [i], nil when absent.
func (s *Store) getMany(ctx context.Context, keys []string) ([]*mvccpb.KeyValue, error) {
	out := make([]*mvccpb.KeyValue, len(keys))
	for i := 0; i < len(keys); i += MaxTxnOps {
		resp, err := s.readTxn(ctx, keys[i:min(i+MaxTxnOps, len(keys))])
		if err != nil {
			return nil, wrap("get", err)
		}
		for j, r := range resp.Responses {
			if rr := r.GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
				out[i+j] = rr.Kvs[0]
			}
		}
	}
	return out, nil
}

// readTxn is Store.read for several keys at once: one etcd Txn of a Get
// of each (with opts), at one revision — linearizable, as etcd serves a
// Txn of Gets unless every Get is serializable, with read's fallback to
// the local copy (readEither).
func (s *Store) readTxn(ctx context.Context, keys []string, opts ...clientv3.OpOption) (*clientv3.TxnResponse, error) {
	ops := func(extra ...clientv3.OpOption) []clientv3.Op {
		out := make([]clientv3.Op, len(keys))
		for i, k := range keys {
			out[i] = clientv3.OpGet(k, append(slices.Clone(opts), extra...)...)
		}
		return out
	}
	return readEither(ctx, s,
		func(ctx context.Context, c *clientv3.Client) (*clientv3.TxnResponse, error) {
			return c.Txn(ctx).Then(ops()...).Commit()
		},
		func(ctx context.Context, c *clientv3.Client) (*clientv3.TxnResponse, error) {
			return c.Txn(ctx).Then(ops(clientv3.WithSerializable())...).Commit()
		})
}

var (
	// ownedIndexBatch is how many records, or index keys, one transaction
	// of ReconcileOwnedIndex handles: at most MaxTxnOps comparisons (one
	// for each record indexed, one or two for each key deleted: its own
	// and, but for a legacy key, its record's), reads (as many, of a
	// spoiled batch of deletes) and writes (two for each record: both its
	// keys).
	ownedIndexBatch = MaxTxnOps / 4
	// ownedIndexHook, when set (tests), runs between the read of a batch
	// of records and its commit.
	ownedIndexHook func()
)

// ReconcileOwnedIndex brings the owned index in step with the records and
// reports whether it wrote anything. Nodes call it at every start.
//
// Every write of this version keeps the two in step, in one transaction;
// they differ only where an older version wrote or deleted records —
// before the upgrade to this one, or during a rolling upgrade, on a node
// not upgraded yet: a version without the index (no keys), one with the
// owners' keys only (no all-owners keys: records it writes lack theirs,
// records it deletes leave theirs behind), or the one that kept the
// all-owners keys at owned/<kind>/*/ (records it writes lack their
// ordered/ keys, records it deletes leave them behind, and its starts
// write the */ keys again). Each start repairs
// what such nodes did before it, and the last start of a rolling upgrade
// all of it, whatever they did (a count of records against keys would
// miss a create and a delete). It reads every record and every index key
// of both forms of each kind, and writes only the differences:
//   - a record without one of its keys, or whose key names another id
//     (no version writes one; a hand's edit), gets it, in a transaction of a
//     batch that commits only if every record of the batch is still as
//     read (a record changed or deleted meanwhile is read again: its
//     deletion took its keys, which must not come back);
//   - an index key, of either form, whose record is gone, or is indexed
//     under another key, is deleted, only if neither the key nor the
//     record changed since read (if one did, a transaction of this
//     version kept the index in step, or the next start will); a key of
//     the */ form (legacy) is deleted whatever its record did. Keys are
//     deleted in batches; a batch a change spoils is tried again without
//     the keys that change concerns (deleteStale).
//
// Records this version writes meanwhile are indexed by their own
// transactions, so none is missed. It is idempotent: nodes starting at
// once may reconcile side by side, and one that stops half way leaves the
// rest to the next start. A corrupt record, which names no owner and
// creation time, cannot be indexed: every start logs it.
func (s *Store) ReconcileOwnedIndex(ctx context.Context) (bool, error) {
	var written, deleted int
	for _, k := range ownedKinds {
		w, d, err := s.reconcileOwned(ctx, k)
		written, deleted = written+w, deleted+d
		if err != nil {
			return false, fmt.Errorf("reconcile the owned index of %s: %w", k.name, err)
		}
	}
	if written+deleted > 0 {
		s.log.Info("owned index (lists by owner and of everything) brought in step with the records: records written or deleted by an older version",
			"keys_written", written, "stale_keys_deleted", deleted)
	}
	return written+deleted > 0, nil
}

// reconcileOwned is ReconcileOwnedIndex for kind k.
func (s *Store) reconcileOwned(ctx context.Context, k ownedKind) (written, deleted int, err error) {
	have, err := s.ownedKeys(ctx, k)
	if err != nil {
		return 0, 0, err
	}
	want := map[string]bool{}    // index keys (both forms) the records call for
	recRev := map[string]int64{} // record id -> mod revision, as read
	from, end := k.records, clientv3.GetPrefixRangeEnd(k.records)
	for {
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		resp, err := s.cli.Get(rctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(ownedIndexBatch)))
		cancel()
		if err != nil {
			return written, deleted, wrap("read records", err)
		}
		var cmps []clientv3.Cmp
		var puts []clientv3.Op
		var batch []string // index keys of the batch's records
		var ids []string   // the batch's records
		for _, kv := range resp.Kvs {
			id := strings.TrimPrefix(string(kv.Key), k.records)
			keys, ok := k.keysOf(id, string(kv.Value))
			if !ok {
				s.log.Warn("a record names no owner and creation time: lists leave it out", "key", string(kv.Key))
				continue
			}
			recRev[id] = kv.ModRevision
			ids = append(ids, id)
			missing := false
			for _, key := range keys {
				want[key] = true
				batch = append(batch, key)
				if got, ok := have[key]; !ok || got.id != id { // absent, or naming another
					missing = true
					puts = append(puts, clientv3.OpPut(key, id))
				}
			}
			if missing {
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
			}
		}
		if ownedIndexHook != nil {
			ownedIndexHook()
		}
		if len(puts) > 0 {
			ok, err := s.commitIf(ctx, cmps, puts)
			if err != nil {
				return written, deleted, err
			}
			if !ok {
				// A record of the batch changed: read the batch again
				// (its records' revisions too: one deleted meanwhile is
				// absent, revision 0, when its keys are judged stale).
				for _, key := range batch {
					delete(want, key)
				}
				for _, id := range ids {
					delete(recRev, id)
				}
				continue
			}
			written += len(puts)
		}
		if !resp.More {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	// Stale keys, in batches of one transaction each.
	var stale []string
	flush := func() error {
		n, err := s.deleteStale(ctx, k, stale, have, recRev)
		deleted += n
		stale = stale[:0]
		return err
	}
	for key := range have {
		if want[key] {
			continue
		}
		stale = append(stale, key)
		if len(stale) == ownedIndexBatch {
			if err := flush(); err != nil {
				return written, deleted, err
			}
		}
	}
	return written, deleted, flush()
}

// staleRounds bounds how often deleteStale reads a spoiled batch again.
const staleRounds = 8

// deleteStale deletes the stale index keys of kind k in one transaction
// that requires each key unchanged since read (at have's revision) and,
// unless the key is legacy (stale whatever its record does), its record
// too (at recRev's, 0: absent), and returns how many it deleted. When a
// change spoils the transaction — a key or record changed meanwhile, by a
// write of this version that kept the index in step, or an older node
// whose change the next start judges — it reads the keys' and records'
// revisions, drops the keys whose own or whose record's changed, and
// tries the rest again: a change costs one read and one transaction, not
// one transaction per key (nodes starting at once spoil each other's
// batches). Each spoiled round drops at least the key whose change
// spoiled it; after staleRounds rounds the rest is left to the next
// start.
func (s *Store) deleteStale(ctx context.Context, k ownedKind, keys []string, have map[string]indexKey, recRev map[string]int64) (int, error) {
	record := func(key string) string {
		if k.legacy(key) {
			return ""
		}
		return k.records + key[strings.LastIndex(key, "/")+1:]
	}
	keys = slices.Clone(keys)
	for range staleRounds {
		if len(keys) == 0 {
			return 0, nil
		}
		var cmps []clientv3.Cmp
		var dels []clientv3.Op
		for _, key := range keys {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", have[key].rev))
			if rec := record(key); rec != "" {
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(rec), "=", recRev[strings.TrimPrefix(rec, k.records)]))
			}
			dels = append(dels, clientv3.OpDelete(key))
		}
		ok, err := s.commitIf(ctx, cmps, dels)
		if err != nil {
			return 0, err
		}
		if ok {
			return len(keys), nil
		}
		// Spoiled: keep the keys that, with their records, are still as
		// read.
		var gets []clientv3.Op
		for _, key := range keys {
			gets = append(gets, clientv3.OpGet(key, clientv3.WithKeysOnly()))
			if rec := record(key); rec != "" {
				gets = append(gets, clientv3.OpGet(rec, clientv3.WithKeysOnly()))
			}
		}
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		resp, err := s.cli.Txn(rctx).Then(gets...).Commit()
		cancel()
		if err != nil {
			return 0, wrap("reconcile the owned index", err)
		}
		rev := func(i int) int64 {
			if kvs := resp.Responses[i].GetResponseRange().GetKvs(); len(kvs) > 0 {
				return kvs[0].ModRevision
			}
			return 0
		}
		kept, i := keys[:0], 0
		for _, key := range keys {
			same := rev(i) == have[key].rev
			i++
			if rec := record(key); rec != "" {
				same = same && rev(i) == recRev[strings.TrimPrefix(rec, k.records)]
				i++
			}
			if same {
				kept = append(kept, key)
			}
		}
		keys = kept
	}
	return 0, nil
}

// indexKey is an index key as reconcileOwned read it.
type indexKey struct {
	rev int64  // its mod revision
	id  string // the record it names (its value)
}

// ownedKeys reads every index key of kind k, of both forms.
func (s *Store) ownedKeys(ctx context.Context, k ownedKind) (map[string]indexKey, error) {
	out := map[string]indexKey{}
	for _, root := range k.roots() {
		from, end := root, clientv3.GetPrefixRangeEnd(root)
		for {
			rctx, cancel := context.WithTimeout(ctx, requestTimeout)
			resp, err := s.cli.Get(rctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(ownedIndexBatch)))
			cancel()
			if err != nil {
				return nil, wrap("read the owned index", err)
			}
			for _, kv := range resp.Kvs {
				out[string(kv.Key)] = indexKey{kv.ModRevision, string(kv.Value)}
			}
			if !resp.More {
				break
			}
			from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
	}
	return out, nil
}

// commitIf commits ops if every comparison holds; false when one did not.
func (s *Store) commitIf(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) (bool, error) {
	tctx, cancel := context.WithTimeout(ctx, s.writeTimeout())
	defer cancel()
	resp, err := s.cli.Txn(tctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		if ctx.Err() == nil && unavailable(err) {
			s.quorumLost()
		}
		return false, wrap("reconcile the owned index", err)
	}
	return resp.Succeeded, nil
}

// CheckOwnedIndex compares the owned index with the records, both read at
// one revision, and returns a line for each disagreement — a record
// without one of its index keys (its owner's, its all-owners), an index
// key of either form without its record — or none (the invariant of the
// package doc).
func (s *Store) CheckOwnedIndex(ctx context.Context) ([]string, error) {
	var prefixes []string
	for _, k := range ownedKinds {
		r := k.roots()
		prefixes = append(prefixes, k.records, r[0], r[1])
	}
	resp, err := s.readTxn(ctx, prefixes, clientv3.WithPrefix())
	if err != nil {
		return nil, wrap("check the owned index", err)
	}
	var problems []string
	for i, k := range ownedKinds {
		want := map[string]string{} // index key → id
		for _, kv := range resp.Responses[3*i].GetResponseRange().Kvs {
			id := strings.TrimPrefix(string(kv.Key), k.records)
			keys, ok := k.keysOf(id, string(kv.Value))
			if !ok {
				problems = append(problems, fmt.Sprintf("record %s names no owner and creation time", kv.Key))
				continue
			}
			for _, key := range keys {
				want[key] = id
			}
		}
		have := map[string]string{}
		for _, r := range resp.Responses[3*i+1 : 3*i+3] {
			for _, kv := range r.GetResponseRange().Kvs {
				have[string(kv.Key)] = string(kv.Value)
			}
		}
		for key, id := range want {
			if got, ok := have[key]; !ok || got != id {
				problems = append(problems, fmt.Sprintf("record %s%s has no index key %s", k.records, id, key))
			}
		}
		for key, id := range have {
			if w, ok := want[key]; !ok || w != id {
				problems = append(problems, fmt.Sprintf("index key %s names no record (%q)", key, id))
			}
		}
	}
	slices.Sort(problems)
	return problems, nil
}
