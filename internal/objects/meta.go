package objects

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sys/unix"
)

// objectMeta is an object's metadata record: JSON in the xattr
// xattrName on the object's file, or in a sidecar file under
// Work/sidecar where the file system has no user xattrs.
//
// Size, MtimeNs and Inode are the file's stat when the object was
// written; a file whose stat differs was changed behind S3.
type objectMeta struct {
	ETag    string `json:"etag"` // quoted, as S3 sends it
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	Inode   uint64 `json:"inode"`

	ContentType        string            `json:"content_type,omitempty"`
	ContentEncoding    string            `json:"content_encoding,omitempty"`
	ContentDisposition string            `json:"content_disposition,omitempty"`
	ContentLanguage    string            `json:"content_language,omitempty"`
	CacheControl       string            `json:"cache_control,omitempty"`
	Expires            string            `json:"expires,omitempty"`
	UserMeta           map[string]string `json:"meta,omitempty"`
	Checksum           *checksum         `json:"checksum,omitempty"`
	// Parts are the end offsets of a multipart object's parts.
	Parts []int64 `json:"parts,omitempty"`
	// VersionID is the object's version id ("" for the null version);
	// see versions.go.
	VersionID string `json:"version_id,omitempty"`
	// Key is set in sidecar records only (they are found by a hash of
	// the key; the key guards against a mix-up).
	Key string `json:"key,omitempty"`
	// Modified, when set, says why the file counts as changed behind S3
	// whatever its stat: the gateway kept (or restored) as a version a
	// file whose record was invalid, and wrote this record in its place
	// to carry the version id (see markModified).
	Modified string `json:"modified,omitempty"`
	// Prev is set in sidecar records only: the record this one replaced
	// (as stored, without its own Prev). A sidecar commit publishes the
	// record before it renames the data into place, so after a crash
	// between the two the file at the key is still the one Prev
	// describes, and is served as that object (sidecarMeta.read).
	Prev json.RawMessage `json:"prev,omitempty"`
	// Tmp is set in the sidecar records a write publishes (publish): the
	// name in Work/tmp (pendingName) of the file that write renames into
	// place. While a file of that name and of this record's stat is
	// there, the rename has not happened — still under way, or never to
	// be, the gateway having died in between — and the record is not in
	// force (sidecarMeta.read); the next start undoes it (undoUnfinished).
	Tmp string `json:"tmp,omitempty"`
}

// checksum is an object's (or a part's) stored S3 checksum.
type checksum struct {
	Algorithm types.ChecksumAlgorithm `json:"algorithm"`
	Type      types.ChecksumType      `json:"type,omitempty"`
	Value     string                  `json:"value"` // base64, as S3 sends it
}

// inlineParts is the most parts a record lists as their end offsets
// ("parts"). Beyond that it keeps the part layout as runs of parts of one
// size, "part_runs": [[size, count], ...]: an ext4 xattr holds about
// 4 KiB, which the ends of some 370 parts of 5 MiB fill, so larger
// uploads — S3 takes 10000 parts — could not be completed (the record
// did not fit: MetadataTooLarge). Clients upload parts of one size and a
// smaller last one: two runs, whatever the count.
const inlineParts = 64

// storedRecord is an object record as stored: objectMeta, with the part
// layout in PartRuns instead of Parts when it has more than inlineParts
// parts (encodeRecord; decodeRecord expands it again).
type storedRecord struct {
	objectMeta
	PartRuns [][2]int64 `json:"part_runs,omitempty"`
}

// encodeRecord is m as stored.
func encodeRecord(m *objectMeta) ([]byte, error) {
	r := storedRecord{objectMeta: *m}
	if len(m.Parts) > inlineParts {
		prev := int64(0)
		for _, end := range m.Parts {
			size := end - prev
			if n := len(r.PartRuns); n > 0 && r.PartRuns[n-1][0] == size {
				r.PartRuns[n-1][1]++
			} else {
				r.PartRuns = append(r.PartRuns, [2]int64{size, 1})
			}
			prev = end
		}
		r.Parts = nil
	}
	return json.Marshal(&r)
}

// expandRuns sets r's part ends from its part runs, if it has any. The
// runs are checked before anything is allocated for them (records are
// files and xattrs users with direct access can write): counts of at
// least 1 adding up to at most maxRecordParts, sizes of at least 0 whose
// sum fits an int64; decodeRecord then checks the ends.
func (r *storedRecord) expandRuns() error {
	if len(r.PartRuns) == 0 {
		return nil
	}
	if len(r.Parts) > 0 {
		return errors.New("a record with both parts and part_runs")
	}
	total, end := int64(0), int64(0)
	for _, run := range r.PartRuns {
		size, count := run[0], run[1]
		if size < 0 || count < 1 || count > maxRecordParts-total ||
			size > 0 && count > (math.MaxInt64-end)/size {
			return fmt.Errorf("part run %v after %d parts ending at %d", run, total, end)
		}
		total += count
		end += size * count
	}
	r.Parts = make([]int64, 0, total)
	end = 0
	for _, run := range r.PartRuns {
		for range run[1] {
			end += run[0]
			r.Parts = append(r.Parts, end)
		}
	}
	return nil
}

// xattrName is the one xattr basalt keeps on an object file.
const xattrName = "user.basalt.object"

// errNoMeta: the file has no basalt metadata (it is not an object).
var errNoMeta = errors.New("no basalt object metadata")

// maxRecordParts bounds a record's part list (S3's own limit).
const maxRecordParts = 10000

// decodeRecord decodes an object record and checks what serving the
// object computes from it. Records live in xattrs and sidecar files that a
// user with direct access to the file system can write, so nothing in one
// is trusted: a size of at least 0; at most 10000 part ends, none below
// the one before or below 0, the last equal to the size; a version id
// that is empty or of newVersionID's form.
func decodeRecord(data []byte) (*objectMeta, error) {
	var r storedRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, badRecord{err}
	}
	if err := r.expandRuns(); err != nil {
		return nil, badRecord{err}
	}
	m := r.objectMeta
	if m.Size < 0 || len(m.Parts) > maxRecordParts {
		return nil, badRecord{fmt.Errorf("size %d with %d parts", m.Size, len(m.Parts))}
	}
	prev := int64(0)
	for i, end := range m.Parts {
		if end < prev || i == len(m.Parts)-1 && end != m.Size {
			return nil, badRecord{fmt.Errorf("part %d ends at %d (after %d, size %d)", i+1, end, prev, m.Size)}
		}
		prev = end
	}
	if m.VersionID != "" && !validVersionID(m.VersionID) {
		return nil, badRecord{fmt.Errorf("version id %q", m.VersionID)}
	}
	return &m, nil
}

// badRecord is decodeRecord's error: the record exists but is not one the
// gateway wrote, so the object was changed behind S3.
type badRecord struct{ err error }

func (e badRecord) Error() string { return "invalid record: " + e.err.Error() }
func (e badRecord) Unwrap() error { return e.err }

func (m *objectMeta) mtime() time.Time { return time.Unix(0, m.MtimeNs) }

// setStat records the stat of the file that will hold the object.
func (m *objectMeta) setStat(st *syscall.Stat_t) {
	m.Size = st.Size
	m.MtimeNs = st.Mtim.Nano()
	m.Inode = st.Ino
}

// differs says how the file's stat differs from the record, "" if it
// does not.
func (m *objectMeta) differs(st *syscall.Stat_t) string {
	switch {
	case m.Modified != "":
		return m.Modified
	case st.Ino != m.Inode:
		return fmt.Sprintf("the file was replaced (inode %d, recorded %d)", st.Ino, m.Inode)
	case st.Size != m.Size:
		return fmt.Sprintf("the file's size is %d bytes, recorded %d", st.Size, m.Size)
	case st.Mtim.Nano() != m.MtimeNs:
		return fmt.Sprintf("the file was modified at %s, recorded %s",
			time.Unix(0, st.Mtim.Nano()).UTC().Format(time.RFC3339Nano), m.mtime().UTC().Format(time.RFC3339Nano))
	}
	return ""
}

// metaStore keeps object records: xattrMeta or sidecarMeta.
type metaStore interface {
	kind() string
	// read returns the record of the object file f, opened as
	// bucket/key; errNoMeta if it has none.
	read(f *os.File, bucket, key string) (*objectMeta, error)
	// attach gives the unpublished temp file f its record (before the
	// file is synced).
	attach(f *os.File, m *objectMeta) error
	// commit publishes m for bucket/key around rename, which puts the
	// file in place.
	commit(bucket, key string, m *objectMeta, rename func() error) error
	// remove deletes bucket/key's record around del, which deletes the file.
	remove(bucket, key string, del func() error) error
	// stable runs fn with no commit or remove of bucket/key in progress
	// (fn re-reads what may have been caught between the two steps of a
	// sidecar commit).
	stable(bucket, key string, fn func() error) error
}

// xattrMeta keeps the record in one xattr on the file, so the record
// and the bytes are published by the same rename.
type xattrMeta struct{}

func (xattrMeta) kind() string { return "xattr" }

func (xattrMeta) read(f *os.File, _, _ string) (*objectMeta, error) {
	data, err := fgetxattr(f, xattrName)
	if err != nil {
		return nil, err
	}
	m, err := decodeRecord(data)
	if err != nil {
		return nil, fmt.Errorf("object metadata of %s: %w", f.Name(), err)
	}
	m.Prev, m.Tmp = nil, "" // sidecar fields: no xattr record has one of its own
	return m, nil
}

func (xattrMeta) attach(f *os.File, m *objectMeta) error {
	data, err := encodeRecord(m)
	if err != nil {
		return err
	}
	var serr error
	err = rawFd(f, func(fd int) { serr = unix.Fsetxattr(fd, xattrName, data, 0) })
	if err == nil {
		err = serr
	}
	if errors.Is(err, unix.ENOSPC) && storeFull(f) {
		// ext4 answers ENOSPC both for a record too large for its xattr
		// space and for no free block to put one in: on a full file
		// system it is the latter, the caller's 507, not a 400 blaming
		// the request's metadata.
		return fmt.Errorf("set metadata xattr: %w", err)
	}
	if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ERANGE) {
		return metadataTooLarge(len(data))
	}
	if err != nil {
		return fmt.Errorf("set metadata xattr: %w", err)
	}
	return nil
}

// storeFull reports whether the file system holding f has no block left
// for this process that an xattr could take (an ext4 xattr block is one;
// with one or none free, nothing fits). Root may use the blocks the file
// system reserves; others only what is available to them.
func storeFull(f *os.File) bool {
	var st unix.Statfs_t
	var serr error
	if err := rawFd(f, func(fd int) { serr = unix.Fstatfs(fd, &st) }); err != nil || serr != nil {
		return false
	}
	free := st.Bavail
	if os.Geteuid() == 0 {
		free = st.Bfree
	}
	return free <= 1
}

func (xattrMeta) commit(_, _ string, _ *objectMeta, rename func() error) error { return rename() }
func (xattrMeta) remove(_, _ string, del func() error) error                   { return del() }
func (xattrMeta) stable(_, _ string, fn func() error) error                    { return fn() }

// fgetxattr reads an xattr of f; errNoMeta if it is not set.
func fgetxattr(f *os.File, name string) ([]byte, error) {
	buf := make([]byte, 1024)
	for {
		var n int
		var gerr error
		if err := rawFd(f, func(fd int) { n, gerr = unix.Fgetxattr(fd, name, buf) }); err != nil {
			return nil, err
		}
		switch {
		case gerr == nil:
			return buf[:n], nil
		case errors.Is(gerr, unix.ENODATA) || errors.Is(gerr, unix.ENOTSUP):
			return nil, errNoMeta
		case errors.Is(gerr, unix.ERANGE) && len(buf) < 1<<20:
			buf = make([]byte, 4*len(buf))
		default:
			return nil, fmt.Errorf("read metadata xattr of %s: %w", f.Name(), gerr)
		}
	}
}

// sidecarMeta keeps records as files Work/sidecar/<bucket>/<h[:2]>/<h>
// (h the SHA-256 of the key, in hex). A commit writes the record, then
// renames the data into place, both under an exclusive lock of
// Work/locks/<shard>; readers that find a record not matching the file
// look again under a shared lock.
type sidecarMeta struct {
	dir   string // Work/sidecar
	locks string // Work/locks
	tmp   string // Work/tmp
}

func (s *sidecarMeta) kind() string { return "sidecar" }

func (s *sidecarMeta) path(bucket, key string) string {
	return s.pathOf(bucket, keyHash(key))
}

// pathOf is the path of the record of the key whose keyHash is h.
func (s *sidecarMeta) pathOf(bucket, h string) string {
	return filepath.Join(s.dir, bucket, h[:2], h+".json")
}

// keyHash is the SHA-256 of key in hex: the name of its sidecar record.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func (s *sidecarMeta) read(f *os.File, bucket, key string) (*objectMeta, error) {
	data, err := os.ReadFile(s.path(bucket, key))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errNoMeta
	}
	if err != nil {
		return nil, fmt.Errorf("read sidecar metadata: %w", err)
	}
	m, err := decodeRecord(data)
	if err != nil {
		return nil, fmt.Errorf("sidecar metadata of %s/%s: %w", bucket, key, err)
	}
	if m.Key != key {
		return nil, errNoMeta
	}
	prev, tmp := m.Prev, m.Tmp
	m.Prev, m.Tmp = nil, ""
	if p := previous(f, key, m, prev); p != nil {
		return p, nil
	}
	if f != nil && s.unfinished(f, m, tmp) {
		// The write that published m has not renamed its file into
		// place: the file at the key is what was there before it — the
		// object prev describes, changed behind S3 since, or with no prev
		// no object at all (a file put there directly, say).
		if p, err := decodeRecord(prev); len(prev) > 0 && err == nil && p.Key == key {
			p.Prev, p.Tmp = nil, ""
			return p, nil
		}
		return nil, errNoMeta
	}
	return m, nil
}

// unfinished reports whether the write that published the record m (its
// Tmp tmp) has not renamed its file into place: f, the file at the key,
// is not the record's, and Work/tmp/tmp still is. (Once renamed, the temp
// name is gone for good: a reader that finds it there reads before the
// write's rename, whether the write is under way or died.)
func (s *sidecarMeta) unfinished(f *os.File, m *objectMeta, tmp string) bool {
	if tmp == "" {
		return false
	}
	fi, err := f.Stat()
	if err != nil || m.differs(fi.Sys().(*syscall.Stat_t)) == "" {
		return false
	}
	return s.pending(&objectMeta{Size: m.Size, MtimeNs: m.MtimeNs, Inode: m.Inode, Modified: m.Modified, Tmp: tmp})
}

// pending reports whether the file the record m names as its Tmp is
// still in Work/tmp, the record's file: its write has not renamed it
// into place.
func (s *sidecarMeta) pending(m *objectMeta) bool {
	if m.Tmp == "" || m.Tmp != filepath.Base(m.Tmp) || !strings.HasPrefix(m.Tmp, pendingPrefix) {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(s.tmp, m.Tmp), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return false
	}
	return m.differs(&st) == ""
}

// pendingPrefix starts the name publish gives a temp file in sidecar mode
// before it publishes the file's record: pub.<bucket>.<h>.<random>, h the
// keyHash of its key. The record names it (Tmp) until the rename takes it
// away, so a start can find the records of the writes a crash
// interrupted (undoUnfinished).
const pendingPrefix = "pub."

// pendingName is a new pending name for a temp file of bucket/key.
func pendingName(bucket, key string) string {
	var rnd [6]byte
	rand.Read(rnd[:])
	return pendingPrefix + bucket + "." + keyHash(key) + "." + hex.EncodeToString(rnd[:])
}

// parsePending returns the bucket and key hash of a pendingName.
func parsePending(name string) (bucket, h string, ok bool) {
	rest, ok := strings.CutPrefix(name, pendingPrefix)
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return "", "", false
	}
	rest = rest[:i]
	j := strings.LastIndexByte(rest, '.')
	if j < 0 {
		return "", "", false
	}
	bucket, h = rest[:j], rest[j+1:]
	if len(h) != 2*sha256.Size || checkBucketName(bucket) != nil {
		return "", "", false
	}
	if _, err := hex.DecodeString(h); err != nil {
		return "", "", false
	}
	return bucket, h, true
}

// undoUnfinished undoes the writes a crash interrupted between publishing
// their sidecar record and renaming their file into place (publish): the
// file is still in Work/tmp under its pending name, which its record
// names. Each such record is replaced by the one it replaced (Prev) or,
// if there was none, removed — what the write does itself when its rename
// fails — and then the file goes: the write was never acknowledged.
// Otherwise the record of a key that had no object would stay, a record
// of nothing, which verify would report as an object deleted behind S3
// and which would make a file put at the key later look like that object
// changed behind S3 once the temp file is gone. It runs when the store
// opens, before old temp files are removed.
func (s *sidecarMeta) undoUnfinished(log *slog.Logger) {
	ents, err := os.ReadDir(s.tmp)
	if err != nil {
		return
	}
	for _, e := range ents {
		bucket, h, ok := parsePending(e.Name())
		if !ok {
			continue
		}
		undone, err := s.undo(bucket, h, e.Name())
		if err != nil {
			log.Warn("undoing a write a crash interrupted", "bucket", bucket, "file", e.Name(), "err", err)
		} else if undone != "" {
			log.Info("undid a write a crash interrupted", "bucket", bucket, "key", undone)
		}
	}
}

// undo undoes the write whose temp file is Work/tmp/name, of a key of
// bucket with keyHash h, if its record is in place and the file still
// there (undoUnfinished); it returns the key it undid the write of.
// Under the key's lock: a write still under way (another gateway's)
// finishes first, and its file is then gone.
func (s *sidecarMeta) undo(bucket, h, name string) (string, error) {
	p := s.pathOf(bucket, h)
	read := func() (*objectMeta, error) {
		data, err := os.ReadFile(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return nil, err
		}
		m, err := decodeRecord(data)
		if err != nil || m.Tmp != name || m.Key == "" || keyHash(m.Key) != h {
			return nil, nil // not the record of that write
		}
		return m, nil
	}
	m, err := read()
	if m == nil || err != nil {
		return "", err
	}
	unlock, err := s.lock(bucket, m.Key, unix.LOCK_EX)
	if err != nil {
		return "", err
	}
	defer unlock()
	if m, err = read(); m == nil || err != nil {
		return "", err
	}
	if !s.pending(m) {
		return "", nil // renamed into place meanwhile, or not the record's file
	}
	tmp := filepath.Join(s.tmp, name)
	if len(m.Prev) > 0 {
		if err := writeFileSync(s.tmp, s.dir, p, m.Prev); err != nil {
			return "", err
		}
	} else {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		if err := syncDir(filepath.Dir(p)); err != nil {
			return "", err
		}
	}
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return m.Key, err
	}
	return m.Key, nil
}

// previous returns the record prev (a sidecar record's Prev) when the
// file f, opened as key, does not match its record m but matches prev:
// a commit wrote m and has not renamed its data into place — still
// under way, or never to be, the gateway having crashed in between. The
// file at the key is then the object prev describes, and nothing was
// changed behind S3. Otherwise nil (f nil: no file to compare).
func previous(f *os.File, key string, m *objectMeta, prev json.RawMessage) *objectMeta {
	if f == nil || len(prev) == 0 {
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	st := fi.Sys().(*syscall.Stat_t)
	if m.differs(st) == "" {
		return nil
	}
	p, err := decodeRecord(prev)
	if err != nil || p.Key != key || p.differs(st) != "" {
		return nil
	}
	p.Prev, p.Tmp = nil, ""
	return p
}

// prevRecord returns the stored sidecar record old of key as the Prev of
// the record replacing it: without its own Prev, so records do not
// chain. nil if old is no valid record of key (nothing to fall back to).
func prevRecord(old []byte, key string) json.RawMessage {
	m, err := decodeRecord(old)
	if err != nil || m.Key != key {
		return nil
	}
	m.Prev, m.Tmp = nil, ""
	data, err := encodeRecord(m)
	if err != nil {
		return nil
	}
	return data
}

func (s *sidecarMeta) attach(*os.File, *objectMeta) error { return nil }

// lock takes the shard lock of bucket/key (how: unix.LOCK_EX or LOCK_SH).
// flock locks belong to the open file description, so goroutines of one
// process exclude each other as well as other gateways.
func (s *sidecarMeta) lock(bucket, key string, how int) (func(), error) {
	h := sha256.Sum256([]byte(bucket + "/" + key))
	return lockFile(filepath.Join(s.locks, hex.EncodeToString(h[:1])), how)
}

// lockFile takes a flock (how: unix.LOCK_EX or LOCK_SH) on the file name,
// created if need be, and returns its release.
func lockFile(name string, how int) (func(), error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock: %w", err)
	}
	var lerr error
	if err := rawFd(f, func(fd int) {
		for {
			if lerr = unix.Flock(fd, how); lerr != unix.EINTR {
				return
			}
		}
	}); err != nil || lerr != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", name, errors.Join(err, lerr))
	}
	return func() { f.Close() }, nil
}

func (s *sidecarMeta) commit(bucket, key string, m *objectMeta, rename func() error) error {
	unlock, err := s.lock(bucket, key, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	p := s.path(bucket, key)
	old, oerr := os.ReadFile(p)
	rec := *m
	rec.Key = key
	rec.Prev = nil
	if oerr == nil {
		// Until rename is done the file at the key is the one old
		// describes; if the gateway dies first, it stays so (read).
		rec.Prev = prevRecord(old, key)
	}
	data, err := encodeRecord(&rec)
	if err != nil {
		return err
	}
	if err := writeFileSync(s.tmp, s.dir, p, data); err != nil {
		return fmt.Errorf("write sidecar metadata: %w", err)
	}
	if err := rename(); err != nil {
		// Put the old record back: the old file is still in place.
		if oerr == nil {
			_ = writeFileSync(s.tmp, s.dir, p, old)
		} else {
			_ = os.Remove(p)
		}
		return err
	}
	return nil
}

func (s *sidecarMeta) remove(bucket, key string, del func() error) error {
	unlock, err := s.lock(bucket, key, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	if err := del(); err != nil {
		return err
	}
	p := s.path(bucket, key)
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove sidecar metadata: %w", err)
	}
	return syncDir(filepath.Dir(p))
}

func (s *sidecarMeta) stable(bucket, key string, fn func() error) error {
	unlock, err := s.lock(bucket, key, unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer unlock()
	return fn()
}

// writeFileSync writes data to path durably and atomically: a temp file
// in tmpDir, fsync, rename, fsync of path's directory. That directory
// lies below base and is created if missing (makeDirs).
func writeFileSync(tmpDir, base, path string, data []byte) error {
	rel, err := filepath.Rel(base, filepath.Dir(path))
	if err != nil {
		return err
	}
	if err := makeDirs(under(base), filepath.ToSlash(rel), nil); err != nil {
		return err
	}
	return writeFileIn(tmpDir, path, data)
}

// writeFileIn is writeFileSync in a directory that must exist: it never
// creates one (a missing directory fails with ENOENT, at the rename or
// at the directory's fsync if it went meanwhile).
func writeFileIn(tmpDir, path string, data []byte) error {
	f, err := os.CreateTemp(tmpDir, "meta-*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncDir fsyncs a directory given by path.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// probeXattr reports whether user xattrs can be set in dir (a temp file
// is created and removed).
func probeXattr(dir string) (bool, error) {
	f, err := os.CreateTemp(dir, "xattr-probe-*")
	if err != nil {
		return false, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	var serr error
	if err := rawFd(f, func(fd int) { serr = unix.Fsetxattr(fd, "user.basalt.probe", []byte("1"), 0) }); err != nil {
		return false, err
	}
	if serr != nil {
		if errors.Is(serr, unix.ENOTSUP) || errors.Is(serr, unix.EPERM) || errors.Is(serr, unix.EACCES) {
			return false, nil
		}
		return false, serr
	}
	v, err := fgetxattr(f, "user.basalt.probe")
	if err != nil {
		return false, nil
	}
	return string(v) == "1", nil
}

// rawFd runs fn with f's descriptor.
func rawFd(f *os.File, fn func(fd int)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) { fn(int(fd)) })
}
