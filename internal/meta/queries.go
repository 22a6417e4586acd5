package meta

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// User returns a user, or a NotFound error.
func (s *Store) User(ctx context.Context, name string) (*User, error) {
	u := &User{}
	if err := s.get(ctx, userKey(name), u); err != nil {
		if errors.Is(err, errAbsent) {
			return nil, errs.NotFound("user", name)
		}
		return nil, err
	}
	return u, nil
}

// Users lists every user by name.
func (s *Store) Users(ctx context.Context) ([]*User, error) {
	return list(ctx, s, prefixUsers, func() *User { return &User{} })
}

// UserByAccessKey resolves an S3 access key id to its user.
func (s *Store) UserByAccessKey(ctx context.Context, access string) (*User, error) {
	resp, err := s.read(ctx, s3Key(access))
	if err != nil {
		return nil, wrap("get", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, errs.NotFound("access key", access)
	}
	u, err := s.User(ctx, string(resp.Kvs[0].Value))
	if errs.IsCode(err, errs.CodeNotFound) || err == nil && u.AccessKeyID != access {
		// The index and the record are written in one transaction;
		// read apart, the key may have been replaced (new credentials)
		// or its user deleted in between: the key is nobody's now.
		return nil, errs.NotFound("access key", access)
	}
	return u, err
}

// Volume returns a volume, or a NotFound error.
func (s *Store) Volume(ctx context.Context, id string) (*Volume, error) {
	v := &Volume{}
	if err := s.get(ctx, volumeKey(id), v); err != nil {
		if errors.Is(err, errAbsent) {
			return nil, errs.NotFound("volume", id)
		}
		return nil, err
	}
	return v, nil
}

// Volumes lists every volume.
func (s *Store) Volumes(ctx context.Context) ([]*Volume, error) {
	return list(ctx, s, prefixVolumes, func() *Volume { return &Volume{} })
}

// Snapshot returns a snapshot, or a NotFound error.
func (s *Store) Snapshot(ctx context.Context, id string) (*Snapshot, error) {
	sn := &Snapshot{}
	if err := s.get(ctx, snapshotKey(id), sn); err != nil {
		if errors.Is(err, errAbsent) {
			return nil, errs.NotFound("snapshot", id)
		}
		return nil, err
	}
	return sn, nil
}

// Snapshots lists every snapshot.
func (s *Store) Snapshots(ctx context.Context) ([]*Snapshot, error) {
	return list(ctx, s, prefixSnaps, func() *Snapshot { return &Snapshot{} })
}

// Attachment returns an attachment, or a NotFound error.
func (s *Store) Attachment(ctx context.Context, id string) (*Attachment, error) {
	a := &Attachment{}
	if err := s.get(ctx, attachmentKey(id), a); err != nil {
		if errors.Is(err, errAbsent) {
			return nil, errs.NotFound("attachment", id)
		}
		return nil, err
	}
	return a, nil
}

// AttachmentByExport resolves an NBD export name to its attachment.
func (s *Store) AttachmentByExport(ctx context.Context, export string) (*Attachment, error) {
	if !validKeyPart(export) {
		return nil, errs.NotFound("export", "")
	}
	resp, err := s.read(ctx, exportKey(export))
	if err != nil {
		return nil, wrap("get", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, errs.NotFound("export", "")
	}
	return s.Attachment(ctx, string(resp.Kvs[0].Value))
}

// ErrHistoryCompacted: a watch was to resume at a revision whose history
// the store no longer keeps, so changes since may be lost to it; the
// caller takes stock anew and watches on from there.
var ErrHistoryCompacted = errors.New("metadata history compacted past the watch's revision")

// AttachmentIDs returns the id of every attachment and the revision of the
// store the list reflects: an attachment deleted at or before it is absent.
func (s *Store) AttachmentIDs(ctx context.Context) (map[string]bool, int64, error) {
	resp, err := s.read(ctx, prefixAttach, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, 0, wrap("list attachments", err)
	}
	ids := make(map[string]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		ids[strings.TrimPrefix(string(kv.Key), prefixAttach)] = true
	}
	return ids, resp.Header.Revision, nil
}

// WatchAttachmentDeletes calls deleted with the id of every attachment
// deleted after revision rev (on whichever node), in order, until ctx ends
// (it returns nil) or the history it needs is compacted away (an error
// wrapping ErrHistoryCompacted; see AttachmentIDs). A broken watch (leader
// lost, connection reset) resumes after the last deletion it delivered, so
// none is missed; deleted may see an id twice.
func (s *Store) WatchAttachmentDeletes(ctx context.Context, rev int64, deleted func(id string)) error {
	next := rev + 1
	for ctx.Err() == nil {
		if err := s.watchAttachmentDeletes(ctx, &next, deleted); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

// watchAttachmentDeletes runs one watch from revision *next until it
// breaks, advancing *next past every deletion it delivers (etcd never
// splits a revision's events across responses).
func (s *Store) watchAttachmentDeletes(ctx context.Context, next *int64, deleted func(id string)) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, prefixAttach, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(*next))
	for resp := range wch {
		if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
			return fmt.Errorf("watch attachment deletions from revision %d (compacted up to %d): %w",
				*next, resp.CompactRevision, ErrHistoryCompacted)
		}
		for _, ev := range resp.Events {
			deleted(strings.TrimPrefix(string(ev.Kv.Key), prefixAttach))
			*next = ev.Kv.ModRevision + 1
		}
	}
	return nil
}

// Revision is the store's current revision, read as the lists are
// (Volumes, Snapshots): a watch from the revision after it, started
// before such a list, misses nothing the list does not hold.
func (s *Store) Revision(ctx context.Context) (int64, error) {
	resp, err := s.read(ctx, keyCluster, clientv3.WithCountOnly())
	if err != nil {
		return 0, wrap("get revision", err)
	}
	return resp.Header.Revision, nil
}

// WatchSnapshots calls fn with every snapshot record written from
// revision from (0: from now on), until ctx ends.
func (s *Store) WatchSnapshots(ctx context.Context, from int64, fn func(*Snapshot)) {
	watchPuts(ctx, s, prefixSnaps, from, func() *Snapshot { return &Snapshot{} }, fn)
}

// WatchVolumes calls fn with every volume record written from revision
// from (0: from now on), until ctx ends.
func (s *Store) WatchVolumes(ctx context.Context, from int64, fn func(*Volume)) {
	watchPuts(ctx, s, prefixVolumes, from, func() *Volume { return &Volume{} }, fn)
}

// watchPuts calls fn with every record under prefix written from revision
// from on (0: from now on). A watch that breaks (a leader election, a
// lost connection) resumes from the revision after the last event it
// delivered, so no write is missed; if etcd compacted that history
// meanwhile, fn is called with every current record instead, and the
// watch goes on from there.
func watchPuts[T versioned](ctx context.Context, s *Store, prefix string, from int64, mk func() T, fn func(T)) {
	next := from    // the first revision not yet delivered; 0: unknown
	relist := false // the history from next was compacted
	call := func(kv *mvccpb.KeyValue) {
		r := mk()
		if err := decode(string(kv.Key), kv.Value, r); err == nil {
			fn(r)
		}
	}
	for ctx.Err() == nil {
		if next == 0 {
			// At start only the revision is needed; after a compaction,
			// the writes missed are among the current records.
			opts := []clientv3.OpOption{clientv3.WithPrefix()}
			if !relist {
				opts = append(opts, clientv3.WithCountOnly())
			}
			if r, err := s.cli.Get(ctx, prefix, opts...); err == nil {
				next = r.Header.Revision + 1
				for _, kv := range r.Kvs {
					call(kv)
				}
			}
		}
		if next != 0 && !watchFrom(ctx, s, prefix, &next, call) {
			next, relist = 0, true
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// watchFrom runs one watch of puts under prefix from revision *next until
// it breaks, advancing *next past every event delivered; false if the
// history from *next was compacted.
func watchFrom(ctx context.Context, s *Store, prefix string, next *int64, call func(*mvccpb.KeyValue)) bool {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithRev(*next))
	for resp := range wch {
		if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
			return false
		}
		for _, ev := range resp.Events {
			call(ev.Kv)
			*next = ev.Kv.ModRevision + 1
		}
	}
	return true
}

// LookupName resolves an owner's name to an id ("" when unbound).
func (s *Store) LookupName(ctx context.Context, kind, owner, name string) (string, error) {
	if !validKeyPart(owner) || !validKeyPart(name) {
		return "", nil
	}
	resp, err := s.read(ctx, nameKey(kind, owner, name))
	if err != nil {
		return "", wrap("get", err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// Provisioned reads the provisioned-bytes counter. A read like any other
// (Store.read), not a transaction: a transaction's commit needs the
// quorum, and a node without one, or a caller that asked for a stale
// read, is answered from the local copy.
func (s *Store) Provisioned(ctx context.Context) (int64, error) {
	resp, err := s.read(ctx, keyProvisioned)
	if err != nil {
		return 0, wrap("get", err)
	}
	var n int64
	if len(resp.Kvs) > 0 {
		n, _ = strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
	}
	return n, nil
}

// Bootstrap records the cluster identity once and returns it, together with
// the cluster CA: the stored one, or ca (PEM cert and key) when none is
// stored yet. Racing first starts agree on one CA.
func (s *Store) Bootstrap(ctx context.Context, clusterID string, voters int, caCert, caKey []byte) (*Cluster, []byte, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	// The first node decides whether the cluster runs its own etcd: a node
	// started without a member of its own and without joining is
	// connected to an external one (a node that joined as a client finds
	// the record there).
	c := &Cluster{Schema: SchemaVersion, ID: clusterID, CreatedAt: time.Now().UTC(), Voters: voters, External: !s.Embedded()}
	ca := encode(&caRecord{Schema: SchemaVersion, CertPEM: string(caCert), KeyPEM: string(caKey)})
	_, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(keyCluster), "=", 0)).
		Then(clientv3.OpPut(keyCluster, encode(c)), clientv3.OpPut(keyCA, ca)).
		Commit()
	if err != nil {
		return nil, nil, nil, wrap("bootstrap", err)
	}
	got := &Cluster{}
	if err := s.get(ctx, keyCluster, got); err != nil {
		return nil, nil, nil, err
	}
	rec := &caRecord{}
	if err := s.get(ctx, keyCA, rec); err != nil {
		return nil, nil, nil, err
	}
	return got, []byte(rec.CertPEM), []byte(rec.KeyPEM), nil
}

// DataKey returns the cluster's data-key-wrapping key: the stored one, or
// proposal when none is stored yet (racing first starts agree on one).
func (s *Store) DataKey(ctx context.Context, proposal []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	rec := encode(&keyRecord{Schema: SchemaVersion, Key: proposal})
	_, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(keyDataKey), "=", 0)).
		Then(clientv3.OpPut(keyDataKey, rec)).
		Commit()
	if err != nil {
		return nil, wrap("data key", err)
	}
	got := &keyRecord{}
	if err := s.get(ctx, keyDataKey, got); err != nil {
		return nil, err
	}
	return got.Key, nil
}

// StoreID returns the id of the cluster's data store (the shared --store
// directory, whose marker file holds the same id: package store), or ""
// when none is recorded yet. With proposal set, it records proposal
// unless an id is recorded already, and returns the one recorded. The
// first node to start on a store records it; every other start checks its
// store's marker against it (server), so a node whose shared file system
// is not mounted does not serve an empty directory as the store.
func (s *Store) StoreID(ctx context.Context, proposal string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if proposal != "" {
		rec := encode(&storeIDRecord{Schema: SchemaVersion, ID: proposal})
		_, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(keyStoreID), "=", 0)).
			Then(clientv3.OpPut(keyStoreID, rec)).
			Commit()
		if err != nil {
			return "", wrap("store id", err)
		}
	}
	got := &storeIDRecord{}
	if err := s.get(ctx, keyStoreID, got); err != nil {
		if errors.Is(err, errAbsent) {
			return "", nil
		}
		return "", err
	}
	return got.ID, nil
}

// HoldsData reports whether any volume, snapshot or bucket record exists:
// whether the cluster's store should hold something (server: a store
// found empty for a cluster that does is not mounted).
func (s *Store) HoldsData(ctx context.Context) (bool, error) {
	for _, prefix := range []string{prefixVolumes, prefixSnaps, prefixBuckets} {
		resp, err := s.read(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, wrap("records", err)
		}
		if resp.Count > 0 {
			return true, nil
		}
	}
	return false, nil
}

type storeIDRecord struct {
	Schema int    `json:"schema"`
	ID     string `json:"id"`
}

func (r *storeIDRecord) schema() int { return r.Schema }

type keyRecord struct {
	Schema int    `json:"schema"`
	Key    []byte `json:"key"`
}

func (k *keyRecord) schema() int { return k.Schema }

// VolumeTypes lists the admin-created volume types.
func (s *Store) VolumeTypes(ctx context.Context) ([]*VolumeType, error) {
	return list(ctx, s, prefixTypes, func() *VolumeType { return &VolumeType{} })
}

// Bucket returns a bucket, or a NotFound error.
func (s *Store) Bucket(ctx context.Context, name string) (*Bucket, error) {
	b := &Bucket{}
	if err := s.get(ctx, bucketKey(name), b); err != nil {
		if errors.Is(err, errAbsent) {
			return nil, errs.NotFound("bucket", name)
		}
		return nil, err
	}
	return b, nil
}

// Buckets lists every bucket by name.
func (s *Store) Buckets(ctx context.Context) ([]*Bucket, error) {
	return list(ctx, s, prefixBuckets, func() *Bucket { return &Bucket{} })
}

type caRecord struct {
	Schema  int    `json:"schema"`
	CertPEM string `json:"cert_pem"`
	KeyPEM  string `json:"key_pem"`
}

func (c *caRecord) schema() int { return c.Schema }
