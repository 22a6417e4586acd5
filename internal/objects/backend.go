package objects

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/gofiber/fiber/v3"
	"github.com/versity/versitygw/auth"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3api/utils"
	"github.com/versity/versitygw/s3err"
)

// Config configures a Backend.
type Config struct {
	// Root holds one directory per bucket; Work is basalt's scratch
	// space. Both must be on one file system (objects are renamed from
	// Work/tmp into Root/<bucket>).
	Root, Work string
	// Buckets keeps the bucket records.
	Buckets BucketStore
	// Log receives the backend's own messages; nil discards them.
	Log *slog.Logger
	// Sidecar forces sidecar metadata even where user xattrs work
	// (tests, or file systems whose xattrs are unreliable).
	Sidecar bool
	// AccessOf, if set, returns a user's current access key id. It
	// names a bucket's owner to s3api when someone other than the
	// owner asks (the owner's own requests need no lookup); without it
	// the key recorded at CreateBucket is used.
	AccessOf func(ctx context.Context, user string) (string, error)
	// TrustFile is where a user mapped to a uid proves holding it: a
	// path template, "{home}" being the uid's home directory (default
	// "{home}/.basalt-s3"; "{uid}" is also replaced). See identity.go.
	TrustFile string
}

// Backend is basalt's backend.Backend: objects are plain files under
// Config.Root (see the package comment and docs/objects.md). Methods not
// implemented here answer NotImplemented (backend.BackendUnsupported).
type Backend struct {
	backend.BackendUnsupported

	root, work string
	rootDir    *os.Root    // Root: buckets are opened below it
	rootFile   *os.File    // Root again, for openat2 (quickOpen)
	noOpenat2  atomic.Bool // openat2 is missing or refused here: quickOpen never tries
	tmp        string      // Work/tmp
	tmpDir     *os.File    // Work/tmp, for renameat
	uploads    string      // Work/uploads
	buckets    BucketStore
	meta       metaStore
	log        *slog.Logger
	accessOf   func(ctx context.Context, user string) (string, error)
	trustFile  string
	// closing bounds the replaced objects being closed in the
	// background (release); closers waits for them (Shutdown).
	closing chan struct{}
	closers sync.WaitGroup
}

var _ backend.Backend = (*Backend)(nil)

// staleTemp is the age after which New removes leftovers in Work/tmp
// (another gateway may be writing the younger ones).
const staleTemp = 24 * time.Hour

// New opens a backend over cfg.Root and cfg.Work, creating the
// directories it needs, and chooses xattr or sidecar metadata.
func New(cfg Config) (*Backend, error) {
	if cfg.Root == "" || cfg.Work == "" {
		return nil, errors.New("objects: Root and Work are required")
	}
	if cfg.Buckets == nil {
		return nil, errors.New("objects: a BucketStore is required")
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, err
	}
	work, err := filepath.Abs(cfg.Work)
	if err != nil {
		return nil, err
	}
	if within(work, root) || within(root, work) {
		return nil, fmt.Errorf("objects: Root %s and Work %s must not contain each other", root, work)
	}
	for _, d := range []string{root, work, filepath.Join(work, "tmp"), filepath.Join(work, "uploads"),
		filepath.Join(work, "sidecar"), filepath.Join(work, "locks")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("objects: %w", err)
		}
	}
	// Work holds users' bytes on their way into the buckets (pending
	// parts, the temp files of PUTs and snapshot exports, mode 0644 like
	// objects): nobody but the gateway may enter it, or a user who closed
	// their bucket directory to others would have those readable here.
	// Also for a Work made 0755 by an earlier version.
	if err := os.Chmod(work, 0o700); err != nil {
		return nil, fmt.Errorf("objects: %w", err)
	}
	var rst, wst syscall.Stat_t
	if err := syscall.Stat(root, &rst); err != nil {
		return nil, fmt.Errorf("objects: %w", err)
	}
	if err := syscall.Stat(work, &wst); err != nil {
		return nil, fmt.Errorf("objects: %w", err)
	}
	if rst.Dev != wst.Dev {
		return nil, fmt.Errorf("objects: Root %s and Work %s are on different file systems", root, work)
	}
	b := &Backend{
		root:      root,
		work:      work,
		tmp:       filepath.Join(work, "tmp"),
		uploads:   filepath.Join(work, "uploads"),
		buckets:   cfg.Buckets,
		log:       log,
		accessOf:  cfg.AccessOf,
		trustFile: cfg.TrustFile,
		closing:   make(chan struct{}, 16),
	}
	if b.trustFile == "" {
		b.trustFile = DefaultTrustFile
	}
	xattrs, err := probeXattr(b.tmp)
	if err != nil {
		return nil, fmt.Errorf("objects: probe xattrs: %w", err)
	}
	if xattrs && !cfg.Sidecar {
		b.meta = xattrMeta{}
	} else {
		b.meta = &sidecarMeta{dir: filepath.Join(work, "sidecar"), locks: filepath.Join(work, "locks"), tmp: b.tmp}
	}
	log.Info("object store", "root", root, "work", work, "metadata", b.meta.kind(), "xattrs", xattrs)
	b.tmpDir, err = os.Open(b.tmp)
	if err != nil {
		return nil, fmt.Errorf("objects: %w", err)
	}
	if b.rootDir, err = os.OpenRoot(root); err != nil {
		b.tmpDir.Close()
		return nil, fmt.Errorf("objects: %w", err)
	}
	if b.rootFile, err = os.Open(root); err != nil {
		b.tmpDir.Close()
		b.rootDir.Close()
		return nil, fmt.Errorf("objects: %w", err)
	}
	if sc, ok := b.meta.(*sidecarMeta); ok {
		sc.undoUnfinished(log)
	}
	b.cleanTemp()
	b.cleanRemovedUploads()
	// A bucket that cannot be migrated (a directory written by a user
	// with direct access that the gateway cannot read, say) must not stop
	// S3 for everyone: its old-layout versions stay where they are,
	// unlisted, until a later start migrates them.
	if err := b.migrateLayout(); err != nil {
		log.Error("some versions keep the old layout: they are not listed or served until a restart migrates them", "err", err)
	}
	return b, nil
}

// MetadataKind is "xattr" or "sidecar": where object records are kept.
func (b *Backend) MetadataKind() string { return b.meta.kind() }

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

// cleanTemp removes temp files older than staleTemp (crashed uploads).
func (b *Backend) cleanTemp() {
	ents, err := os.ReadDir(b.tmp)
	if err != nil {
		return
	}
	for _, e := range ents {
		info, err := e.Info()
		if err == nil && time.Since(info.ModTime()) > staleTemp {
			b.log.Info("removing stale temp file", "file", filepath.Join(b.tmp, e.Name()))
			os.Remove(filepath.Join(b.tmp, e.Name()))
		}
	}
}

// cleanRemovedUploads finishes the removals an Abort or Complete
// (removeUpload) or a DeleteBucket (moveAside: a bucket's uploads and
// sidecar records) began and a crash interrupted: no request resolves
// the renamed directories, so they can go at any time.
func (b *Backend) cleanRemovedUploads() {
	dirs, _ := filepath.Glob(filepath.Join(b.uploads, "*", "*"+removedSuffix))
	for _, parent := range []string{b.uploads, filepath.Join(b.work, "sidecar")} {
		more, _ := filepath.Glob(filepath.Join(parent, "*"+removedSuffix))
		dirs = append(dirs, more...)
	}
	for _, d := range dirs {
		if err := os.RemoveAll(d); err != nil {
			b.log.Warn("removing a removed upload", "dir", d, "err", err)
		}
	}
}

func (b *Backend) String() string { return "basalt" }

// Shutdown releases the backend's descriptors.
func (b *Backend) Shutdown() {
	b.closers.Wait()
	if b.tmpDir != nil {
		b.tmpDir.Close()
	}
	if b.rootDir != nil {
		b.rootDir.Close()
		b.rootFile.Close()
	}
}

// bucketDir is Root/<bucket>; bucket must have passed checkBucketName.
func (b *Backend) bucketDir(bucket string) string { return filepath.Join(b.root, bucket) }

// openBucket opens Root/<bucket> as an os.Root: every path below is
// resolved inside it (symbolic links may not leave it). It is opened
// through the Root held open since New, so each request resolves one
// path component for its bucket, not the store's whole path.
func (b *Backend) openBucket(bucket string) (*os.Root, error) {
	if err := checkBucketName(bucket); err != nil {
		return nil, err
	}
	r, err := b.rootDir.OpenRoot(bucket)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, s3err.GetAPIError(s3err.ErrNoSuchBucket)
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	return r, nil
}

// caller is the account making the request, and the basalt user name
// IAM puts into Account.Arn as "user/<name>" (AccountUser; the access key
// id when there is none, e.g. for the root account).
func caller(ctx context.Context) (acct auth.Account, user string, ok bool) {
	acct, ok = ctx.Value("account").(auth.Account)
	if !ok {
		return acct, "", false
	}
	return acct, userOf(acct), true
}

func userOf(acct auth.Account) string {
	if name := AccountUser(acct); name != "" {
		return name
	}
	return acct.Access
}

// errModified is the error for an object whose file was changed behind
// S3 (docs/objects.md): HTTP 409, code ObjectModifiedOutsideS3.
func errModified(bucket, key, why string) error {
	return s3err.APIError{
		Code: "ObjectModifiedOutsideS3",
		Description: fmt.Sprintf("The object %s/%s was modified outside S3 and is not served: %s. "+
			"Export the file again to accept its new content.", bucket, key, why),
		HTTPStatusCode: http.StatusConflict,
	}
}

// errNotOwnersFile: a GET, HEAD or copy found that the file of
// bucket/key, which belongs to uid and is closed to others, lies below a
// directory that belongs to another uid (d, ownerMayRead). 403, as for
// any object the caller may not read; the message says why.
func errNotOwnersFile(bucket, key string, uid uint32, d *denial) error {
	return s3err.APIError{
		Code: "AccessDenied",
		Description: fmt.Sprintf("The object %s/%s is not served: %s. Its owner can keep it in directories of their own, "+
			"or make it and its directories readable by others (chmod o+r, o+x).", bucket, key, d.why(bucket, uid)),
		HTTPStatusCode: http.StatusForbidden,
	}
}

// errNotKept: a versioned write or delete would keep as a version a
// current file the gateway does not serve (errNotOwnersFile).
func errNotKept(bucket, key string, uid uint32, d *denial) error {
	return s3err.APIError{
		Code: "AccessDenied",
		Description: fmt.Sprintf("The object %s/%s cannot be replaced or deleted while versioning keeps old versions: %s, "+
			"and kept as a version it would be served. Move or remove the file through the file system.", bucket, key, d.why(bucket, uid)),
		HTTPStatusCode: http.StatusForbidden,
	}
}

// errUnexportedFile: a write would replace a file someone put into the
// bucket directly, which is not an object and may be nobody's copy but
// this one.
func errUnexportedFile(bucket, key string) error {
	return s3err.APIError{
		Code: "KeyHoldsUnexportedFile",
		Description: fmt.Sprintf("%s/%s is a file written directly into the bucket, not an object; "+
			"export it (basalt object export) or remove it before writing this key over S3.", bucket, key),
		HTTPStatusCode: http.StatusConflict,
	}
}

func metadataTooLarge(n int) error {
	return s3err.APIError{
		Code:           "MetadataTooLarge",
		Description:    fmt.Sprintf("The object's metadata (%d bytes as stored) does not fit in the file system's extended attributes.", n),
		HTTPStatusCode: http.StatusBadRequest,
	}
}

// answer makes err, from operation op on bucket/key, one s3api answers
// precisely. s3api answers 500 InternalError — which clients retry, the
// aws cli four times — to any error that is not an s3err.S3Error itself
// (it does not unwrap), and logs it only in its debug mode. So an S3Error
// in a chain of context is unwrapped; a file system's refusal for want of
// space or quota becomes 507 InsufficientCapacity, which clients do not
// retry and whose message says what to do, and a file system turned
// read-only 503 StoreReadOnly (errs.Public: the codes of the control
// API); and anything else is logged here, with the request it failed,
// before s3api hides it.
func (b *Backend) answer(err error, op string, bucket, key *string) error {
	if err == nil {
		return nil
	}
	var se s3err.S3Error
	if errors.As(err, &se) {
		return se
	}
	if b.bucketGone(err, str(bucket)) {
		return errNoSuchBucket()
	}
	if e, ok := errs.Public(err); ok && (e.Code == errs.CodeInsufficientCapacity || e.Code == errs.CodeStoreReadOnly) {
		b.log.Warn("s3 write refused by the store", "op", op, "bucket", str(bucket), "key", str(key), "err", err)
		return s3err.APIError{Code: e.Code, Description: e.Message, HTTPStatusCode: e.Kind.Status()}
	}
	b.log.Error("s3 internal error", "op", op, "bucket", str(bucket), "key", str(key), "err", err)
	return err
}

// bucketGone reports whether err, a path not found, is that of a request
// whose bucket was deleted after the request checked it: an empty
// bucket's directory goes with it (DeleteBucket), and a write into it —
// its data still in Work/tmp — then finds no directory to rename into.
// The answer is the one the request gets a moment later: NoSuchBucket.
func (b *Backend) bucketGone(err error, bucket string) bool {
	if bucket == "" || !errors.Is(err, fs.ErrNotExist) || checkBucketName(bucket) != nil {
		return false
	}
	_, serr := os.Lstat(filepath.Join(b.root, bucket))
	return errors.Is(serr, fs.ErrNotExist)
}

func errNoSuchKey() error    { return s3err.GetAPIError(s3err.ErrNoSuchKey) }
func errNoSuchBucket() error { return s3err.GetAPIError(s3err.ErrNoSuchBucket) }

// str dereferences an optional string and copies it: fiber's strings
// point into reused request buffers, and anything kept must be a copy.
func str(p *string) string {
	if p == nil {
		return ""
	}
	return strings.Clone(*p)
}

// bufPool holds copy buffers.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// Middleware is the fiber middleware the gateway mounts in front of
// s3api's routes (s3api.WithMiddleware("/", objects.Middleware())). It
// completes what s3api cannot do from a backend alone:
//
//   - A key s3api refuses before the backend sees it ("a/../../b", "..",
//     "./") would get a bare 400 "Bad Request"; Middleware answers first,
//     with InvalidArgument and checkKey's explanation (s3apiKeyError).
//   - GET and HEAD of a delete marker: s3api sends x-amz-delete-marker and
//     Last-Modified from the output a backend returns with its error, but
//     not x-amz-version-id; the backend leaves the marker's id in the
//     request (noteVersionID) and Middleware adds the header.
//   - A GET's or HEAD's 304 Not Modified gets the object's ETag,
//     Last-Modified, Cache-Control, Expires and version id, and its 416
//     the object's size in Content-Range, which s3api does not send with
//     an error (noteErrorHeaders).
//   - A chunked request body is read to its end before the connection
//     takes its next request (chunkedBody).
//   - s3api does not hand the backend a GET's or HEAD's If-Range: it is
//     left in the request (ifRangeKey) for GetObject and HeadObject, which
//     serve the whole object when it no longer holds. A client resuming a
//     download with If-Range must not get a range of a different object
//     spliced onto the bytes it has (RFC 9110 13.1.5; S3 honours it).
//
// It must run before s3api's DecodeURL and authentication (WithMiddleware
// mounts it there), so it unescapes the path itself, the same way.
func Middleware() fiber.Handler {
	return func(c fiber.Ctx) error {
		if body := watchChunkedBody(c); body != nil {
			defer body.finish(c)
		}
		if err := pathKeyError(c); err != nil {
			requestID, hostID := utils.EnsureRequestIDs(c)
			c.Response().Header.SetContentType(fiber.MIMEApplicationXML)
			var se s3err.S3Error
			if !errors.As(err, &se) {
				se = s3err.GetAPIError(s3err.ErrBadRequest)
			}
			return c.Status(se.StatusCode()).Send(se.XMLBody(requestID, hostID))
		}
		if v := c.Request().Header.Peek("If-Range"); len(v) > 0 {
			c.RequestCtx().SetUserValue(ifRangeKey{}, string(v))
		}
		err := c.Next()
		if vid, ok := c.RequestCtx().UserValue(versionIDKey{}).(string); ok &&
			len(c.Response().Header.Peek("x-amz-version-id")) == 0 {
			c.Response().Header.Set("x-amz-version-id", vid)
		}
		if e, ok := c.RequestCtx().UserValue(errorHeadersKey{}).(errorHeaders); ok &&
			c.Response().StatusCode() == e.status {
			for _, f := range e.fields {
				c.Response().Header.Set(f[0], f[1])
			}
		}
		return err
	}
}

// pathKeyError is s3apiKeyError for the key in a path-style request
// path (/bucket/key). Paths s3api would refuse for another reason first
// (an invalid bucket name, undecodable escapes) are left to s3api.
func pathKeyError(c fiber.Ctx) error {
	p, err := url.PathUnescape(string(c.Request().URI().PathOriginal()))
	if err != nil {
		return nil
	}
	bucket, key, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
	if !utils.IsValidBucketName(bucket) {
		return nil
	}
	return s3apiKeyError(key)
}

// versionIDKey is the request value holding the x-amz-version-id of an
// error answer (Middleware).
type versionIDKey struct{}

// ifRangeKey is the request value holding the If-Range of a GET or HEAD
// (Middleware).
type ifRangeKey struct{}

// ifRange returns the request's If-Range, "" if it has none. ctx is the
// request as s3api passes it to the backend (fasthttp's RequestCtx, whose
// Value is its user value).
func ifRange(ctx context.Context) string {
	v, _ := ctx.Value(ifRangeKey{}).(string)
	return v
}

// noteVersionID leaves vid for Middleware to send as x-amz-version-id.
// ctx is the request as s3api passes it to the backend (fasthttp's
// RequestCtx); other contexts (direct calls, tests) are left alone.
func noteVersionID(ctx context.Context, vid string) {
	if rc, ok := ctx.(interface{ SetUserValue(key, value any) }); ok {
		rc.SetUserValue(versionIDKey{}, vid)
	}
}
