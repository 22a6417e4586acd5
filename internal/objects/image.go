package objects

// Whole files in and out: the bridge between volumes and objects (`basalt
// snapshot export --to s3://B/K`, `basalt volume create --from-object
// s3://B/K`). The volume service fills or reads a plain file; this file
// keeps the object rules around it: the key is checked like any other,
// the file is written aside and renamed in (atomic, durable), it gets a
// record with an MD5 ETag, versioning is honoured, and the file belongs to
// the writer's uid when that mapping is trusted. Errors are *errs.Error
// (the control API's), like export.go's.

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/versity/versitygw/auth"
	"github.com/versity/versitygw/s3err"
	"golang.org/x/sys/unix"
)

// ImageInput describes an object whose bytes the caller writes itself.
type ImageInput struct {
	Bucket, Key string
	// Writer is the account the object is written as: with a trusted
	// uid mapping the file becomes that uid's. Zero: the gateway's.
	Writer      auth.Account
	ContentType string
	Metadata    map[string]string
	// Fill writes the object's bytes into f, a new empty file on the
	// buckets' file system (so it can reflink into it), and syncs it.
	Fill func(f *os.File) error
	// Progress, if set, follows the hashing of the bytes written.
	Progress func(done, total int64)
	// Check, if set, is asked under the key's lock just before the
	// object is published: an error publishes nothing (a writer that may
	// have been replaced meanwhile must not publish over what came since).
	Check func() error
}

// PutImage stores an object written by in.Fill: Fill, then the ETag (MD5
// of the bytes; holes are hashed without reading), the record, fsync and
// the rename into the bucket. Readers see the old object or the new one.
func (b *Backend) PutImage(ctx context.Context, in ImageInput) (ObjectInfo, error) {
	r, err := b.controlBucket(ctx, in.Bucket)
	if err != nil {
		return ObjectInfo{}, err
	}
	defer r.Close()
	if err := controlKey(in.Bucket, in.Key); err != nil {
		return ObjectInfo{}, err
	}
	status, err := b.versioning(ctx, in.Bucket)
	if err != nil {
		return ObjectInfo{}, controlError(err)
	}
	f, err := b.createTemp()
	if err != nil {
		return ObjectInfo{}, err
	}
	published := false
	defer func() {
		if !published {
			discard(f)
		} else {
			f.Close()
		}
	}()
	if err := in.Fill(f); err != nil {
		return ObjectInfo{}, err
	}
	fi, err := f.Stat()
	if err != nil {
		return ObjectInfo{}, err
	}
	sum, err := sparseMD5(ctx, f, fi.Size(), in.Progress)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("hash %s/%s: %w", in.Bucket, in.Key, err)
	}
	m := &objectMeta{
		ETag: `"` + hex.EncodeToString(sum) + `"`, ContentType: in.ContentType,
		UserMeta: cloneMeta(in.Metadata), VersionID: writeVersion(status),
	}
	// The stat recorded is the file's as published: hashing changed
	// nothing, and Fill is done.
	// Ownership first: the sync in finish makes it durable too.
	if err := b.giveTo(in.Writer, f); err != nil {
		return ObjectInfo{}, err
	}
	if err := b.finish(&received{f: f, st: statOf(fi)}, m); err != nil {
		return ObjectInfo{}, controlError(err)
	}
	if err := b.publishInBucket(r, in.Bucket, in.Key, f, m, status, in.Check); err != nil {
		return ObjectInfo{}, controlError(err)
	}
	published = true
	b.log.Info("object written from a file", "bucket", in.Bucket, "key", in.Key, "etag", m.ETag, "size", m.Size)
	return info(in.Bucket, in.Key, b.objectPath(in.Bucket, in.Key), m), nil
}

// OpenImage opens bucket/key's file for reading whole: it must be an
// object (a file with a record) that was not changed behind S3. The
// caller closes the file; StillSame tells whether it stayed unchanged.
func (b *Backend) OpenImage(ctx context.Context, bucket, key string) (*os.File, ObjectInfo, error) {
	r, err := b.controlBucket(ctx, bucket)
	if err != nil {
		return nil, ObjectInfo{}, err
	}
	defer r.Close()
	if err := controlKey(bucket, key); err != nil {
		return nil, ObjectInfo{}, err
	}
	o, why, err := b.inspect(r, bucket, key)
	if isNoSuchKey(err) {
		return nil, ObjectInfo{}, errs.New(errs.KindNotFound, "NoSuchKey", "object s3://%s/%s does not exist", bucket, key)
	}
	if err != nil {
		return nil, ObjectInfo{}, controlError(err)
	}
	// The volume gets the bytes the server reads with its own rights: only
	// those of a file the bucket's owner could read, as for an export (a
	// record travels with its file; see ownerMayRead). Checked first, as
	// by a GET: the refusal must not say how the file changed.
	if err := readableByOwner(r, bucket, key, o.st); err != nil {
		o.f.Close()
		return nil, ObjectInfo{}, err
	}
	if why != "" {
		o.f.Close()
		return nil, ObjectInfo{}, errs.Conflict("ObjectModifiedOutsideS3",
			"object s3://%s/%s was modified outside S3 (%s); export the file again to accept its content", bucket, key, why)
	}
	oi := info(bucket, key, b.objectPath(bucket, key), o.m)
	oi.Inode = o.st.Ino
	return o.f, oi, nil
}

// StillSame reports whether f (from OpenImage) still has the size and
// mtime recorded in oi: a file rewritten in place while it was read fails.
func StillSame(f *os.File, oi ObjectInfo) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() != oi.Size || !fi.ModTime().Equal(oi.Mtime) {
		return errs.Conflict(CodeFileChanged, "object s3://%s/%s changed while it was read", oi.Bucket, oi.Key)
	}
	return nil
}

// controlError turns an S3 error of the backend into the control API's
// error with the same status, code and message; others pass unchanged.
func controlError(err error) error {
	var se s3err.S3Error
	if !errors.As(err, &se) {
		return err
	}
	base := se.BaseError()
	status := base.HTTPStatusCode
	if status == 0 {
		status = http.StatusInternalServerError
	}
	return errs.New(errs.KindForStatus(status), base.Code, "%s", s3message(err))
}

// sparseMD5 hashes f's first n bytes, feeding its holes as zeroes
// without reading them.
func sparseMD5(ctx context.Context, f *os.File, n int64, p func(done, total int64)) ([]byte, error) {
	h := md5.New()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	zero := make([]byte, len(buf))
	fd := int(f.Fd())
	const step = 64 << 20
	next := int64(step)
	for off := int64(0); off < n; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		end := min(n, off+step)
		// The next data at or after off: [off, data) is a hole.
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		switch {
		case errors.Is(err, unix.ENXIO):
			data = n
		case err != nil:
			data = off
		}
		if data > off {
			for z := min(data, end); off < z; {
				k := min(z-off, int64(len(zero)))
				h.Write(zero[:k])
				off += k
			}
		} else {
			k, err := f.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
			h.Write(buf[:k])
			off += int64(k)
			if err == io.EOF && off < n {
				return nil, fmt.Errorf("file ended at %d of %d bytes", off, n)
			}
			if err != nil && err != io.EOF {
				return nil, err
			}
		}
		if p != nil && (off >= next || off == n) {
			p(off, n)
			next = off + step
		}
	}
	return h.Sum(nil), nil
}

// ParseURL splits "s3://BUCKET/KEY" and checks both parts.
func ParseURL(u string) (bucket, key string, err error) {
	rest, ok := strings.CutPrefix(u, "s3://")
	if !ok {
		return "", "", errs.Invalid(errs.CodeInvalidRequest, "%q is not an s3://BUCKET/KEY URL", u)
	}
	bucket, key, _ = strings.Cut(rest, "/")
	if err := CheckBucketName(bucket); err != nil {
		return "", "", err
	}
	if key == "" {
		return "", "", errs.Invalid(CodeInvalidKey, "%q names no object (s3://BUCKET/KEY)", u)
	}
	if err := controlKey(bucket, key); err != nil {
		return "", "", err
	}
	return bucket, key, nil
}
