package objects

// Export, unexport, verify and path: the pWalrus operations on the files
// of a bucket directory (docs/objects.md, "Direct access"). They are not
// S3 operations: the control API calls them (internal/api/objects.go)
// after checking that the caller owns the bucket, and they answer
// *errs.Error with the codes below.

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/md5lanes"
	"github.com/versity/versitygw/s3err"
	"golang.org/x/sys/unix"
)

// Error codes of Export, Unexport, Verify and ObjectPath (and of the
// control API's object endpoints). Stable: add, never rename.
const (
	CodeNoSuchBucket      = "NoSuchBucket"            // 404: no such bucket (record or directory)
	CodeInvalidBucketName = "InvalidBucketName"       // 400
	CodeInvalidKey        = "InvalidKey"              // 400: the key (file path in the bucket) is no valid object key
	CodeNoSuchFile        = "NoSuchFile"              // 404: no file at that key
	CodeNotARegularFile   = "NotARegularFile"         // 400: a directory, symbolic link, device, FIFO...
	CodeNotExported       = "NotExported"             // 404: unexport of a file that has no record
	CodeFileChanged       = "FileChangedDuringExport" // 409: the file changed while it was read
	CodeFileAccess        = "FileAccessDenied"        // 403: the server may not read the file or set its xattr
	CodeMetadataTooLarge  = "MetadataTooLarge"        // 400: the record does not fit in the file's xattrs
	CodeHardLinked        = "HardLinkedFile"          // 400: export of a file that has other hard links
)

// ObjectInfo describes an object as Export recorded it, or as Unexport
// found its record.
type ObjectInfo struct {
	Bucket string
	Key    string
	// Path is the backing file, Root/<bucket>/<key>.
	Path string
	// ETag is the object's S3 ETag without the quotes: the MD5 of the
	// bytes in hex ("<md5>-<n>" for multipart uploads).
	ETag  string
	Size  int64
	Mtime time.Time
	Inode uint64
}

// PathInfo is what ObjectPath tells about a key.
type PathInfo struct {
	Bucket, Key string
	// Path is the backing file, Root/<bucket>/<key>, whether or not it
	// exists.
	Path string
	// Exists: Path is a regular file. Exported: it has a record (it is
	// an object). Modified says how the file differs from the record
	// ("" if it does not, or if it is not exported).
	Exists, Exported bool
	Modified         string
}

// Problem kinds of a VerifyReport.
const (
	// ProblemModified: the file's size, mtime or inode differs from the
	// record; GET answers ObjectModifiedOutsideS3.
	ProblemModified = "modified"
	// ProblemContent: the stat matches but the bytes do not hash to the
	// recorded ETag (VerifyOptions.Content only).
	ProblemContent = "content"
	// ProblemMissing: a sidecar record whose file is gone (the file was
	// deleted or renamed behind S3; sidecar mode only: an xattr record
	// goes with its file).
	ProblemMissing = "missing"
	// ProblemUnreadable: the file, its record or a directory could not be
	// read, so it could not be checked.
	ProblemUnreadable = "unreadable"
	// ProblemUnexported: a regular file without a record, not an object
	// (VerifyOptions.All only; not a damage).
	ProblemUnexported = "unexported"
)

// VerifyOptions select what Verify checks.
type VerifyOptions struct {
	// Content re-reads every object and compares its MD5 with the ETag,
	// catching edits that kept size, mtime and inode.
	Content bool
	// All also lists the files that are not objects (ProblemUnexported).
	All bool
}

// VerifyProblem is one entry of a VerifyReport.
type VerifyProblem struct {
	Key string
	// VersionID is set for a non-current version of Key (its file under
	// .basalt-versions), "null" for the null version.
	VersionID string
	Problem   string // a Problem* kind
	Detail    string // for people
}

// VerifyReport is Verify's result.
type VerifyReport struct {
	Bucket string
	// Objects is the number of objects (files with a record) checked,
	// Unexported the number of regular files without one.
	Objects, Unexported int
	// Problems, by key; the unexported files only with VerifyOptions.All.
	Problems []VerifyProblem
}

// Damaged counts the problems that are damage (everything but
// ProblemUnexported).
func (r VerifyReport) Damaged() int {
	n := 0
	for _, p := range r.Problems {
		if p.Problem != ProblemUnexported {
			n++
		}
	}
	return n
}

// Root is the directory holding one directory per bucket (Config.Root,
// absolute): the backing file of bucket/key is Root/<bucket>/<key>.
func (b *Backend) Root() string { return b.root }

// objectPath is the backing file's path of a valid bucket and key.
func (b *Backend) objectPath(bucket, key string) string {
	return filepath.Join(b.root, bucket, filepath.FromSlash(key))
}

// CheckBucketName applies S3's bucket naming rules; the error is
// CodeInvalidBucketName.
func CheckBucketName(bucket string) error {
	if err := checkBucketName(bucket); err != nil {
		return errs.Invalid(CodeInvalidBucketName, "bucket %q: %s", bucket, s3message(err))
	}
	return nil
}

// controlBucket checks a bucket for the control operations: a valid name,
// a record and a directory. The caller closes the returned root.
func (b *Backend) controlBucket(ctx context.Context, bucket string) (*os.Root, error) {
	if err := CheckBucketName(bucket); err != nil {
		return nil, err
	}
	if _, err := b.buckets.Bucket(ctx, bucket); err != nil {
		if errors.Is(err, ErrNoSuchBucket) || errs.IsCode(err, errs.CodeNotFound) {
			return nil, noSuchBucket(bucket)
		}
		return nil, err
	}
	r, err := b.openBucket(bucket)
	if s3code(err) == "NoSuchBucket" {
		return nil, errs.New(errs.KindNotFound, CodeNoSuchBucket, "bucket %q has a record but no directory %s",
			bucket, b.bucketDir(bucket))
	}
	return r, err
}

func noSuchBucket(bucket string) error {
	return errs.New(errs.KindNotFound, CodeNoSuchBucket, "bucket %q does not exist", bucket)
}

// controlKey checks key for the control operations.
func controlKey(bucket, key string) error {
	if err := checkKey(key); err != nil {
		return errs.Invalid(CodeInvalidKey, "%s/%s: %s", bucket, key, s3message(err))
	}
	return nil
}

// s3message is the description of an S3 error (err.Error() otherwise).
func s3message(err error) string {
	var se s3err.S3Error
	if errors.As(err, &se) && se.BaseError().Description != "" {
		return se.BaseError().Description
	}
	return err.Error()
}

// regularFile checks that key names a regular file reached through real
// directories only: no component is a symbolic link, so the key is the
// file's one canonical name in the bucket (listings do not follow links
// either).
func regularFile(r *os.Root, bucket, key string) (fs.FileInfo, error) {
	comps := strings.Split(key, "/")
	for i := range comps {
		p := strings.Join(comps[:i+1], "/")
		fi, err := r.Lstat(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
				return nil, errs.New(errs.KindNotFound, CodeNoSuchFile, "%s/%s: no such file", bucket, key)
			}
			if errors.Is(err, fs.ErrPermission) {
				return nil, errs.New(errs.KindForbidden, CodeFileAccess, "%s/%s: %v", bucket, key, err)
			}
			return nil, fmt.Errorf("%s/%s: %w", bucket, key, err)
		}
		last := i == len(comps)-1
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			return nil, errs.Invalid(CodeNotARegularFile, "%s/%s: %s is a symbolic link; export the file it points to",
				bucket, key, p)
		case !last && !fi.IsDir():
			return nil, errs.New(errs.KindNotFound, CodeNoSuchFile, "%s/%s: no such file (%s is not a directory)", bucket, key, p)
		case last && !fi.Mode().IsRegular():
			return nil, errs.Invalid(CodeNotARegularFile, "%s/%s is not a regular file (%s)", bucket, key, fileKind(fi.Mode()))
		case last:
			return fi, nil
		}
	}
	panic("unreachable")
}

func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file"
}

// fileError maps an error reading or changing a file of bucket/key.
func fileError(bucket, key, what string, err error) error {
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		return errs.New(errs.KindForbidden, CodeFileAccess,
			"%s/%s: the server may not %s the file (%v); it needs read access, and with xattr metadata "+
				"ownership of the file or write access to it", bucket, key, what, err)
	}
	return fmt.Errorf("%s %s/%s: %w", what, bucket, key, err)
}

func statOf(fi fs.FileInfo) *syscall.Stat_t { return fi.Sys().(*syscall.Stat_t) }

func sameStat(a, b *syscall.Stat_t) bool {
	return a.Ino == b.Ino && a.Size == b.Size && a.Mtim.Nano() == b.Mtim.Nano()
}

// errHardLinked refuses to export a file with more than one hard link: a
// link is no copy, so a user who may write into the bucket directory
// could link in a file of someone else's (one the user may not read) and
// have the server, which reads with its own rights, serve it over S3.
func errHardLinked(bucket, key string, nlink uint64) error {
	return errs.Invalid(CodeHardLinked,
		"%s/%s has %d hard links: export refuses a file that has other names (a hard link can bring someone "+
			"else's file into the bucket); copy it into the bucket (cp) and export the copy", bucket, key, nlink)
}

// readableByOwner checks that the file st at key is one the bucket's
// owner could read directly (refusal, judged on the directories it is
// in). Like a hard link (errHardLinked), a rename can bring someone
// else's file into the bucket — a user moves it in from any directory
// they may write on the store's file system, or moves in a directory
// that holds it (one of theirs, or its owner's, closed to others) — and
// the server, which reads with its own rights, must not serve it for
// them. Whoever moved in a file anyone may read, through directories
// anyone may enter, could read it; into directories that are all its
// owner's (or the gateway's), only its owner could move it.
func readableByOwner(r *os.Root, bucket, key string, st *syscall.Stat_t) error {
	d, err := judge(r, key, st)
	if err != nil {
		return fileError(bucket, key, "check the directories of", err)
	}
	if d == nil {
		return nil
	}
	return errs.New(errs.KindForbidden, CodeFileAccess,
		"%s/%s belongs to uid %d and %s, but the directory %s belongs to uid %d: "+
			"the file may have been moved in by someone who may not read it, and the server does not "+
			"read it for them; its owner can export it from a directory of their own, or make it and its "+
			"directories readable by others (chmod o+r, o+x)",
		bucket, key, st.Uid, d.closedTo(bucket), path.Join(bucket, d.foreign), d.uid)
}

func errChanged(bucket, key string) error {
	return errs.Conflict(CodeFileChanged,
		"%s/%s changed while it was being exported; export it again once nothing writes to it", bucket, key)
}

func info(bucket, key, p string, m *objectMeta) ObjectInfo {
	return ObjectInfo{Bucket: bucket, Key: key, Path: p, ETag: strings.Trim(m.ETag, `"`), Size: m.Size,
		Mtime: m.mtime().UTC(), Inode: m.Inode}
}

// ObjectPath says where bucket/key's bytes are (or would be) and whether
// that file is an object.
func (b *Backend) ObjectPath(ctx context.Context, bucket, key string) (PathInfo, error) {
	r, err := b.controlBucket(ctx, bucket)
	if err != nil {
		return PathInfo{}, err
	}
	defer r.Close()
	if err := controlKey(bucket, key); err != nil {
		return PathInfo{}, err
	}
	pi := PathInfo{Bucket: bucket, Key: key, Path: b.objectPath(bucket, key)}
	if fi, err := r.Lstat(key); err == nil && fi.Mode().IsRegular() {
		pi.Exists = true
	}
	o, why, err := b.inspect(r, bucket, key)
	switch {
	case err == nil:
		o.f.Close()
		pi.Exported, pi.Modified = true, why
	case !isNoSuchKey(err):
		return PathInfo{}, err
	}
	return pi, nil
}

// Export makes the file Root/<bucket>/<key>, written directly into the
// bucket directory, an object: its MD5 (the ETag), size, mtime and inode
// are recorded with the backend's metadata (xattr or sidecar), so that
// S3 serves it. Exporting an object again accepts its current content
// (after a change behind S3); its content type and user metadata are
// kept, its checksum and part layout (no longer true) dropped, and it
// stays the version it was. A new object's content type is guessed from
// the file name's extension (mime.TypeByExtension), if at all; in a
// versioned bucket it becomes a version as a PUT's object would (a new
// id, or with versioning suspended the null version, replacing a
// non-current one).
//
// The file must be a regular file reached through real directories (no
// symbolic link on the way) with no other hard link (CodeHardLinked),
// readable by others or kept in directories of its owner's
// (readableByOwner, CodeFileAccess), and must not change while it is
// read (CodeFileChanged).
func (b *Backend) Export(ctx context.Context, bucket, key string) (ObjectInfo, error) {
	r, err := b.controlBucket(ctx, bucket)
	if err != nil {
		return ObjectInfo{}, err
	}
	defer r.Close()
	if err := controlKey(bucket, key); err != nil {
		return ObjectInfo{}, err
	}
	status, err := b.versioning(ctx, bucket)
	if err != nil {
		return ObjectInfo{}, err
	}
	if status != "" {
		// What an earlier DELETE or write of the key left unfinished is
		// settled first, as by every S3 write of a key, and before the
		// file's links are counted: such a request links the current
		// object into .basalt-versions before its commit point, and the
		// link, which settling removes, would have the object refused
		// as a file of two names (errHardLinked) until the next S3
		// request on the key. Settled again under the lock below.
		unlock, err := b.keyLock(bucket, key)
		if err != nil {
			return ObjectInfo{}, err
		}
		err = b.settleDeletes(r, bucket, key)
		unlock()
		if err != nil {
			return ObjectInfo{}, err
		}
	}
	if _, err := regularFile(r, bucket, key); err != nil {
		return ObjectInfo{}, err
	}
	f, err := r.OpenFile(key, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return ObjectInfo{}, errs.New(errs.KindNotFound, CodeNoSuchFile, "%s/%s: no such file", bucket, key)
		}
		return ObjectInfo{}, fileError(bucket, key, "open", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ObjectInfo{}, err
	}
	if !fi.Mode().IsRegular() {
		return ObjectInfo{}, errs.Invalid(CodeNotARegularFile, "%s/%s is not a regular file (%s)", bucket, key, fileKind(fi.Mode()))
	}
	st := statOf(fi)
	if st.Nlink > 1 {
		return ObjectInfo{}, errHardLinked(bucket, key, uint64(st.Nlink))
	}
	if err := readableByOwner(r, bucket, key, st); err != nil {
		return ObjectInfo{}, err
	}
	sum, n, err := md5Range(ctx, f, 0, st.Size)
	if err != nil {
		return ObjectInfo{}, fileError(bucket, key, "read", err)
	}
	after, err := f.Stat()
	if err != nil {
		return ObjectInfo{}, err
	}
	if n != st.Size || !sameStat(st, statOf(after)) {
		return ObjectInfo{}, errChanged(bucket, key)
	}
	if nl := statOf(after).Nlink; nl > 1 {
		return ObjectInfo{}, errHardLinked(bucket, key, uint64(nl))
	}
	// From here an export is one of the key's writes (the hash, which may
	// take long, is not under the lock, which other keys share: the file
	// is checked unchanged when the record is published): conditional
	// writes check the record it replaces, and in a versioned bucket the
	// record says which version the file is, which PUTs and DELETEs read
	// to keep it.
	unlock, err := b.keyLock(bucket, key)
	if err != nil {
		return ObjectInfo{}, err
	}
	defer unlock()
	if status != "" {
		// A DELETE may have stopped since the settling above.
		if err := b.settleDeletes(r, bucket, key); err != nil {
			return ObjectInfo{}, err
		}
	}
	// What the old record said that is not about the bytes.
	var old *objectMeta
	if m, err := b.meta.read(f, bucket, key); err == nil {
		old = m
	} else if !errors.Is(err, errNoMeta) {
		b.log.Warn("export replaces an unreadable record", "bucket", bucket, "key", key, "err", err)
	}
	m := &objectMeta{ETag: `"` + hex.EncodeToString(sum) + `"`}
	m.setStat(st)
	if old != nil {
		// The object stays the version it was: a new id would leave
		// nothing under the old one, and a null version relabelled would
		// meet the key's non-current null version, which the next write
		// then replaces.
		m.VersionID = old.VersionID
		m.ContentType, m.ContentEncoding, m.ContentDisposition = old.ContentType, old.ContentEncoding, old.ContentDisposition
		m.ContentLanguage, m.CacheControl, m.Expires = old.ContentLanguage, old.CacheControl, old.Expires
		m.UserMeta = old.UserMeta
	} else {
		// A new object, as a PUT would make it: a new version with
		// versioning enabled, else the null version (which replaces a
		// non-current one, below).
		m.VersionID = writeVersion(status)
		m.ContentType = mime.TypeByExtension(path.Ext(key))
	}
	// The file at key must still be the one hashed when the record is
	// published (an S3 PUT may have replaced it meanwhile).
	still := func() error {
		fi, err := r.Lstat(key)
		if err != nil || !fi.Mode().IsRegular() || !sameStat(st, statOf(fi)) {
			return errChanged(bucket, key)
		}
		if nl := statOf(fi).Nlink; nl > 1 {
			return errHardLinked(bucket, key, uint64(nl))
		}
		return nil
	}
	if _, ok := b.meta.(xattrMeta); ok {
		if err := b.meta.attach(f, m); err != nil {
			if s3code(err) != "" {
				return ObjectInfo{}, errs.Invalid(CodeMetadataTooLarge, "%s/%s: %s", bucket, key, s3message(err))
			}
			return ObjectInfo{}, fileError(bucket, key, "set the metadata xattr of", err)
		}
		if err := f.Sync(); err != nil {
			return ObjectInfo{}, fileError(bucket, key, "sync", err)
		}
		// setxattr changes no mtime: any change is someone else's.
		if after, err := f.Stat(); err != nil || !sameStat(st, statOf(after)) {
			return ObjectInfo{}, errChanged(bucket, key)
		}
		if err := still(); err != nil {
			return ObjectInfo{}, err
		}
	} else if err := b.meta.commit(bucket, key, m, still); err != nil {
		return ObjectInfo{}, err
	}
	if status == statusSuspended && old == nil {
		if err := b.removeNull(r, bucket, key); err != nil {
			return ObjectInfo{}, err
		}
	}
	b.log.Info("object exported", "bucket", bucket, "key", key, "etag", m.ETag, "size", m.Size)
	return info(bucket, key, b.objectPath(bucket, key), m), nil
}

// Unexport removes bucket/key's record: the file stays, and S3 no longer
// sees it. The answer describes the record removed; for a record that is
// invalid (see decodeRecord) it has no ETag, and the file's size and mtime.
// A file without a record is CodeNotExported. In sidecar mode the record
// of a file that is gone, or that is no longer a regular file, is removed
// too (what Verify reports as ProblemMissing).
func (b *Backend) Unexport(ctx context.Context, bucket, key string) (ObjectInfo, error) {
	r, err := b.controlBucket(ctx, bucket)
	if err != nil {
		return ObjectInfo{}, err
	}
	defer r.Close()
	if err := controlKey(bucket, key); err != nil {
		return ObjectInfo{}, err
	}
	// An unexport is one of the key's writes, as an export is: a sidecar
	// record is removed by key, and a PUT publishing between the read of
	// the record and its removal would lose its own record to it (its
	// acknowledged object turned into a file written directly).
	status, err := b.versioning(ctx, bucket)
	if err != nil {
		return ObjectInfo{}, err
	}
	unlock, err := b.keyLock(bucket, key)
	if err != nil {
		return ObjectInfo{}, err
	}
	defer unlock()
	if status != "" {
		// What an earlier DELETE of the key left unfinished is settled
		// first, as by every S3 write of a key. A DELETE stopped before
		// its commit point (the object's unlink) left a marker naming
		// the object and a link of it among the versions; the
		// object's record removed, the marker would name no current
		// object and take effect — a delete marker the DELETE never
		// made, on top of the version the link then is (with xattrs,
		// a file without a record: the record went with the inode),
		// which would also make that marker undeletable
		// (KeyHoldsUnexportedFile where the version would be restored).
		if err := b.settleDeletes(r, bucket, key); err != nil {
			return ObjectInfo{}, err
		}
	}
	p := b.objectPath(bucket, key)
	notExported := errs.New(errs.KindNotFound, CodeNotExported, "%s/%s is not an object (it has no record): nothing to unexport", bucket, key)
	if _, err := regularFile(r, bucket, key); err != nil {
		sc, ok := b.meta.(*sidecarMeta)
		if !ok || !errs.IsCode(err, CodeNoSuchFile) && !errs.IsCode(err, CodeNotARegularFile) {
			return ObjectInfo{}, err
		}
		return b.unexportMissing(r, sc, bucket, key, err)
	}
	f, err := r.OpenFile(key, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return ObjectInfo{}, fileError(bucket, key, "open", err)
	}
	defer f.Close()
	m, err := b.meta.read(f, bucket, key)
	if errors.Is(err, errNoMeta) {
		return ObjectInfo{}, notExported
	}
	if bad := (badRecord{}); errors.As(err, &bad) {
		// Nothing in the record is true: describe the file.
		fi, serr := f.Stat()
		if serr != nil {
			return ObjectInfo{}, fileError(bucket, key, "stat", serr)
		}
		b.log.Warn("unexport removes an invalid record", "bucket", bucket, "key", key, "err", err)
		m = &objectMeta{}
		m.setStat(statOf(fi))
	} else if err != nil {
		return ObjectInfo{}, err
	}
	if _, ok := b.meta.(xattrMeta); ok {
		var rerr error
		if err := rawFd(f, func(fd int) { rerr = unix.Fremovexattr(fd, xattrName) }); err != nil {
			return ObjectInfo{}, err
		}
		if errors.Is(rerr, unix.ENODATA) {
			return ObjectInfo{}, notExported
		}
		if rerr != nil {
			return ObjectInfo{}, fileError(bucket, key, "remove the metadata xattr of", rerr)
		}
		if err := f.Sync(); err != nil {
			return ObjectInfo{}, fileError(bucket, key, "sync", err)
		}
	} else if err := b.meta.remove(bucket, key, func() error { return nil }); err != nil {
		return ObjectInfo{}, err
	}
	b.log.Info("object unexported", "bucket", bucket, "key", key, "etag", m.ETag)
	return info(bucket, key, p, m), nil
}

// unexportMissing removes, in sidecar mode, the record of bucket/key whose
// file is gone or no longer a regular file (fileErr says which, and is
// the answer if there is no record). The answer describes the record,
// with no ETag if it is invalid.
func (b *Backend) unexportMissing(r *os.Root, sc *sidecarMeta, bucket, key string, fileErr error) (ObjectInfo, error) {
	if fi, err := r.Lstat(key); err == nil && fi.Mode().IsRegular() {
		return ObjectInfo{}, fileErr // reached through a link: not missing (as Verify sees it)
	}
	m, err := sc.read(nil, bucket, key)
	if errors.Is(err, errNoMeta) {
		return ObjectInfo{}, fileErr
	}
	if bad := (badRecord{}); errors.As(err, &bad) {
		b.log.Warn("unexport removes an invalid record", "bucket", bucket, "key", key, "err", err)
		m = &objectMeta{}
	} else if err != nil {
		return ObjectInfo{}, err
	}
	// Under the record's lock: a PUT may have published an object at
	// the key meanwhile, and that record is not the one to remove.
	err = sc.remove(bucket, key, func() error {
		if fi, err := r.Lstat(key); err == nil && fi.Mode().IsRegular() {
			return errs.Conflict(CodeFileChanged, "%s/%s became a regular file while its record was being removed; "+
				"unexport it again", bucket, key)
		}
		return nil
	})
	if err != nil {
		return ObjectInfo{}, err
	}
	b.log.Info("record of a missing file removed", "bucket", bucket, "key", key, "etag", m.ETag)
	return info(bucket, key, b.objectPath(bucket, key), m), nil
}

// Verify walks bucket and reports every object whose file no longer
// matches its record (ProblemModified: size, mtime or inode; with
// opts.Content also ProblemContent: the bytes' MD5), records without
// their file (ProblemMissing, sidecar mode), what could not be read
// (ProblemUnreadable) and, with opts.All, the files that are not objects
// (ProblemUnexported). The non-current versions under .basalt-versions
// are checked alike and reported with their VersionID. Symbolic links,
// devices and the like are skipped, as listings skip them, and so are
// basalt's other reserved ".basalt*" names.
func (b *Backend) Verify(ctx context.Context, bucket string, opts VerifyOptions) (VerifyReport, error) {
	r, err := b.controlBucket(ctx, bucket)
	if err != nil {
		return VerifyReport{}, err
	}
	defer r.Close()
	rep := VerifyReport{Bucket: bucket, Problems: []VerifyProblem{}}
	var mu sync.Mutex // guards rep.Problems: content checks add from their goroutines
	add := func(key, vid, problem, format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		rep.Problems = append(rep.Problems, VerifyProblem{Key: key, VersionID: vid, Problem: problem,
			Detail: fmt.Sprintf(format, args...)})
	}
	// Content checks run verifyWorkers at a time, while the walk goes on:
	// one file's reads overlap another's hashing, and their MD5s share
	// md5lanes' vector lanes (one stream alone hashes at under 1 GB/s).
	var checks sync.WaitGroup
	slots := make(chan struct{}, verifyWorkers)
	err = fs.WalkDir(r.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		ours := p == versionsDir && d.IsDir() || strings.HasPrefix(p, versionsDir+"/") && !d.IsDir()
		if p != "." && strings.HasPrefix(d.Name(), reservedPrefix) && !ours {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if err != nil {
			if p == "." {
				return err
			}
			add(p, "", ProblemUnreadable, "cannot read it: %v", err)
			return nil
		}
		if d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		key, vid := p, ""
		if strings.HasPrefix(p, versionsDir+"/") {
			k, id, marker, ok := parseVersionPath(p)
			if !ok || marker {
				return nil // a delete marker (no record), or no file of basalt's
			}
			key, vid = k, id
		} else if kerr := checkKey(p); kerr != nil {
			rep.Unexported++
			if opts.All {
				add(p, "", ProblemUnexported, "not an object, and cannot be one: %s", s3message(kerr))
			}
			return nil
		}
		o, why, err := b.inspect(r, bucket, p)
		switch {
		case isNoSuchKey(err):
			rep.Unexported++
			if opts.All && vid == "" {
				add(p, "", ProblemUnexported, "a file without a record (basalt object export makes it an object)")
			} else if opts.All {
				add(key, vid, ProblemUnexported, "a file among the versions without a record: no version, never served")
			}
			return nil
		case err != nil:
			rep.Objects++
			add(key, vid, ProblemUnreadable, "cannot check it: %v", err)
			return nil
		}
		rep.Objects++
		if why != "" || !opts.Content {
			o.f.Close()
			if why != "" {
				add(key, vid, ProblemModified, "%s", why)
			}
			return nil
		}
		slots <- struct{}{}
		checks.Add(1)
		go func() {
			defer func() { o.f.Close(); <-slots; checks.Done() }()
			checkContent(ctx, o, key, vid, add)
		}()
		return nil
	})
	checks.Wait()
	if err == nil {
		err = ctx.Err() // a content check stopped by it reported nothing
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return VerifyReport{}, cerr
		}
		return VerifyReport{}, fmt.Errorf("verify %s: %w", bucket, err)
	}
	if sc, ok := b.meta.(*sidecarMeta); ok {
		missing, err := sc.orphans(r, bucket)
		if err != nil {
			return VerifyReport{}, fmt.Errorf("verify %s: %w", bucket, err)
		}
		for _, m := range missing {
			rep.Objects++
			if m.vid == "" {
				add(m.key, "", ProblemMissing, "the object's record exists but its file is gone (deleted or renamed behind "+
					"S3); basalt object unexport removes the record")
			} else {
				add(m.key, m.vid, ProblemMissing, "the version's record exists but its file is gone (deleted or renamed "+
					"behind S3); DELETE with this versionId removes the record")
			}
		}
	}
	sort.SliceStable(rep.Problems, func(i, j int) bool {
		a, b := rep.Problems[i], rep.Problems[j]
		return a.Key < b.Key || a.Key == b.Key && a.VersionID < b.VersionID
	})
	return rep, nil
}

// verifyWorkers: content checks run at once by Verify.
const verifyWorkers = 8

// checkContent reports through add whether o's bytes still hash to its
// recorded ETag (nothing if ctx ends first).
func checkContent(ctx context.Context, o *object, key, vid string, add func(key, vid, problem, format string, args ...any)) {
	etag, ok, err := contentETag(ctx, o)
	if err != nil {
		if ctx.Err() == nil {
			add(key, vid, ProblemUnreadable, "cannot read it: %v", err)
		}
		return
	}
	if fi, err := o.f.Stat(); err == nil {
		if why := o.m.differs(statOf(fi)); why != "" {
			add(key, vid, ProblemModified, "%s (while it was being verified)", why)
			return
		}
	}
	if ok && etag != o.m.ETag {
		add(key, vid, ProblemContent, "the file's content hashes to ETag %s, recorded %s: it was changed behind S3 "+
			"keeping its size and mtime", etag, o.m.ETag)
	}
}

// contentETag recomputes o's ETag from its bytes: the MD5, or for a
// multipart object the MD5 of its parts' MD5s with "-<n>". ok is false
// when the record's ETag has a form that cannot be recomputed (a
// multipart ETag without its part layout).
func contentETag(ctx context.Context, o *object) (string, bool, error) {
	m := o.m
	_, count, multi := strings.Cut(strings.Trim(m.ETag, `"`), "-")
	if !multi {
		sum, n, err := md5Range(ctx, o.f, 0, m.Size)
		if err != nil {
			return "", false, err
		}
		if n != m.Size {
			return "", false, io.ErrUnexpectedEOF
		}
		return `"` + hex.EncodeToString(sum) + `"`, true, nil
	}
	if fmt.Sprint(len(m.Parts)) != count {
		return "", false, nil
	}
	all := md5.New()
	start := int64(0)
	for _, end := range m.Parts {
		sum, n, err := md5Range(ctx, o.f, start, end-start)
		if err != nil {
			return "", false, err
		}
		if n != end-start {
			return "", false, io.ErrUnexpectedEOF
		}
		all.Write(sum)
		start = end
	}
	return fmt.Sprintf(`"%s-%d"`, hex.EncodeToString(all.Sum(nil)), len(m.Parts)), true, nil
}

// md5Range hashes n bytes of f from off and says how many it read.
func md5Range(ctx context.Context, f *os.File, off, n int64) ([]byte, int64, error) {
	h := md5lanes.NewStream()
	done, err := copyHashed(io.Discard, &ctxReader{ctx: ctx, r: io.NewSectionReader(f, off, n)}, h)
	if err != nil {
		return nil, done, err
	}
	return h.Sum(nil), done, nil
}

// ctxReader is r until ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// orphan is a sidecar record without its file: of the object key, or of
// its version vid (not "").
type orphan struct{ key, vid string }

// orphans lists the records of bucket, objects' and versions', that have
// no regular file (inside r, the bucket).
func (s *sidecarMeta) orphans(r *os.Root, bucket string) ([]orphan, error) {
	dir := filepath.Join(s.dir, bucket)
	var out []orphan
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == dir {
				return fs.SkipDir
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".json") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var m objectMeta
		if json.Unmarshal(data, &m) != nil || m.Key == "" || s.path(bucket, m.Key) != p {
			return nil // not a record of this bucket
		}
		o := orphan{key: m.Key}
		if k, id, marker, ok := parseVersionPath(m.Key); ok && !marker {
			o = orphan{key: k, vid: id}
		} else if checkKey(o.key) != nil {
			return nil
		}
		if fi, err := r.Lstat(m.Key); err == nil && fi.Mode().IsRegular() {
			return nil
		}
		// Look again under the lock: a commit or remove may be under way.
		return s.stable(bucket, m.Key, func() error {
			if _, err := os.Stat(p); err != nil {
				return nil
			}
			if fi, err := r.Lstat(m.Key); err == nil && fi.Mode().IsRegular() {
				return nil
			}
			if len(m.Prev) == 0 && s.pending(&m) {
				// The record of a write a crash interrupted before its
				// rename, of a key that had no object: no object is
				// missing (the next start removes the record).
				return nil
			}
			out = append(out, o)
			return nil
		})
	})
	return out, err
}
