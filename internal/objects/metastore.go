package objects

import (
	"context"
	"fmt"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// MetaBuckets is the BucketStore of a basalt cluster: bucket records in the
// metadata store, shared by every gateway. Lookups (one per S3 request:
// ownership) are answered from Mirror when it has the bucket, and from the
// store otherwise, so a bucket created through another node a moment ago
// is found.
type MetaBuckets struct {
	Meta   *meta.Store
	Mirror *meta.Mirror[*meta.Bucket] // optional
	Users  *meta.Mirror[*meta.User]   // optional, by name
}

// staleOwner replaces the owner of a bucket whose owning user was deleted
// (and perhaps created again under the same name, with a new ID): no
// user's name, so only admins reach the bucket, as with volumes.
const staleOwner = "(deleted user)"

// CreateBucket implements BucketStore. The owner must be an existing user
// whose access key is still b.OwnerAccess (when set); the record keeps
// that user's ID, so a user deleted and created again under the same name
// does not inherit the old buckets.
func (m MetaBuckets) CreateBucket(ctx context.Context, b Bucket) error {
	return m.Meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Bucket(b.Name)
		if err != nil {
			return err
		}
		if cur != nil {
			return ErrBucketExists
		}
		u, err := tx.User(b.Owner)
		if err != nil {
			return err
		}
		// The key the request was signed with must still be the user's
		// (read in the transaction, so it holds at the commit): one
		// revoked meanwhile — the user deleted, possibly created again
		// under the name, or given new keys — on a node whose copy of
		// the users lags must not make a bucket for whoever holds the
		// name now.
		if u == nil || b.OwnerAccess != "" && u.AccessKeyID != b.OwnerAccess {
			return fmt.Errorf("create bucket %s: owner %w", b.Name, errs.NotFound("user", b.Owner))
		}
		tx.PutBucket(&meta.Bucket{Name: b.Name, OwnerID: u.ID, Owner: b.Owner,
			OwnerAccess: b.OwnerAccess, Versioning: b.Versioning, CreatedAt: b.CreatedAt})
		return nil
	})
}

func fromMeta(r *meta.Bucket) *Bucket {
	return &Bucket{Name: r.Name, Owner: r.Owner, OwnerAccess: r.OwnerAccess,
		CreatedAt: r.CreatedAt, Versioning: r.Versioning}
}

// Bucket implements BucketStore.
func (m MetaBuckets) Bucket(ctx context.Context, name string) (*Bucket, error) {
	r, ok := (*meta.Bucket)(nil), false
	if m.Mirror != nil {
		r, ok = m.Mirror.Get(name)
	}
	if !ok {
		var err error
		r, err = m.Meta.Bucket(ctx, name)
		if errs.IsCode(err, errs.CodeNotFound) {
			return nil, ErrNoSuchBucket
		}
		if err != nil {
			return nil, err
		}
	}
	return m.owned(ctx, r)
}

// owned converts a record, naming its owner only while the owning user
// still exists (the same ID under that name).
func (m MetaBuckets) owned(ctx context.Context, r *meta.Bucket) (*Bucket, error) {
	b := fromMeta(r)
	current, err := m.user(ctx, r.Owner)
	if err != nil {
		return nil, err
	}
	if current == nil || current.ID != r.OwnerID {
		b.Owner, b.OwnerAccess = staleOwner, ""
	}
	return b, nil
}

// user is the current record of the user called name (nil if none).
func (m MetaBuckets) user(ctx context.Context, name string) (*meta.User, error) {
	if m.Users != nil {
		if u, ok := m.Users.Get(name); ok {
			return u, nil
		}
	}
	u, err := m.Meta.User(ctx, name)
	if errs.IsCode(err, errs.CodeNotFound) {
		return nil, nil
	}
	return u, err
}

// Buckets implements BucketStore.
func (m MetaBuckets) Buckets(ctx context.Context) ([]Bucket, error) {
	rs, err := m.Meta.Buckets(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Bucket, len(rs))
	for i, r := range rs {
		b, err := m.owned(ctx, r)
		if err != nil {
			return nil, err
		}
		out[i] = *b
	}
	return out, nil
}

// DeleteBucket implements BucketStore.
func (m MetaBuckets) DeleteBucket(ctx context.Context, name string) error {
	return m.Meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Bucket(name)
		if err != nil {
			return err
		}
		if cur == nil {
			return ErrNoSuchBucket
		}
		tx.DeleteBucket(name)
		return nil
	})
}

// SetVersioning implements BucketStore.
func (m MetaBuckets) SetVersioning(ctx context.Context, name, status string) error {
	return m.Meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Bucket(name)
		if err != nil {
			return err
		}
		if cur == nil {
			return ErrNoSuchBucket
		}
		cur.Versioning = status
		tx.PutBucket(cur)
		return nil
	})
}

var _ BucketStore = MetaBuckets{}
