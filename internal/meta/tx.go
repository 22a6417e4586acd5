package meta

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/size"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Tx is a serializable metadata transaction. Writes apply atomically at
// commit, which succeeds only if every key read is still as read; the whole
// function is otherwise run again (see stm.go), as it is before an error it
// returned is believed. Functions passed to Update must therefore have no
// side effects outside the Tx. A Tx reads at most MaxTxnOps keys (each is
// compared at commit) and writes at most as many.
type Tx struct {
	stm *stm
}

// Update runs fn in a serializable transaction (see stm.go), retrying on
// conflict. An error returned by fn aborts the transaction and is returned
// as is.
func (s *Store) Update(ctx context.Context, fn func(*Tx) error) error {
	tctx, cancel := context.WithTimeout(ctx, s.writeTimeout())
	defer cancel()
	var last *stm // the attempt that ran last: on success, the one that committed
	err := runSTM(tctx, s.txnClient(), s.attemptMode(), func(tx *Tx) error { last = tx.stm; return fn(tx) })
	if err != nil && ctx.Err() == nil && unavailable(err) {
		s.quorumLost()
	}
	if err == nil {
		s.quorumAnswered()
		s.mirrorsWrote(last.committed, last.changed)
	}
	return wrap("update", err)
}

// attemptMode is how a transaction's first attempt reads here (stm.go).
func (s *Store) attemptMode() attemptMode {
	switch m, serves, learner := s.ownMember(); {
	case !serves || learner:
		return modeCareful
	case m.e.Server.Leader() == m.e.Server.MemberID():
		return modeOptimistic
	default:
		return modeBarrier
	}
}

// txnClient is the client transactions run on: the node's own member when
// it is a voter — its first, linearizable read leaves it at least at the
// revision every later read of the transaction asks for — else the
// cluster client (a learner serves no linearizable reads, a removed or
// stopped member none at all).
func (s *Store) txnClient() *clientv3.Client {
	if m, serves, learner := s.ownMember(); serves && !learner {
		return m.local
	}
	return s.cli
}

func txGet[T versioned](tx *Tx, key string, r T) (bool, error) {
	v := tx.stm.Get(key)
	if v == "" {
		return false, nil
	}
	return true, decode(key, []byte(v), r)
}

// User reads a user; nil when absent.
func (tx *Tx) User(name string) (*User, error) {
	u := &User{}
	ok, err := txGet(tx, userKey(name), u)
	if !ok || err != nil {
		return nil, err
	}
	return u, nil
}

// Volume reads a volume; nil when absent.
func (tx *Tx) Volume(id string) (*Volume, error) {
	v := &Volume{}
	ok, err := txGet(tx, volumeKey(id), v)
	if !ok || err != nil {
		return nil, err
	}
	return v, nil
}

// Snapshot reads a snapshot; nil when absent.
func (tx *Tx) Snapshot(id string) (*Snapshot, error) {
	sn := &Snapshot{}
	ok, err := txGet(tx, snapshotKey(id), sn)
	if !ok || err != nil {
		return nil, err
	}
	return sn, nil
}

// Alive reports whether node's liveness key exists (KeepAlive); the
// commit requires it still so — an adoption of a dead node's workflow
// commits only while that node is gone.
func (tx *Tx) Alive(node string) bool { return tx.stm.Get(prefixAlive+node) != "" }

// PutUser writes a user and its S3 key index. A record that replaces the
// user's access key (new credentials) drops the old key's index entry, so
// that the old key resolves to nobody.
func (tx *Tx) PutUser(u *User) {
	if prev, err := tx.User(u.Name); err == nil && prev != nil && prev.AccessKeyID != "" && prev.AccessKeyID != u.AccessKeyID {
		tx.stm.Del(s3Key(prev.AccessKeyID))
	}
	u.Schema = SchemaVersion
	tx.stm.Put(userKey(u.Name), encode(u))
	if u.AccessKeyID != "" {
		tx.stm.Put(s3Key(u.AccessKeyID), u.Name)
	}
}

// DeleteUser removes a user and its S3 key index.
func (tx *Tx) DeleteUser(u *User) {
	tx.stm.Del(userKey(u.Name))
	if u.AccessKeyID != "" {
		tx.stm.Del(s3Key(u.AccessKeyID))
	}
}

// PutVolume writes a volume record and its owned-index keys (owned.go).
func (tx *Tx) PutVolume(v *Volume) {
	v.Schema = SchemaVersion
	tx.index(ownedVolumes, v.ID, v.OwnerID, v.CreatedAt)
	tx.stm.Put(volumeKey(v.ID), encode(v))
}

// DeleteVolume removes a volume record and its owned-index keys.
func (tx *Tx) DeleteVolume(id string) {
	tx.unindex(ownedVolumes, id)
	tx.stm.Del(volumeKey(id))
}

// Attachment reads an attachment; nil when absent.
func (tx *Tx) Attachment(id string) (*Attachment, error) {
	a := &Attachment{}
	ok, err := txGet(tx, attachmentKey(id), a)
	if !ok || err != nil {
		return nil, err
	}
	return a, nil
}

// PutAttachment writes an attachment, its export index and its
// owned-index keys.
func (tx *Tx) PutAttachment(a *Attachment) {
	a.Schema = SchemaVersion
	tx.index(ownedAttachments, a.ID, a.OwnerID, a.CreatedAt)
	tx.stm.Put(attachmentKey(a.ID), encode(a))
	tx.stm.Put(exportKey(a.Export), a.ID)
}

// DeleteAttachment removes an attachment, its export index and its
// owned-index keys.
func (tx *Tx) DeleteAttachment(a *Attachment) {
	tx.unindex(ownedAttachments, a.ID)
	tx.stm.Del(attachmentKey(a.ID))
	tx.stm.Del(exportKey(a.Export))
}

// PutSnapshot writes a snapshot record and its owned-index keys.
func (tx *Tx) PutSnapshot(s *Snapshot) {
	s.Schema = SchemaVersion
	tx.index(ownedSnapshots, s.ID, s.OwnerID, s.CreatedAt)
	tx.stm.Put(snapshotKey(s.ID), encode(s))
}

// DeleteSnapshot removes a snapshot record and its owned-index keys.
func (tx *Tx) DeleteSnapshot(id string) {
	tx.unindex(ownedSnapshots, id)
	tx.stm.Del(snapshotKey(id))
}

// VolumeType reads an admin-created volume type; nil when absent.
func (tx *Tx) VolumeType(name string) (*VolumeType, error) {
	t := &VolumeType{}
	ok, err := txGet(tx, typeKey(name), t)
	if !ok || err != nil {
		return nil, err
	}
	return t, nil
}

// PutVolumeType writes a volume type.
func (tx *Tx) PutVolumeType(t *VolumeType) {
	t.Schema = SchemaVersion
	tx.stm.Put(typeKey(t.Name), encode(t))
}

// DeleteVolumeType removes a volume type.
func (tx *Tx) DeleteVolumeType(name string) { tx.stm.Del(typeKey(name)) }

// Bucket reads a bucket; nil when absent.
func (tx *Tx) Bucket(name string) (*Bucket, error) {
	b := &Bucket{}
	ok, err := txGet(tx, bucketKey(name), b)
	if !ok || err != nil {
		return nil, err
	}
	return b, nil
}

// PutBucket writes a bucket.
func (tx *Tx) PutBucket(b *Bucket) {
	b.Schema = SchemaVersion
	tx.stm.Put(bucketKey(b.Name), encode(b))
}

// DeleteBucket removes a bucket.
func (tx *Tx) DeleteBucket(name string) { tx.stm.Del(bucketKey(name)) }

// Empty reports whether no key starts with prefix (a lock queue, for one:
// lock.QueuePrefix); the transaction then commits only if that still holds.
func (tx *Tx) Empty(prefix string) bool { return tx.stm.Empty(prefix) }

// NameOwner returns the id holding a name, or "".
func (tx *Tx) NameOwner(kind, owner, name string) string {
	return tx.stm.Get(nameKey(kind, owner, name))
}

// Holds reports whether the lock key created at revision token still
// exists (see lock.Held: Key and Token). A transaction that checks it
// commits only while the lock is held: the key is read, so a key deleted
// before the commit — the holder's session expired, a partition — fails
// the commit, and the attempt that follows finds the lock gone.
func (tx *Tx) Holds(key string, token int64) bool {
	return token != 0 && tx.stm.CreateRevision(key) == token
}

// ClaimName binds name to id for owner, failing with NameConflict when
// another id holds it. An empty name claims nothing.
func (tx *Tx) ClaimName(kind, owner, name, id string) error {
	if name == "" {
		return nil
	}
	if !validKeyPart(owner) || !validKeyPart(name) {
		return errs.Invalid(errs.CodeInvalidName, "name %q is not valid", name)
	}
	if cur := tx.NameOwner(kind, owner, name); cur != "" && cur != id {
		return errs.Conflict(errs.CodeNameConflict, "a %s named %q already exists (%s)", kind, name, cur)
	}
	tx.stm.Put(nameKey(kind, owner, name), id)
	return nil
}

// ReleaseName frees a name if id holds it.
func (tx *Tx) ReleaseName(kind, owner, name, id string) {
	if name != "" && tx.NameOwner(kind, owner, name) == id {
		tx.stm.Del(nameKey(kind, owner, name))
	}
}

// TokenOwner returns the id a create of kind (NameVolume, NameSnapshot)
// made under an idempotency token, or "".
func (tx *Tx) TokenOwner(kind, owner, token string) string {
	if token == "" {
		return ""
	}
	return tx.stm.Get(tokenKey(kind, owner, token))
}

// PutToken records that token created id.
func (tx *Tx) PutToken(kind, owner, token, id string) {
	if token != "" {
		tx.stm.Put(tokenKey(kind, owner, token), id)
	}
}

// DeleteToken forgets a token (when its resource is deleted).
func (tx *Tx) DeleteToken(kind, owner, token string) {
	if token != "" {
		tx.stm.Del(tokenKey(kind, owner, token))
	}
}

// Provisioned returns the bytes promised to volumes and snapshots.
func (tx *Tx) Provisioned() int64 {
	n, _ := strconv.ParseInt(tx.stm.Get(keyProvisioned), 10, 64)
	return n
}

// Provision adds delta bytes to the provisioned total. A positive delta
// fails with InsufficientCapacity when the total would exceed limit.
func (tx *Tx) Provision(delta, limit int64) error {
	cur := tx.Provisioned()
	if delta > 0 && delta > limit-cur { // not cur+delta > limit: that can overflow
		return errs.New(errs.KindInsufficientStorage, errs.CodeInsufficientCapacity,
			"not enough capacity: %s requested, %s of %s provisionable are already provisioned",
			size.Bytes(delta), size.Bytes(cur), size.Bytes(limit))
	}
	next := cur + delta
	if next < 0 {
		next = 0
	}
	tx.stm.Put(keyProvisioned, strconv.FormatInt(next, 10))
	return nil
}

// linearTimeout bounds a linearizable read before read falls back to the
// local copy: long enough for a leader election, short enough that reads
// keep answering while the cluster has no quorum.
const linearTimeout = 3 * time.Second

// read is a linearizable Get — it sees every write acknowledged anywhere
// before it, so a record created through one node is visible through
// every other at once — unless no quorum answers in time (or, under load,
// the leader does not: this read only, see quorumLost) or ctx asks for a
// stale read (Stale): then it is answered from the local member's copy
// (serializable; a client node without a member asks a voter), which may
// miss the latest writes but needs no leader and keeps reads working
// while writes cannot. ReadInfo records that it happened.
func (s *Store) read(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	return readEither(ctx, s,
		func(ctx context.Context, c *clientv3.Client) (*clientv3.GetResponse, error) {
			return c.Get(ctx, key, opts...)
		},
		func(ctx context.Context, c *clientv3.Client) (*clientv3.GetResponse, error) {
			return c.Get(ctx, key, append(opts, clientv3.WithSerializable())...)
		})
}

// readEither answers a read as read describes: linear, on the client
// transactions run on within linearTimeout, unless the quorum is known
// lost or ctx asks for a stale read; then, or when no quorum answers in
// time, local (serializable) on the local copy, recorded in ctx's
// ReadInfo. A ctx marked Linear gets the linear answer or an error.
func readEither[R any](ctx context.Context, s *Store, linear, local func(context.Context, *clientv3.Client) (R, error)) (R, error) {
	var err error
	if only := wantsLinear(ctx); only || !s.q.lost.Load() && !wantsStale(ctx) {
		timeout := linearTimeout
		if only {
			timeout = requestTimeout // no local answer to fall back on
		}
		lctx, cancel := context.WithTimeout(ctx, timeout)
		var resp R
		resp, err = linear(lctx, s.txnClient())
		cancel()
		if err == nil {
			s.quorumAnswered()
		}
		if err == nil || ctx.Err() != nil || !unavailable(err) || only {
			return resp, err
		}
		s.quorumLost()
	}
	sctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, serr := local(sctx, s.localCopy())
	if serr != nil {
		if err == nil {
			err = serr
		}
		var none R
		return none, err
	}
	markLocal(ctx)
	return resp, nil
}

// errAbsent marks a Get of a missing record.
var errAbsent = errors.New("absent")

func (s *Store) get(ctx context.Context, key string, r versioned) error {
	resp, err := s.read(ctx, key)
	if err != nil {
		return wrap("get", err)
	}
	if len(resp.Kvs) == 0 {
		return errAbsent
	}
	return decode(key, resp.Kvs[0].Value, r)
}

func list[T versioned](ctx context.Context, s *Store, prefix string, mk func() T) ([]T, error) {
	resp, err := s.read(ctx, prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, wrap("list", err)
	}
	out := make([]T, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		r := mk()
		if err := decode(string(kv.Key), kv.Value, r); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
