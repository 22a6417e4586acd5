package objects

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/versity/versitygw/auth"
	"github.com/versity/versitygw/s3err"
	"github.com/versity/versitygw/s3response"
	"golang.org/x/sys/unix"
)

// record returns bucket's record, NoSuchBucket if there is none.
func (b *Backend) record(ctx context.Context, bucket string) (*Bucket, error) {
	if err := checkBucketName(bucket); err != nil {
		return nil, err
	}
	rec, err := b.buckets.Bucket(ctx, bucket)
	if errors.Is(err, ErrNoSuchBucket) {
		return nil, errNoSuchBucket()
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", bucket, err)
	}
	return rec, nil
}

// CreateBucket records the bucket (owner: the caller, or the owner s3api
// chose) in the BucketStore, then creates Root/<bucket>. The defaultACL
// is not kept: GetBucketAcl derives the ACL from the record.
func (b *Backend) CreateBucket(ctx context.Context, in *s3.CreateBucketInput, _ []byte) (err error) {
	defer func() { err = b.answer(err, "CreateBucket", in.Bucket, nil) }()
	bucket := str(in.Bucket)
	if err := checkBucketName(bucket); err != nil {
		return err
	}
	owner, ok := ctx.Value("bucket-owner").(auth.Account)
	if !ok {
		if owner, _, ok = caller(ctx); !ok {
			return s3err.GetAPIError(s3err.ErrAccessDenied)
		}
	}
	rec := Bucket{Name: bucket, Owner: userOf(owner), OwnerAccess: strings.Clone(owner.Access), CreatedAt: time.Now().UTC()}
	if err := b.buckets.CreateBucket(ctx, rec); err != nil {
		if !errors.Is(err, ErrBucketExists) {
			return fmt.Errorf("record bucket %s: %w", bucket, err)
		}
		if old, gerr := b.buckets.Bucket(ctx, bucket); gerr == nil && old.Owner == rec.Owner {
			return s3err.GetAPIError(s3err.ErrBucketAlreadyOwnedByYou)
		}
		return s3err.GetAPIError(s3err.ErrBucketAlreadyExists)
	}
	dir := b.bucketDir(bucket)
	err = os.Mkdir(dir, 0o755)
	if err == nil {
		if err = b.giveDirTo(owner, dir); err != nil {
			os.Remove(dir)
		}
	} else if errors.Is(err, fs.ErrExist) {
		// A directory made by hand becomes the bucket; its files stay
		// invisible until exported.
		fi, serr := os.Lstat(dir)
		if serr == nil && fi.IsDir() {
			err = nil
			b.log.Info("bucket adopts an existing directory", "bucket", bucket, "dir", dir)
		}
	}
	if err == nil {
		err = syncDir(b.root)
	}
	if err != nil {
		_ = b.buckets.DeleteBucket(context.WithoutCancel(ctx), bucket)
		return fmt.Errorf("create bucket directory %s: %w", dir, err)
	}
	return nil
}

// HeadBucket answers for a recorded bucket whose directory exists.
func (b *Backend) HeadBucket(ctx context.Context, in *s3.HeadBucketInput) (*s3.HeadBucketOutput, error) {
	bucket := str(in.Bucket)
	if _, err := b.record(ctx, bucket); err != nil {
		return nil, err
	}
	if _, err := os.Stat(b.bucketDir(bucket)); err != nil {
		return nil, fmt.Errorf("bucket %s is recorded but its directory is missing: %w", bucket, err)
	}
	return &s3.HeadBucketOutput{}, nil
}

// ListBuckets lists the caller's buckets (every bucket for an admin),
// by name, with prefix and continuation.
func (b *Backend) ListBuckets(ctx context.Context, in s3response.ListBucketsInput) (s3response.ListAllMyBucketsResult, error) {
	recs, err := b.buckets.Buckets(ctx)
	if err != nil {
		return s3response.ListAllMyBucketsResult{}, fmt.Errorf("list buckets: %w", err)
	}
	_, user, _ := caller(ctx)
	slices.SortFunc(recs, func(x, y Bucket) int { return strings.Compare(x.Name, y.Name) })
	out := s3response.ListAllMyBucketsResult{
		Owner:  s3response.CanonicalUser{ID: in.Owner},
		Prefix: in.Prefix,
	}
	for _, rec := range recs {
		if !in.IsAdmin && rec.Owner != user && rec.OwnerAccess != in.Owner {
			continue
		}
		if !strings.HasPrefix(rec.Name, in.Prefix) || rec.Name <= in.ContinuationToken {
			continue
		}
		if in.MaxBuckets > 0 && len(out.Buckets.Bucket) == int(in.MaxBuckets) {
			out.ContinuationToken = out.Buckets.Bucket[len(out.Buckets.Bucket)-1].Name
			break
		}
		out.Buckets.Bucket = append(out.Buckets.Bucket, s3response.ListAllMyBucketsEntry{
			Name: rec.Name, CreationDate: rec.CreatedAt,
		})
	}
	return out, nil
}

// ListBucketsAndOwners lists every bucket with its owner's access key.
func (b *Backend) ListBucketsAndOwners(ctx context.Context) ([]s3response.Bucket, error) {
	recs, err := b.buckets.Buckets(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]s3response.Bucket, 0, len(recs))
	for _, rec := range recs {
		out = append(out, s3response.Bucket{Name: rec.Name, Owner: rec.OwnerAccess})
	}
	return out, nil
}

// DeleteBucket removes an empty bucket: BucketNotEmpty while it holds
// objects, or files that are not (yet) objects. Its pending multipart
// uploads go with it, as in S3; the upload requests and the writes
// racing it wait for it or it for their publication (bucketLock), so
// none is left half there.
func (b *Backend) DeleteBucket(ctx context.Context, bucket string) (err error) {
	defer func() { err = b.answer(err, "DeleteBucket", &bucket, nil) }()
	bucket = strings.Clone(bucket)
	if _, err := b.record(ctx, bucket); err != nil {
		return err
	}
	unlock, err := b.bucketLock(bucket, unix.LOCK_EX)
	if err != nil {
		return fmt.Errorf("delete bucket %s: %w", bucket, err)
	}
	defer unlock()
	r, err := b.openBucket(bucket)
	if err != nil && !isNoSuchBucket(err) {
		return err
	}
	if err == nil {
		visible, err := b.hasObjects(ctx, r, bucket, ".")
		if err == nil && !visible {
			// A DELETE that stopped half way may have left a marker
			// written aside, no version but a file all the same, which
			// the next request on its key would settle: settled here,
			// or the bucket could not be deleted until then.
			err = b.settlePendingMarkers(r, bucket)
			visible = hasVersions(r)
		}
		r.Close()
		if err != nil {
			return err
		}
		if visible {
			return s3err.GetAPIError(s3err.ErrBucketNotEmpty)
		}
		forgetDirs(b.bucketDir(bucket))
		if err := removeEmptyTree(b.bucketDir(bucket)); err != nil {
			return s3err.APIError{
				Code: "BucketNotEmpty",
				Description: fmt.Sprintf("The bucket directory %s holds files that are not S3 objects; "+
					"export or remove them first.", b.bucketDir(bucket)),
				HTTPStatusCode: http.StatusConflict,
			}
		}
		if err := syncDir(b.root); err != nil {
			return err
		}
	}
	// The uploads and sidecar records go out of reach before the record:
	// a crash between the two must not leave them to a bucket created
	// again under the name.
	var tombs []string
	for _, parent := range []string{b.uploads, filepath.Join(b.work, "sidecar")} {
		tomb, err := moveAside(parent, bucket)
		if err != nil {
			return err
		}
		if tomb != "" {
			tombs = append(tombs, tomb)
		}
	}
	if err := b.buckets.DeleteBucket(ctx, bucket); err != nil && !errors.Is(err, ErrNoSuchBucket) {
		return fmt.Errorf("delete bucket record %s: %w", bucket, err)
	}
	for _, dir := range tombs {
		if err := os.RemoveAll(dir); err != nil {
			b.log.Warn("deleted bucket left files", "bucket", bucket, "dir", dir, "err", err)
		}
	}
	return nil
}

// publishInBucket is publishWrite under bucketLock, shared, for the
// writes that open their bucket before they receive or copy their data
// (PutObject, CopyObject, PutImage). The lock covers the publication
// only: a body being received holds none, so a DeleteBucket waits for
// publications, not uploads. DeleteBucket, holding the lock exclusively,
// then finds each such write either published (the bucket is not empty)
// or not begun. Without the lock a write could land between
// DeleteBucket's check that the bucket is empty and its removal of the
// directory, which then failed BucketNotEmpty blaming "files that are
// not S3 objects" for the object or key directory just made; and a
// write after the removal made its sidecar directory again in
// Work/sidecar, left there (empty) for a bucket created again under the
// name. Under the lock the directory r was opened on must still be the
// bucket's: if DeleteBucket removed it meanwhile (perhaps with a
// CreateBucket of the name since, whose ACL this request was not
// checked against), the write answers NoSuchBucket and touches nothing.
func (b *Backend) publishInBucket(r *os.Root, bucket, key string, tmp *os.File, m *objectMeta, status string, check func() error) error {
	hookStep("publish", key)
	unlock, err := b.bucketLock(bucket, unix.LOCK_SH)
	if err != nil {
		return fmt.Errorf("publish %s/%s: %w", bucket, key, err)
	}
	defer unlock()
	if err := b.stillBucket(r, bucket); err != nil {
		return err
	}
	return b.publishWrite(r, bucket, key, tmp, m, status, check)
}

// stillBucket fails with NoSuchBucket unless r is open on the directory
// Root/<bucket> now is (the caller holds bucketLock). Stat, not Lstat:
// openBucket follows a symbolic link that stays below Root.
func (b *Backend) stillBucket(r *os.Root, bucket string) error {
	now, err := b.rootDir.Stat(bucket)
	if errors.Is(err, fs.ErrNotExist) {
		return errNoSuchBucket()
	}
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bucket, err)
	}
	opened, err := r.Stat(".")
	if errors.Is(err, fs.ErrNotExist) {
		return errNoSuchBucket()
	}
	if err != nil {
		return fmt.Errorf("bucket %s as opened: %w", bucket, err)
	}
	if !os.SameFile(now, opened) {
		return errNoSuchBucket()
	}
	return nil
}

// moveAside renames bucket's directory in parent (Work/uploads or
// Work/sidecar) to .<bucket>.<random>.removed there — no bucket name
// starts with a dot, so no request resolves it; cleanRemovedUploads
// removes what a crash leaves of it — and returns that name, for the
// caller to remove; "" if there is no such directory. The caller holds
// bucketLock.
func moveAside(parent, bucket string) (string, error) {
	dir := filepath.Join(parent, bucket)
	var rnd [6]byte
	rand.Read(rnd[:])
	tomb := filepath.Join(parent, "."+bucket+"."+hex.EncodeToString(rnd[:])+removedSuffix)
	if err := os.Rename(dir, tomb); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("delete bucket %s: %w", bucket, err)
	}
	forgetDirs(dir)
	if err := syncDir(parent); err != nil {
		return "", fmt.Errorf("delete bucket %s: %w", bucket, err)
	}
	return tomb, nil
}

func isNoSuchBucket(err error) bool { return s3code(err) == "NoSuchBucket" }

// removeEmptyTree removes dir if it holds nothing but empty directories.
// It walks inside an os.Root: a mapped user owns the bucket directory and
// could swap a subdirectory for a symlink while the walk runs, which must
// not lead it (as root) to remove directories elsewhere.
func removeEmptyTree(dir string) error {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	err = removeEmptyIn(r, ".")
	r.Close()
	if err != nil {
		return err
	}
	return os.Remove(dir)
}

// removeEmptyIn removes the empty directories below dir in r, and dir
// itself unless it is r's own; it fails at the first entry that is not a
// directory.
func removeEmptyIn(r *os.Root, dir string) error {
	f, err := r.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	ents, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, e := range ents {
		sub := path.Join(dir, e.Name())
		if e.Type()&fs.ModeType != fs.ModeDir {
			return fmt.Errorf("%s is not empty", filepath.Join(r.Name(), dir))
		}
		if err := removeEmptyIn(r, sub); err != nil {
			return err
		}
	}
	if dir == "." {
		return nil
	}
	return r.Remove(dir)
}

// aclJSON is versitygw's stored ACL (auth.ACL) for an owner with full
// control. s3api asks for it on every request that names a bucket, so the
// usual owner — an access key id, which JSON needs no escapes for — is
// spliced into the document's text; anything else goes through
// encoding/json.
func aclJSON(owner string) ([]byte, error) {
	if plainJSON(owner) {
		const a, b, c = `{"Owner":"`, `","Grantees":[{"Permission":"FULL_CONTROL","Access":"`, `","Type":"CanonicalUser"}]}`
		return append(append(append(append(append(make([]byte, 0, len(a)+len(b)+len(c)+2*len(owner)),
			a...), owner...), b...), owner...), c...), nil
	}
	return json.Marshal(auth.ACL{
		Owner: owner,
		Grantees: []auth.Grantee{{
			Permission: auth.PermissionFullControl, Access: owner, Type: types.TypeCanonicalUser,
		}},
	})
}

// plainJSON reports whether s is made only of characters a JSON string
// holds as they are, and that encoding/json does not escape.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// GetBucketAcl synthesises the ACL s3api checks ownership with: the
// owner's access key id, full control. The owner's own requests name
// the owner by the key they are signed with, so key rotation needs no
// record update.
func (b *Backend) GetBucketAcl(ctx context.Context, in *s3.GetBucketAclInput) ([]byte, error) {
	rec, err := b.record(ctx, str(in.Bucket))
	if err != nil {
		return nil, err
	}
	owner := rec.OwnerAccess
	if acct, user, ok := caller(ctx); ok && user == rec.Owner {
		owner = acct.Access
	} else if b.accessOf != nil {
		if a, err := b.accessOf(ctx, rec.Owner); err == nil && a != "" {
			owner = a
		}
	}
	return aclJSON(owner)
}

// GetBucketPolicy: basalt buckets have no policies.
func (b *Backend) GetBucketPolicy(ctx context.Context, bucket string) ([]byte, error) {
	return nil, s3err.GetAPIError(s3err.ErrNoSuchBucketPolicy)
}

// GetObjectLockConfiguration: object lock is not supported.
func (b *Backend) GetObjectLockConfiguration(ctx context.Context, bucket string) ([]byte, error) {
	return nil, s3err.GetAPIError(s3err.ErrObjectLockConfigurationNotFound)
}

// GetBucketCors: no CORS configurations.
func (b *Backend) GetBucketCors(ctx context.Context, bucket string) ([]byte, error) {
	return nil, s3err.GetAPIError(s3err.ErrNoSuchCORSConfiguration)
}

// GetBucketVersioning reports the status kept in the bucket record.
func (b *Backend) GetBucketVersioning(ctx context.Context, bucket string) (s3response.GetBucketVersioningOutput, error) {
	rec, err := b.record(ctx, bucket)
	if err != nil {
		return s3response.GetBucketVersioningOutput{}, err
	}
	var out s3response.GetBucketVersioningOutput
	if rec.Versioning != "" {
		st := types.BucketVersioningStatus(rec.Versioning)
		out.Status = &st
	}
	return out, nil
}

// PutBucketVersioning records the status; writes and deletes follow it
// (versions.go).
func (b *Backend) PutBucketVersioning(ctx context.Context, bucket string, status types.BucketVersioningStatus) error {
	bucket = strings.Clone(bucket)
	if _, err := b.record(ctx, bucket); err != nil {
		return err
	}
	switch status {
	case types.BucketVersioningStatusEnabled, types.BucketVersioningStatusSuspended:
	default:
		return s3err.GetAPIError(s3err.ErrMalformedXML)
	}
	if err := b.buckets.SetVersioning(ctx, bucket, string(status)); err != nil {
		if errors.Is(err, ErrNoSuchBucket) {
			return errNoSuchBucket()
		}
		return fmt.Errorf("set versioning of %s: %w", bucket, err)
	}
	return nil
}
