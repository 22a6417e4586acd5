// Package objects is basalt's S3 object store (pWalrus): objects are plain
// files that users can also read directly, served over S3 by versitygw's
// protocol packages (s3api, auth) with this package's backend.Backend.
//
// Layout (docs/objects.md):
//
//	Config.Root/<bucket>/<key>   exactly the object's bytes, nothing else
//	Config.Work/                 our own scratch on the same file system:
//	                             tmp/ (uploads being written), uploads/
//	                             (multipart parts), sidecar/ (metadata
//	                             where the file system has no xattrs)
//
// Bucket records (owner, versioning) live in the metadata store, reached
// through BucketStore, so that several stateless gateways over one file
// system and one etcd agree on them; object metadata lives with the
// object (an xattr, or the sidecar), so a file and its metadata travel
// together.
//
// Invariants:
//   - A PUT is atomic and durable when acknowledged: the bytes are written
//     aside (Work/tmp), synced, given their metadata, renamed into place,
//     and the directory synced. Readers see the old object or the new one.
//   - A file in a bucket directory without basalt metadata is not an
//     object (invisible to S3) until exported.
//   - An object whose file no longer matches its recorded size, mtime or
//     inode was changed behind S3: it is never served as valid.
//   - Nothing is ever written outside Root/<bucket>/ and Work/: keys are
//     validated before any path is built from them.
//
// Callers: internal/server builds a Backend and an IAM and serves them
// with s3api on --s3.
package objects

import (
	"context"
	"errors"
	"time"
)

// Bucket is a bucket's record in the metadata store.
type Bucket struct {
	Name string `json:"name"`
	// Owner is the owning user's name; OwnerAccess the access key id the
	// S3 layer compares callers with (versitygw's ACL owner).
	Owner       string    `json:"owner"`
	OwnerAccess string    `json:"owner_access"`
	CreatedAt   time.Time `json:"created_at"`
	// Versioning is "", "Enabled" or "Suspended" (S3's values).
	Versioning string `json:"versioning,omitempty"`
}

// BucketStore keeps bucket records. The server's implementation is the
// metadata store (etcd); tests use a map.
type BucketStore interface {
	// CreateBucket records b; ErrBucketExists if the name is taken.
	CreateBucket(ctx context.Context, b Bucket) error
	// Bucket returns the record, or ErrNoSuchBucket.
	Bucket(ctx context.Context, name string) (*Bucket, error)
	// Buckets lists every bucket, by name.
	Buckets(ctx context.Context) ([]Bucket, error)
	// DeleteBucket removes the record; ErrNoSuchBucket if there is none.
	DeleteBucket(ctx context.Context, name string) error
	// SetVersioning sets the bucket's versioning status.
	SetVersioning(ctx context.Context, name, status string) error
}

// Errors a BucketStore returns.
var (
	ErrBucketExists = errors.New("bucket exists")
	ErrNoSuchBucket = errors.New("no such bucket")
)
