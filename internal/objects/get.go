package objects

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3err"
	"golang.org/x/sys/unix"
)

// object is an open, verified object file.
type object struct {
	f  *os.File
	m  *objectMeta
	st *syscall.Stat_t
	// bad says why the record could not be used (m is then empty): the
	// object was changed behind S3 as surely as if its stat differed.
	bad string
}

func isNoSuchKey(err error) bool { return s3code(err) == "NoSuchKey" }

// s3code is the S3 error code of err, "" if it is not an S3 error.
func s3code(err error) string {
	var se s3err.S3Error
	if errors.As(err, &se) {
		return se.BaseError().Code
	}
	return ""
}

// opener opens the files of a bucket: its os.Root, or a listing's
// dirChain.
type opener interface {
	OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error)
}

// inspect opens bucket/key and its record, and says how the file differs
// from the record ("" if it does not).
func (b *Backend) inspect(r opener, bucket, key string) (*object, string, error) {
	o, err := b.openAny(r, bucket, key)
	if err != nil {
		return nil, "", err
	}
	if o.bad != "" {
		return o, o.bad, nil
	}
	why := o.m.differs(o.st)
	if why == "" {
		return o, "", nil
	}
	if _, ok := b.meta.(xattrMeta); ok {
		return o, why, nil
	}
	// A sidecar commit may have been caught between its two steps:
	// look again while no commit of this key is in progress.
	o.f.Close()
	err = b.meta.stable(bucket, key, func() error {
		o, err = b.openAny(r, bucket, key)
		if err == nil {
			why = o.bad
			if why == "" {
				why = o.m.differs(o.st)
			}
		}
		return err
	})
	if err != nil {
		return nil, "", err
	}
	return o, why, nil
}

// openAny opens bucket/key and reads its record, without comparing the
// two. A file whose record is invalid is returned too, with the reason in
// its bad field: writes and deletes replace or remove it like any object
// changed behind S3.
func (b *Backend) openAny(r opener, bucket, key string) (*object, error) {
	// O_NONBLOCK: a FIFO dropped into the bucket must not block the open.
	f, err := r.OpenFile(key, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP) ||
			isEscape(err) {
			return nil, errNoSuchKey()
		}
		return nil, fmt.Errorf("open %s/%s: %w", bucket, key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, errNoSuchKey()
	}
	m, err := b.meta.read(f, bucket, key)
	if bad := (badRecord{}); errors.As(err, &bad) {
		return &object{f: f, m: &objectMeta{}, st: fi.Sys().(*syscall.Stat_t), bad: bad.Error()}, nil
	}
	if err != nil {
		f.Close()
		if errors.Is(err, errNoMeta) {
			return nil, errNoSuchKey()
		}
		return nil, err
	}
	return &object{f: f, m: m, st: fi.Sys().(*syscall.Stat_t)}, nil
}

// ownerMayRead refuses to serve (GET, HEAD, a copy's source) the file
// st, found at name (key, or the path of one of key's version files),
// unless the bucket's owner could read it directly — what `object
// export` requires of a file (refusal). A record in an xattr travels with
// its file: a user who may write into a directory holding another user's
// object (a directory its owner opened to others, without the sticky
// bit) can move it into a bucket of their own, still an object — also
// after its owner made it private (chmod keeps size, mtime and inode,
// which the record checks), or with a record the user forged on a file
// they may write but not read; and a directory its owner closed to
// others may hold objects anyone could read were it open, and be moved
// with the directory above it. The gateway reads with its own rights and
// must not serve such a file for them.
func ownerMayRead(r *os.Root, bucket, key, name string, st *syscall.Stat_t) error {
	d, err := judge(r, name, st)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return errNoSuchKey() // moved away meanwhile
	}
	if err != nil {
		return fmt.Errorf("check the directories of %s/%s: %w", bucket, name, err)
	}
	if d == nil {
		return nil
	}
	return errNotOwnersFile(bucket, key, st.Uid, d)
}

// versionID is o's version id ("" for the null version). A file whose
// record is invalid has lost its own and goes by lostVersionID.
func (o *object) versionID() string {
	if o.bad != "" {
		return lostVersionID(o.st)
	}
	return o.m.VersionID
}

// isEscape: os.Root refused a path (a symbolic link leaving the bucket).
func isEscape(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe) && pe.Err != nil && pe.Err.Error() == "path escapes from parent"
}

// part returns the byte range of part n (1-based) of o and the part count.
func (o *object) part(n int32) (start, length int64, count int32, err error) {
	if len(o.m.Parts) == 0 {
		if n != 1 {
			return 0, 0, 1, s3err.GetInvalidPartNumberRangeErr(1, n)
		}
		return 0, o.m.Size, 1, nil
	}
	count = int32(len(o.m.Parts))
	if n < 1 || n > count {
		return 0, 0, count, s3err.GetInvalidPartNumberRangeErr(count, n)
	}
	if n > 1 {
		start = o.m.Parts[n-2]
	}
	return start, o.m.Parts[n-1] - start, count, nil
}

// GetObject serves an object, or a range of it, from its file (a
// fileBody: sendfile on plain TCP).
func (b *Backend) GetObject(ctx context.Context, in *s3.GetObjectInput) (*s3.GetObjectOutput, error) {
	o, m, err := b.openRequested(ctx, str(in.Bucket), str(in.Key), str(in.VersionId), "GET")
	if err != nil {
		if m == nil {
			return nil, err
		}
		return &s3.GetObjectOutput{DeleteMarker: ptr(true), LastModified: &m.mtime, VersionId: &m.id}, err
	}
	out, start, length, err := o.describe(in.Range, ifRange(ctx), in.PartNumber, in.ChecksumMode, backend.PreConditions{
		IfMatch: in.IfMatch, IfNoneMatch: in.IfNoneMatch, IfModSince: in.IfModifiedSince, IfUnmodeSince: in.IfUnmodifiedSince})
	if err != nil {
		o.f.Close()
		noteErrorHeaders(ctx, o.m, err)
		return nil, err
	}
	body, err := newFileBody(o.f, start, length, overTLS(ctx))
	if err != nil {
		o.f.Close()
		return nil, fmt.Errorf("get %s/%s: %w", str(in.Bucket), str(in.Key), err)
	}
	out.Body = body
	return out, nil
}

// overTLS reports whether the request came over TLS. s3api passes the
// backend fasthttp's RequestCtx as the context; other contexts (direct
// calls, tests) count as plain.
func overTLS(ctx context.Context) bool {
	t, ok := ctx.(interface{ IsTLS() bool })
	return ok && t.IsTLS()
}

// openRequested opens the version vid ("" the current one) of bucket/key
// for a GET or HEAD (method). When that fails because of a delete marker,
// the marker comes with the error to answer (markerError).
func (b *Backend) openRequested(ctx context.Context, bucket, key, vid, method string) (*object, *deleteMarker, error) {
	if err := readKey(key); err != nil {
		return nil, nil, err
	}
	if vid == "" {
		if o, ok := b.quickOpen(bucket, key); ok {
			return o, nil, nil
		}
	}
	r, err := b.openBucket(bucket)
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	o, err := b.openVersion(r, bucket, key, vid)
	if err != nil {
		m, err := b.markerError(ctx, r, key, vid, method, err)
		return nil, m, err
	}
	return o, nil, nil
}

// quickOpen is the fast path of GET's open for the current version of a key:
// one openat2(2) below Root, where the general path opens the bucket as an
// os.Root and walks the key a component at a time (a system call each).
// It serves only the plain case — xattr records, no symbolic link on the
// way, a regular file anyone may read in directories anyone may enter,
// whose stat matches its record — and answers ok=false for anything else,
// which the caller then takes down the general path for the whole answer:
// a missing bucket or key, a link to follow inside the bucket, a bad or
// missing record, a file changed behind S3, a file or directory closed to
// others (ownerMayRead). So it never answers differently; it only answers
// sooner.
//
// bucket and key must have passed checkBucketName and checkKey: no "." or
// ".." component, so the path stays inside the bucket's directory, which
// RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS enforce again in the kernel.
func (b *Backend) quickOpen(bucket, key string) (o *object, ok bool) {
	if _, xattrs := b.meta.(xattrMeta); !xattrs || b.noOpenat2.Load() || checkBucketName(bucket) != nil {
		return nil, false
	}
	name := bucket + "/" + key
	// O_NONBLOCK: a FIFO dropped into the bucket must not block the open.
	const flags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC
	var fd int
	var err error
	closed := false
	rerr := rawFd(b.rootFile, func(root int) {
		dir, base := path.Split(key)
		if dir == "" {
			fd, err = unix.Openat2(root, name, &unix.OpenHow{Flags: flags,
				Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
			return
		}
		// Others must be able to enter the directories on the way too
		// (ownerMayRead), and what is checked must be the directories the
		// file is opened in: each is opened in the one above and
		// described from its descriptor (dirChain), an openat, an fstat
		// and a close per directory. A directory closed to others is left
		// to the general path, which judges it.
		c := dirChain{base: root, prefix: bucket + "/"}
		defer c.close()
		if err = c.cd(strings.TrimSuffix(dir, "/")); err != nil {
			return
		}
		if closed = !c.open(); closed {
			return
		}
		fd, err = unix.Openat(c.top(), base, flags|unix.O_NOFOLLOW, 0)
	})
	if rerr != nil || closed {
		return nil, false
	}
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) {
		// A kernel before 5.6, or a seccomp filter that refuses it.
		b.noOpenat2.Store(true)
	}
	if err != nil {
		return nil, false
	}
	f := os.NewFile(uintptr(fd), filepath.Join(b.root, name))
	defer func() {
		if !ok {
			f.Close()
		}
	}()
	var st syscall.Stat_t
	// A file not everyone may read is left to the general path, which
	// checks that the bucket's owner may read it (ownerMayRead); objects
	// written through S3 are world-readable (0644) and cost nothing more.
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Mode&0o004 == 0 {
		return nil, false
	}
	m, err := b.meta.read(f, bucket, key)
	if err != nil || m.differs(&st) != "" {
		return nil, false
	}
	return &object{f: f, m: m, st: &st}, true
}

// HeadObject describes an object (checking its file like GetObject).
func (b *Backend) HeadObject(ctx context.Context, in *s3.HeadObjectInput) (*s3.HeadObjectOutput, error) {
	o, m, err := b.openRequested(ctx, str(in.Bucket), str(in.Key), str(in.VersionId), "HEAD")
	if err != nil {
		if m == nil {
			return nil, err
		}
		return &s3.HeadObjectOutput{DeleteMarker: ptr(true), LastModified: &m.mtime, VersionId: &m.id}, err
	}
	defer o.f.Close()
	out, _, _, err := o.describe(in.Range, ifRange(ctx), in.PartNumber, in.ChecksumMode, backend.PreConditions{
		IfMatch: in.IfMatch, IfNoneMatch: in.IfNoneMatch, IfModSince: in.IfModifiedSince, IfUnmodeSince: in.IfUnmodifiedSince})
	if err != nil {
		noteErrorHeaders(ctx, o.m, err)
		return nil, err
	}
	return &s3.HeadObjectOutput{
		ETag: out.ETag, ContentLength: out.ContentLength, ContentRange: out.ContentRange,
		ContentType: out.ContentType, ContentEncoding: out.ContentEncoding, ContentDisposition: out.ContentDisposition,
		ContentLanguage: out.ContentLanguage, CacheControl: out.CacheControl, ExpiresString: out.ExpiresString,
		LastModified: out.LastModified, Metadata: out.Metadata, AcceptRanges: out.AcceptRanges,
		PartsCount: out.PartsCount, StorageClass: out.StorageClass, ChecksumType: out.ChecksumType,
		ChecksumCRC32: out.ChecksumCRC32, ChecksumCRC32C: out.ChecksumCRC32C, ChecksumSHA1: out.ChecksumSHA1,
		ChecksumSHA256: out.ChecksumSHA256, ChecksumCRC64NVME: out.ChecksumCRC64NVME,
		ChecksumSHA512: out.ChecksumSHA512, ChecksumMD5: out.ChecksumMD5, ChecksumXXHASH64: out.ChecksumXXHASH64,
		ChecksumXXHASH3: out.ChecksumXXHASH3, ChecksumXXHASH128: out.ChecksumXXHASH128,
		VersionId: out.VersionId,
	}, nil
}

// errorHeadersKey is the request value holding the header fields of a
// GET's or HEAD's error answer (errorHeaders; noteErrorHeaders, Middleware).
type errorHeadersKey struct{}

// errorHeaders are the fields an error answer with status carries.
type errorHeaders struct {
	status int
	fields [][2]string
}

// noteErrorHeaders leaves in the request, when err is an answer S3 sends
// with fields of the object m, those fields, which Middleware adds (s3api
// sends none with an error):
//   - a 304 Not Modified: the ETag, Cache-Control and Expires a 200 would
//     have, as RFC 9110 15.4.5 requires (a cache in front of the gateway
//     refreshes its copy from them), and Last-Modified and
//     x-amz-version-id, as S3 sends;
//   - a 416 InvalidRange: Content-Range with the object's size (RFC 9110
//     15.5.17; S3 sends it), from which a client learns what range it can
//     ask for.
//
// ctx is the request as s3api passes it to the backend (fasthttp's
// RequestCtx); other contexts are left alone.
func noteErrorHeaders(ctx context.Context, m *objectMeta, err error) {
	rc, ok := ctx.(interface{ SetUserValue(key, value any) })
	if !ok {
		return
	}
	var e errorHeaders
	switch s3code(err) {
	case "NotModified":
		e.status = http.StatusNotModified
		e.fields = [][2]string{{"ETag", m.ETag}, {"Last-Modified", m.mtime().UTC().Format(http.TimeFormat)}}
		for _, f := range [][2]string{{"Cache-Control", m.CacheControl}, {"Expires", m.Expires}, {"x-amz-version-id", m.VersionID}} {
			if f[1] != "" {
				e.fields = append(e.fields, f)
			}
		}
	case "InvalidRange":
		e.status = http.StatusRequestedRangeNotSatisfiable
		e.fields = [][2]string{{"Content-Range", "bytes */" + strconv.FormatInt(m.Size, 10)}}
	default:
		return
	}
	rc.SetUserValue(errorHeadersKey{}, e)
}

// deleteMarker is a delete marker a GET or HEAD ran into.
type deleteMarker struct {
	id    string // as S3 shows it ("null" for the null marker)
	mtime time.Time
}

// markerError completes a GET or HEAD (method) of key whose openVersion
// failed with err. If the key's current version is a delete marker (vid
// "", err NoSuchKey) or vid names one (err MethodNotAllowed), S3 answers
// 404 NoSuchKey resp. 405 MethodNotAllowed with x-amz-delete-marker:
// true, the marker's x-amz-version-id and its Last-Modified: the marker
// is returned with the error to send, and s3api takes the first and last
// header from an output returned with an error (the version id goes
// through Middleware). Otherwise markerError returns nil and err.
func (b *Backend) markerError(ctx context.Context, r *os.Root, key, vid, method string, err error) (*deleteMarker, error) {
	var m *deleteMarker
	var lerr error
	switch {
	case vid == "" && isNoSuchKey(err):
		m, lerr = b.latestMarker(r, key)
	case vid != "" && s3code(err) == "MethodNotAllowed":
		id := vid
		if id == nullVersion {
			id = ""
		}
		m, lerr = markerAt(r, key, id)
	}
	if lerr != nil {
		// The answer stays right without the marker's headers.
		b.log.Warn("delete marker lookup", "key", key, "version", vid, "err", lerr)
		return nil, err
	}
	if m == nil {
		return nil, err
	}
	noteVersionID(ctx, m.id)
	if vid != "" {
		err = s3err.GetMethodNotAllowedErr(method, s3err.ResourceType("DeleteMarker"), []string{http.MethodDelete})
	}
	return m, err
}

// latestMarker returns the key's newest version if it is a delete marker
// (called when there is no current object: the marker is then the
// current version), else nil.
func (b *Backend) latestMarker(r *os.Root, key string) (*deleteMarker, error) {
	vs, err := b.versionsOf(r, key)
	if err != nil {
		return nil, fmt.Errorf("versions of %s: %w", key, err)
	}
	if len(vs) == 0 || !vs[0].marker {
		return nil, nil
	}
	return markerAt(r, key, vs[0].id)
}

// markerAt describes delete marker id ("" for null) of key, nil if it is
// gone (deleted meanwhile).
func markerAt(r *os.Root, key, id string) (*deleteMarker, error) {
	fi, err := r.Lstat(markerFile(key, id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("delete marker %s of %s: %w", showVersion(id), key, err)
	}
	return &deleteMarker{id: showVersion(id), mtime: fi.ModTime().UTC().Truncate(time.Second)}, nil
}

// describe evaluates preconditions, range (unless an If-Range, ifRng, no
// longer holds) and part number, and returns the response fields (Body
// unset) with the byte range to send.
func (o *object) describe(rng *string, ifRng string, partNumber *int32, mode types.ChecksumMode, pre backend.PreConditions) (*s3.GetObjectOutput, int64, int64, error) {
	m := o.m
	mtime := m.mtime().UTC().Truncate(time.Second)
	if err := preconditions(m.ETag, mtime, pre); err != nil {
		return nil, 0, 0, err
	}
	out := &s3.GetObjectOutput{
		ETag:          ptr(m.ETag),
		LastModified:  &mtime,
		AcceptRanges:  ptr("bytes"),
		ContentType:   optional(m.ContentType),
		Metadata:      m.UserMeta,
		CacheControl:  optional(m.CacheControl),
		ExpiresString: optional(m.Expires),
	}
	if m.VersionID != "" {
		out.VersionId = ptr(m.VersionID)
	}
	out.ContentEncoding = optional(m.ContentEncoding)
	out.ContentDisposition = optional(m.ContentDisposition)
	out.ContentLanguage = optional(m.ContentLanguage)
	start, length := int64(0), m.Size
	whole := true
	switch {
	case partNumber != nil:
		var count int32
		var err error
		start, length, count, err = o.part(*partNumber)
		if err != nil {
			return nil, 0, 0, err
		}
		if len(m.Parts) > 0 {
			out.PartsCount = &count
			whole = false
		}
		// An empty part has no byte range to name. Part 1 of an object
		// not uploaded in parts is the whole object, which S3 answers
		// as a range too (206, Content-Range), without a parts count.
		if length > 0 {
			out.ContentRange = ptr(fmt.Sprintf("bytes %d-%d/%d", start, start+length-1, m.Size))
		}
	case rng != nil && *rng != "" && (ifRng == "" || ifRangeHolds(ifRng, m.ETag, mtime)):
		s, l, valid, err := backend.ParseObjectRange(m.Size, clampRange(*rng))
		if err != nil {
			return nil, 0, 0, err
		}
		if valid {
			start, length, whole = s, l, false
			out.ContentRange = ptr(fmt.Sprintf("bytes %d-%d/%d", start, start+length-1, m.Size))
		}
	}
	// x-amz-mp-parts-count only answers a request that names a part (set
	// above): S3 sends none for a whole object or a Range, multipart or not.
	out.ContentLength = &length
	if mode == types.ChecksumModeEnabled && whole && m.Checksum != nil {
		f := m.Checksum.fields()
		out.ChecksumCRC32, out.ChecksumCRC32C, out.ChecksumSHA1 = f.CRC32, f.CRC32C, f.SHA1
		out.ChecksumSHA256, out.ChecksumCRC64NVME, out.ChecksumSHA512 = f.SHA256, f.CRC64NVME, f.SHA512
		out.ChecksumMD5, out.ChecksumXXHASH64 = f.MD5, f.XXHASH64
		out.ChecksumXXHASH3, out.ChecksumXXHASH128 = f.XXHASH3, f.XXHASH128
		out.ChecksumType = m.Checksum.Type
	}
	return out, start, length, nil
}

func ptr[T any](v T) *T { return &v }

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
