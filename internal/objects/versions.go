package objects

// Bucket versioning (docs/objects.md, "Versioning"). The current version
// of bucket/key is the file <bucket>/<key>, as without versioning; its
// record carries its version id ("" = the null version). Non-current
// versions are ordinary files <bucket>/.basalt-versions/<key>/.basalt-version.<id>,
// each with its own record (the xattr travels with the inode; in sidecar
// mode the record is kept under the file's path as a pseudo-key). Delete
// markers are empty files .basalt-versions/<key>/.basalt-version.<id>.delete-marker
// (holding a note while the DELETE that made them runs: deleteMarker).
// In a key's version directory, then, the names starting with ".basalt"
// are its versions and every other name is the directory of a longer
// key's versions: key components never start with ".basalt" (checkKey),
// so key "a"'s null version and key "a/null"'s versions never meet.
// Writes and deletes of one key in a versioned bucket are serialised by
// a flock on Work/locks/v<shard> (across gateways too).

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3err"
	"github.com/versity/versitygw/s3response"
	"golang.org/x/sys/unix"
)

const (
	// versionsDir holds the non-current versions, below the bucket directory.
	versionsDir = ".basalt-versions"
	// versionPrefix starts the name of every version file and delete
	// marker in a key's version directory.
	versionPrefix = ".basalt-version."
	// markerSuffix ends the name of a delete marker's file.
	markerSuffix = ".delete-marker"
	// nullVersion is the id S3 shows for the null version (and the name
	// of its file, after versionPrefix).
	nullVersion = "null"
	// versionIDLen: 16 hex digits of UnixNano, 8 random hex digits.
	versionIDLen = 24

	statusEnabled   = string(types.BucketVersioningStatusEnabled)
	statusSuspended = string(types.BucketVersioningStatusSuspended)
)

// newVersionID returns a version id; ids sort chronologically as strings.
func newVersionID() string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("%016x%s", time.Now().UnixNano(), hex.EncodeToString(r[:]))
}

// lostVersionID is the version id of a file whose record is invalid (its
// own id is lost): 16 hex digits of its mtime (ns) and 8 of its inode. It
// sorts by when the file was last written and stays the same while the
// file does, so listing it, GET and DELETE ?versionId= and keeping it as
// a version all agree on it.
func lostVersionID(st *syscall.Stat_t) string {
	return fmt.Sprintf("%016x%08x", uint64(st.Mtim.Nano()), uint32(st.Ino))
}

// markModified returns the record that takes the place of o's invalid one
// when o is kept or restored as version vid: it carries the version id
// and marks the file modified (objectMeta.Modified), so it is never
// served. With xattrs it is set on o's file at once (the record travels
// with the inode through the link or rename that follows); a sidecar
// record is published by the caller's commit.
func (b *Backend) markModified(o *object, bucket, p, vid string) (*objectMeta, error) {
	m := &objectMeta{VersionID: vid, Modified: o.bad + " (the gateway replaced it when it kept the file as a version)"}
	m.setStat(o.st)
	if _, ok := b.meta.(xattrMeta); !ok {
		return m, nil
	}
	if err := b.meta.attach(o.f, m); err != nil {
		return nil, fmt.Errorf("mark %s/%s modified: %w", bucket, p, err)
	}
	if err := o.f.Sync(); err != nil {
		return nil, fmt.Errorf("mark %s/%s modified: %w", bucket, p, err)
	}
	return m, nil
}

// validVersionID: "null" or an id of newVersionID's form.
func validVersionID(v string) bool {
	if v == nullVersion {
		return true
	}
	if len(v) != versionIDLen {
		return false
	}
	for i := 0; i < len(v); i++ {
		if !(v[i] >= '0' && v[i] <= '9' || v[i] >= 'a' && v[i] <= 'f') {
			return false
		}
	}
	return true
}

func errInvalidVersion(v string) error {
	return s3err.APIError{Code: "InvalidArgument", Description: fmt.Sprintf("Invalid version id specified: %q", v),
		HTTPStatusCode: http.StatusBadRequest}
}

// showVersion is the id as S3 shows it ("null" for "").
func showVersion(v string) string {
	if v == "" {
		return nullVersion
	}
	return v
}

// versionFile is the path (inside the bucket) of version vid of key.
func versionFile(key, vid string) string {
	return versionsDir + "/" + key + "/" + versionPrefix + showVersion(vid)
}

// parseVersionName parses the name of a file in a key's version
// directory: the version id as S3 shows it and whether the file is a
// delete marker; ok is false for a name versionFile and markerFile never
// give.
func parseVersionName(name string) (vid string, marker, ok bool) {
	vid, ok = strings.CutPrefix(name, versionPrefix)
	if !ok {
		return "", false, false
	}
	vid, marker = strings.CutSuffix(vid, markerSuffix)
	if !validVersionID(vid) {
		return "", false, false
	}
	return vid, marker, true
}

// parseVersionPath splits p, a path inside a bucket, into the key and the
// version id (as S3 shows it) of the version file or delete marker it
// names; ok is false if it names none.
func parseVersionPath(p string) (key, vid string, marker, ok bool) {
	rest, ok := strings.CutPrefix(p, versionsDir+"/")
	if !ok {
		return "", "", false, false
	}
	dir, name := path.Split(rest)
	key = strings.TrimSuffix(dir, "/")
	vid, marker, ok = parseVersionName(name)
	if !ok || checkKey(key) != nil {
		return "", "", false, false
	}
	return key, vid, marker, true
}

// markerFile is the path of delete marker vid of key.
func markerFile(key, vid string) string { return versionFile(key, vid) + markerSuffix }

// versioning returns the bucket's versioning status ("", Enabled, Suspended).
func (b *Backend) versioning(ctx context.Context, bucket string) (string, error) {
	rec, err := b.record(ctx, bucket)
	if err != nil {
		return "", err
	}
	return rec.Versioning, nil
}

// writeVersion returns the version id a write gets under status.
func writeVersion(status string) string {
	if status == statusEnabled {
		return newVersionID()
	}
	return ""
}

// keyLock serialises the writes and deletes of bucket/key, across
// gateways sharing the file system: a write's conditions (If-Match,
// If-None-Match) are checked under it, so that they hold when the write
// lands, and versioned writes keep the current object under it.
func (b *Backend) keyLock(bucket, key string) (func(), error) {
	h := sha256.Sum256([]byte(bucket + "/" + key))
	return lockFile(filepath.Join(b.work, "locks", "v"+hex.EncodeToString(h[:1])), unix.LOCK_EX)
}

// publishWrite publishes tmp (record m attached) as bucket/key like
// publish, under the key's lock, once check (if not nil: the write's
// conditions) passes; with versioning on (status not ""), the current
// object is first hard-linked to its version file (unless it is the null
// version and status is Suspended: then it is replaced), and with
// Suspended an older null version is removed once the new object is in
// place.
func (b *Backend) publishWrite(r *os.Root, bucket, key string, tmp *os.File, m *objectMeta, status string, check func() error) error {
	unlock, err := b.keyLock(bucket, key)
	if err != nil {
		return err
	}
	defer unlock()
	if check != nil {
		if err := check(); err != nil {
			return err
		}
	}
	if status == "" {
		_, err := b.publish(r, bucket, key, tmp, m)
		return err
	}
	// What a DELETE of the key left unfinished is settled first.
	if err := b.settleDeletes(r, bucket, key); err != nil {
		return err
	}
	kept, err := b.keepCurrent(r, bucket, key, status == statusSuspended)
	if err != nil {
		return err
	}
	if renamed, err := b.publish(r, bucket, key, tmp, m); err != nil {
		// Undo the keeping only if the current object is still in place:
		// once renamed over, the version file is its only link.
		if kept != "" && !renamed {
			_ = b.removeVersionFile(r, bucket, kept)
		}
		return err
	}
	if status == statusSuspended {
		return b.removeNull(r, bucket, key)
	}
	return nil
}

// keepCurrent hard-links the current object bucket/key (if there is one)
// to its version file and returns that path; nothing if the current
// object is the null version and replaceNull is set. A current file that
// GET refuses (ownerMayRead) is not kept: the write or delete is refused. An object changed
// behind S3 is kept as it is, its version still reported modified; one
// whose record is invalid is kept as version lostVersionID with a record
// that marks it modified.
func (b *Backend) keepCurrent(r *os.Root, bucket, key string, replaceNull bool) (string, error) {
	o, err := b.openAny(r, bucket, key)
	if isNoSuchKey(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer o.f.Close()
	// A file the bucket's owner could not read directly (moved in by
	// someone who may) is not served; kept as a version, in the
	// gateway's own directories, it would be.
	d, err := judge(r, key, o.st)
	if err != nil {
		return "", fmt.Errorf("check the directories of %s/%s: %w", bucket, key, err)
	}
	if d != nil {
		return "", errNotKept(bucket, key, o.st.Uid, d)
	}
	vid := o.versionID()
	if replaceNull && vid == "" {
		return "", nil
	}
	vpath := versionFile(key, vid)
	rec := o.m
	if o.bad != "" {
		if rec, err = b.markModified(o, bucket, key, vid); err != nil {
			return "", err
		}
	}
	dir := path.Dir(vpath)
	mkdir := func() error {
		if err := mkdirs(r, bucket, vpath, dir, nil); err != nil {
			return fmt.Errorf("keep version of %s/%s: %w", bucket, key, err)
		}
		return nil
	}
	if err := inDir(r, dir, func(bool) error { return mkdir() }); err != nil {
		return "", err
	}
	kept := *rec
	kept.Key = ""
	err = b.meta.commit(bucket, vpath, &kept, func() error {
		// The version directory is made again if a DELETE of another
		// key's last version prunes it meanwhile (inDir).
		return inDir(r, dir, func(again bool) error {
			if again {
				if err := mkdir(); err != nil {
					return err
				}
			}
			err := r.Link(key, vpath)
			if errors.Is(err, fs.ErrExist) {
				// A stale file of the same version (an earlier null version).
				if err = r.Remove(vpath); err == nil {
					err = r.Link(key, vpath)
				}
			}
			if err != nil {
				return fmt.Errorf("keep version of %s/%s: %w", bucket, key, err)
			}
			return nil
		})
	})
	if err != nil {
		return "", err
	}
	return vpath, syncIn(r, dir)
}

// removeVersionFile removes a version file (and its record) or a delete
// marker, then the empty directories above it.
func (b *Backend) removeVersionFile(r *os.Root, bucket, vpath string) error {
	del := func() error {
		if err := r.Remove(vpath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s/%s: %w", bucket, vpath, err)
		}
		return nil
	}
	var err error
	if strings.HasSuffix(vpath, markerSuffix) {
		err = del()
	} else {
		err = b.meta.remove(bucket, vpath, del)
	}
	if err != nil {
		return err
	}
	dir := path.Dir(vpath)
	_ = syncIn(r, dir)
	pruneDirs(r, dir)
	return nil
}

// dropOrphanRecord removes the sidecar record of the version file vpath,
// which is gone (Verify's ProblemMissing). With xattrs there is none: the
// record went with the file.
func (b *Backend) dropOrphanRecord(bucket, vpath string) error {
	sc, ok := b.meta.(*sidecarMeta)
	if !ok {
		return nil
	}
	if _, err := os.Lstat(sc.path(bucket, vpath)); err != nil {
		return nil
	}
	return sc.remove(bucket, vpath, func() error { return nil })
}

// removeNull removes the non-current null version and null delete marker of key.
func (b *Backend) removeNull(r *os.Root, bucket, key string) error {
	for _, p := range []string{versionFile(key, ""), markerFile(key, "")} {
		if _, err := r.Lstat(p); err == nil {
			if err := b.removeVersionFile(r, bucket, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// addMarker creates the delete marker vid of key. With a note (a
// DELETE's, deleteNote) the marker is written aside first, under
// pendingMarker in the same directory, and renamed into place with its
// note already durable: a crash leaves either no marker or the marker
// with its note, never a marker without the note.
func (b *Backend) addMarker(r *os.Root, bucket, key, vid string, note []byte) error {
	p := markerFile(key, vid)
	dir := path.Dir(p)
	name := p
	if note != nil {
		name = dir + "/" + pendingMarker
	}
	var f *os.File
	err := inDir(r, dir, func(bool) error {
		if err := mkdirs(r, bucket, p, dir, nil); err != nil {
			return err
		}
		var err error
		if f, err = r.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644); err != nil {
			return fmt.Errorf("create delete marker %s/%s: %w", bucket, p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if note != nil {
		_, err = f.Write(note)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && note != nil {
		// The directory holds the file written aside: no DELETE of
		// another key prunes it meanwhile.
		if err = r.Rename(name, p); err != nil {
			err = fmt.Errorf("create delete marker %s/%s: %w", bucket, p, err)
		}
	}
	if err != nil {
		if note != nil {
			_ = r.Remove(name)
		}
		return err
	}
	return syncIn(r, dir)
}

// A versioned DELETE without a version id (deleteMarker) changes two
// names: the current object leaves the key and a delete marker appears.
// No one step of the file system does both, so the marker comes first,
// carrying a note that names the object it deletes (deleteNote), and
// the object's unlink is the DELETE's commit point:
//
//   - While the key still holds the object the note names, the marker
//     is not in effect: listings leave it out (keyVersions), GET
//     ?versionId= of it knows no such version (findVersion), and the
//     object is current for GET and listing alike. A crash there leaves
//     a DELETE that had no effect, and the next write or delete of the
//     key (under its lock: settleDeletes) removes the marker, and the
//     link keepCurrent made, as they were never made.
//   - Once the object is unlinked the marker is the latest version for
//     GET and listing alike; what is left (in Suspended mode the
//     non-current null version, which the null marker replaces; then the
//     note) is finished by finishDelete, by the DELETE itself or, after
//     a crash, by settleDeletes.
//
// Had the unlink come first, a crash before the marker was made would
// leave no current object and no marker: GET answers NoSuchKey while the
// listing calls the version just kept the latest.
const (
	// pendingMarker is where, in a key's version directory, addMarker
	// writes a marker with a note before renaming it into place. The
	// name is no version's (parseVersionName): never listed or served.
	pendingMarker = ".basalt-pending-marker"
	// noteTag starts a delete marker's note.
	noteTag = "basalt-delete"
	// maxNote bounds the notes readNote reads.
	maxNote = 256
)

// deleteNote is the note of a delete marker made by a DELETE of o, the
// current object (nil: there is none).
func deleteNote(o *object) []byte {
	if o == nil {
		return []byte(noteTag + "\n")
	}
	return fmt.Appendf(nil, "%s %s %d\n", noteTag, showVersion(o.versionID()), o.st.Ino)
}

// markerNote is a delete marker's note (deleteNote), parsed.
type markerNote struct {
	obj bool   // whether the DELETE was of a current object
	vid string // its version id, as S3 shows it
	ino uint64 // its inode
}

// names reports whether the note names the object o (not nil).
func (n markerNote) names(o *object) bool {
	return n.obj && n.ino == o.st.Ino && n.vid == showVersion(o.versionID())
}

// markerPending reports whether delete marker id ("" for null) of key is
// not in effect: its note names cur (not nil), the object the key still
// holds, so the DELETE that made it has not reached its commit point, the
// object's unlink (or stopped before it). Listings leave such a marker
// out (keyVersions) and GET ?versionId= knows no such version
// (findVersion); the next request on the key removes it (settleDeletes).
func markerPending(r *os.Root, key, id string, cur *object) bool {
	p := markerFile(key, id)
	fi, err := r.Lstat(p)
	if err != nil {
		return false
	}
	n, ok := readNote(r, p, fi.Size())
	return ok && n.names(cur)
}

// readNote reads the note of the delete marker at p, whose size is size;
// ok is false if it has none (an empty marker: its DELETE has finished)
// or one of no form of deleteNote's (left alone).
func readNote(r *os.Root, p string, size int64) (n markerNote, ok bool) {
	if size <= 0 || size > maxNote {
		return n, false
	}
	f, err := r.Open(p)
	if err != nil {
		return n, false
	}
	defer f.Close()
	buf := make([]byte, maxNote+1)
	k, _ := io.ReadFull(f, buf)
	text, ok := strings.CutSuffix(string(buf[:k]), "\n")
	if !ok {
		return n, false
	}
	fields := strings.Fields(text)
	switch {
	case len(fields) == 1 && fields[0] == noteTag:
		return n, true
	case len(fields) == 3 && fields[0] == noteTag && validVersionID(fields[1]):
		ino, err := strconv.ParseUint(fields[2], 10, 64)
		if err != nil {
			return n, false
		}
		return markerNote{obj: true, vid: fields[1], ino: ino}, true
	}
	return n, false
}

// deleteMarker is a DELETE without a version id in a bucket with
// versioning status status: the current object, if any, is kept as a
// version (unless it is the null version and status is Suspended: then
// it goes), and a delete marker becomes the latest version (in Suspended
// mode the null one, replacing the null version). The order of the
// steps, and what a crash between them leaves, is described above
// pendingMarker. It returns the marker's id, as S3 shows it.
func (b *Backend) deleteMarker(r *os.Root, bucket, key, status string, pre *backend.ObjectDeletePreconditions) (string, error) {
	// The DELETE's conditions first: one that fails changes nothing.
	cur, why, err := b.inspect(r, bucket, key)
	if isNoSuchKey(err) {
		cur = nil
	} else if err != nil {
		return "", err
	} else {
		cur.f.Close()
		if err := deletePreconditions(bucket, key, cur.m, why, pre); err != nil {
			return "", err
		}
	}
	kept, err := b.keepCurrent(r, bucket, key, status == statusSuspended)
	if err != nil {
		return "", err
	}
	if err := faultFS("delete version kept", key); err != nil {
		return "", err
	}
	// undo removes what the DELETE made while the current object is
	// still in place: the marker and the version file kept of it.
	undo := func() {
		if kept != "" {
			_ = b.removeVersionFile(r, bucket, kept)
		}
		_ = b.settleDeletes(r, bucket, key)
	}
	mid := ""
	if status != statusSuspended {
		mid = newVersionID()
	}
	// A note is needed when a step follows the marker: the unlink of a
	// current object, or (Suspended) the null version's removal.
	var note []byte
	if cur != nil || mid == "" {
		note = deleteNote(cur)
	}
	if err := b.addMarker(r, bucket, key, mid, note); err != nil {
		undo()
		return "", err
	}
	if err := faultFS("delete marker made", key); err != nil {
		return "", err
	}
	if removed, err := b.deleteObject(r, bucket, key, pre); err != nil {
		// Once the object is unlinked the DELETE is in effect (the
		// version file is its only link): settleDeletes finishes it.
		if !removed {
			undo()
		}
		return "", err
	}
	if note != nil {
		if err := b.finishDelete(r, bucket, key, mid); err != nil {
			return "", err
		}
	}
	return showVersion(mid), nil
}

// finishDelete finishes a DELETE whose marker mid (with a note) is in
// effect: in Suspended mode (mid null) the non-current null version goes,
// then the marker's note.
func (b *Backend) finishDelete(r *os.Root, bucket, key, mid string) error {
	if mid == "" {
		if p := versionFile(key, ""); fileExists(r, p) {
			if err := b.removeVersionFile(r, bucket, p); err != nil {
				return err
			}
		}
	}
	if err := faultFS("delete finish note", key); err != nil {
		return err
	}
	p := markerFile(key, mid)
	f, err := r.OpenFile(p, os.O_WRONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("finish delete marker %s/%s: %w", bucket, p, err)
	}
	err = f.Truncate(0)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("finish delete marker %s/%s: %w", bucket, p, err)
	}
	return nil
}

// fileExists reports whether p exists in r.
func fileExists(r *os.Root, p string) bool {
	_, err := r.Lstat(p)
	return err == nil
}

// settleDeletes settles, under the key's lock, what a DELETE without a
// version id left when it stopped (a crash, an error) before it had
// finished: a marker written aside and never renamed into place goes; a
// delete marker whose note names the object the key still holds is
// undone (the marker goes, and the version file of the same inode that
// keepCurrent made); one whose object is gone is finished (finishDelete).
// Last, a version file that is the current object itself (dropKeptLink)
// goes.
func (b *Backend) settleDeletes(r *os.Root, bucket, key string) error {
	if err := b.settleMarkers(r, bucket, key); err != nil {
		return err
	}
	return b.dropKeptLink(r, bucket, key)
}

// dropKeptLink removes the version file of the current object's own id
// when it is the current object's file (the same inode): a link
// keepCurrent made for a write or DELETE that stopped before it replaced
// or unlinked the object and before a marker named it (a DELETE between
// keepCurrent and its marker's rename, a write before its rename). It is
// the same version, which listings show once (keyVersions) and DELETE
// ?versionId= removes with the object (replaceCurrent), but a second name
// of the object's file all the same: export refuses a file of two names
// (errHardLinked), and in sidecar mode, should the key's file be
// replaced behind S3 (the key's record, and so its version id, stays),
// the listing, which skips a version file of the current object's id,
// would hide the only copy of that version. The object keeps its name at
// the key, so nothing is lost. The common case costs a stat: a file of
// one name has no such link.
func (b *Backend) dropKeptLink(r *os.Root, bucket, key string) error {
	fi, err := r.Lstat(key)
	if err != nil || !fi.Mode().IsRegular() || statOf(fi).Nlink < 2 {
		return nil
	}
	o, err := b.openAny(r, bucket, key)
	if isNoSuchKey(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("settle deletes of %s/%s: %w", bucket, key, err)
	}
	defer o.f.Close()
	link := versionFile(key, o.versionID())
	li, err := r.Lstat(link)
	if err != nil || !li.Mode().IsRegular() || statOf(li).Ino != o.st.Ino {
		return nil
	}
	return b.removeVersionFile(r, bucket, link)
}

// settleMarkers is settleDeletes without dropKeptLink: the markers (and
// a marker written aside) a stopped DELETE left.
func (b *Backend) settleMarkers(r *os.Root, bucket, key string) error {
	vdir := versionsDir + "/" + key
	if aside := vdir + "/" + pendingMarker; fileExists(r, aside) {
		if err := r.Remove(aside); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s/%s: %w", bucket, aside, err)
		}
		_ = syncIn(r, vdir)
		pruneDirs(r, vdir)
	}
	vs, err := b.versionsOf(r, key)
	if err != nil {
		return err
	}
	for _, v := range vs {
		if !v.marker {
			continue
		}
		p := markerFile(key, v.id)
		fi, err := r.Lstat(p)
		if err != nil {
			continue
		}
		n, ok := readNote(r, p, fi.Size())
		if !ok {
			continue
		}
		if n.obj {
			o, err := b.openAny(r, bucket, key)
			if err != nil && !isNoSuchKey(err) {
				return err
			}
			if err == nil {
				same := n.names(o)
				o.f.Close()
				if same {
					// The DELETE stopped before its unlink: undone.
					want := n.vid
					if want == nullVersion {
						want = ""
					}
					link := versionFile(key, want)
					if li, err := r.Lstat(link); err == nil && li.Sys().(*syscall.Stat_t).Ino == n.ino {
						if err := b.removeVersionFile(r, bucket, link); err != nil {
							return err
						}
					}
					if err := b.removeVersionFile(r, bucket, p); err != nil {
						return err
					}
					continue
				}
			}
		}
		if err := b.finishDelete(r, bucket, key, v.id); err != nil {
			return err
		}
	}
	return nil
}

// deleteVersioned is DeleteObject on a bucket with versioning status
// status, or with a version id (vid, "" for none). It returns the version
// id to answer and whether it is a delete marker.
func (b *Backend) deleteVersioned(r *os.Root, bucket, key, vid, status string, pre *backend.ObjectDeletePreconditions) (string, bool, error) {
	if vid != "" && !validVersionID(vid) {
		return "", false, errInvalidVersion(vid)
	}
	if checkKey(key) != nil {
		return "", false, nil // not an object: nothing to delete
	}
	unlock, err := b.keyLock(bucket, key)
	if err != nil {
		return "", false, err
	}
	defer unlock()
	if vid == "" && status == "" {
		_, err := b.deleteObject(r, bucket, key, pre)
		return "", false, err
	}
	// What an earlier DELETE left unfinished is settled first.
	if err := b.settleDeletes(r, bucket, key); err != nil {
		return "", false, err
	}
	if vid == "" {
		// A delete marker becomes the latest version.
		mid, err := b.deleteMarker(r, bucket, key, status, pre)
		if err != nil {
			return "", false, err
		}
		return mid, true, nil
	}
	// A given version: the current object, a version file or a marker.
	want := vid
	if want == nullVersion {
		want = ""
	}
	marker, current := false, false
	if o, err := b.openAny(r, bucket, key); err == nil {
		o.f.Close()
		if o.versionID() == want {
			// The version it uncovers, if any, replaces it in one rename:
			// readers see the one object or the other, never none.
			if done, err := b.replaceCurrent(r, bucket, key, want, pre); done || err != nil {
				if err != nil {
					return "", false, err
				}
				return vid, false, nil
			}
			if _, err := b.deleteObject(r, bucket, key, pre); err != nil {
				return "", false, err
			}
			// A version file of the same id is a link to the file just
			// deleted, left by a write that kept it (keepCurrent) and
			// died before its rename: the same version, so it goes too,
			// or promote would make it current again.
			stale := versionFile(key, want)
			if _, err := r.Lstat(stale); err == nil {
				if err := b.removeVersionFile(r, bucket, stale); err != nil {
					return "", false, err
				}
			}
			return vid, false, b.promote(r, bucket, key, nil)
		}
		current = true
	} else if !isNoSuchKey(err) {
		return "", false, err
	}
	p := versionFile(key, want)
	if _, err := r.Lstat(p); err != nil {
		p = markerFile(key, want)
		if _, err := r.Lstat(p); err != nil {
			// No such version: nothing to delete (S3), but the record
			// of a version file deleted behind S3 goes.
			return vid, false, b.dropOrphanRecord(bucket, versionFile(key, want))
		}
		marker = true
	}
	if !current {
		if err := b.checkRestore(r, bucket, key, want, marker); err != nil {
			return "", false, err
		}
		if restoreChecked != nil {
			restoreChecked(bucket, key)
		}
		// The version the deletion uncovers (the newest one left, if it
		// is no delete marker) is renamed to the key first, and only then
		// is the deleted version or marker removed. A listing calls the
		// current object the latest whatever the versions beside it
		// (keyVersions) and GET serves it, so from the rename on both
		// agree on the uncovered version, the marker still listed as an
		// older entry; a crash between the two steps leaves that state,
		// and a retry of this DELETE, which then finds a current object,
		// only removes the marker. In the other order there is a moment
		// (or, after a crash, a state) with no current object and no
		// marker on top: GET answers NoSuchKey while the listing calls
		// the version the latest. If the restore fails (the key's path
		// was taken since checkRestore: a write of a longer key, under
		// its own lock, made it a directory, say), nothing has changed.
		if err := b.promote(r, bucket, key, &versionEntry{id: want, marker: marker}); err != nil {
			return "", false, err
		}
		if err := faultFS("version uncovered", key); err != nil {
			return "", false, err
		}
	}
	if err := b.removeVersionFile(r, bucket, p); err != nil {
		return "", false, err
	}
	return vid, marker, nil
}

// restoreChecked, when set (by tests), runs after a DELETE has found
// that the version it uncovers can be restored, before it deletes.
var restoreChecked func(bucket, key string)

// checkRestore is called before the version vid (a delete marker if
// marker) of key, which has no current object, is deleted: if the newest
// version left is not a delete marker, promote will make it the current
// object, and checkRestore fails — so that the DELETE changes nothing —
// when it could not: the key's path holds a directory of longer keys or
// a file written directly (PUT refuses both alike), or a file is where
// one of its directories would be. S3 knows no such conflicts; here an
// object and a directory of the same name cannot both exist.
func (b *Backend) checkRestore(r *os.Root, bucket, key, vid string, marker bool) error {
	vs, err := b.versionsOf(r, key)
	if err != nil {
		return err
	}
	i := 0
	for i < len(vs) && vs[i].id == vid && vs[i].marker == marker {
		i++
	}
	if i == len(vs) || vs[i].marker {
		return nil
	}
	return b.restorable(r, bucket, key)
}

// restorable says whether a version can be renamed to key: nothing may
// be there, and no file where key's directories are.
func (b *Backend) restorable(r *os.Root, bucket, key string) error {
	fi, err := r.Lstat(key)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case errors.Is(err, syscall.ENOTDIR):
		return errParentIsFile(bucket, key)
	case err != nil:
		return fmt.Errorf("restore %s/%s: %w", bucket, key, err)
	case fi.IsDir():
		return errKeyIsDirectory(bucket, key)
	default:
		return errUnexportedFile(bucket, key)
	}
}

// promote makes the newest remaining version of key the current object
// when there is no current object and that version is not a delete
// marker; checkRestore has made sure it can. gone, if not nil, is a
// version or marker about to be deleted: it does not count.
func (b *Backend) promote(r *os.Root, bucket, key string, gone *versionEntry) error {
	if o, err := b.openAny(r, bucket, key); err == nil {
		o.f.Close()
		return nil
	} else if !isNoSuchKey(err) {
		return err
	}
	vs, err := b.versionsOf(r, key)
	if err != nil {
		return err
	}
	if gone != nil {
		vs = slices.DeleteFunc(vs, func(v versionEntry) bool { return v.id == gone.id && v.marker == gone.marker })
	}
	if len(vs) == 0 || vs[0].marker {
		return nil
	}
	if err := b.restorable(r, bucket, key); err != nil {
		return err
	}
	o, err := b.openAny(r, bucket, versionFile(key, vs[0].id))
	if err != nil {
		if isNoSuchKey(err) {
			return nil // not a version basalt wrote: left alone
		}
		return err
	}
	defer o.f.Close()
	return b.restore(r, bucket, key, vs[0].id, o)
}

// replaceCurrent is a DELETE of the current object of key, version vid,
// when the newest of the key's other versions is no delete marker: that
// version's file is renamed over the current one, so that the key holds
// the deleted version until the rename and the uncovered one after it,
// even across a crash (a DELETE that removed the current file first and
// then restored the version left a moment, or after a crash a state,
// with no object at the key while the listing called the version the
// latest). The DELETE's conditions pre are checked first. done is false
// when there is no such version (or its file is not one basalt wrote):
// the caller then deletes the current object as usual.
func (b *Backend) replaceCurrent(r *os.Root, bucket, key, vid string, pre *backend.ObjectDeletePreconditions) (done bool, err error) {
	vs, err := b.versionsOf(r, key)
	if err != nil {
		return false, err
	}
	// A version file of the current object's own id is a link to it,
	// left by a write that kept it and died before its rename
	// (keepCurrent): not another version.
	vs = slices.DeleteFunc(vs, func(v versionEntry) bool { return !v.marker && v.id == vid })
	if len(vs) == 0 || vs[0].marker {
		return false, nil
	}
	next, err := b.openAny(r, bucket, versionFile(key, vs[0].id))
	if isNoSuchKey(err) {
		return false, nil // not a version basalt wrote: left alone
	}
	if err != nil {
		return false, err
	}
	defer next.f.Close()
	cur, why, err := b.inspect(r, bucket, key)
	if err != nil {
		return false, err
	}
	cur.f.Close()
	if err := deletePreconditions(bucket, key, cur.m, why, pre); err != nil {
		return false, err
	}
	// The stale link goes first: a crash after it leaves the current
	// object as it was, and promote must not find it later.
	stale := versionFile(key, vid)
	if _, err := r.Lstat(stale); err == nil {
		if err := b.removeVersionFile(r, bucket, stale); err != nil {
			return false, err
		}
	}
	return true, b.restore(r, bucket, key, vs[0].id, next)
}

// restore renames version vid of key (its version file, open as o) to
// key, over the current file if there is one (one rename: the key holds
// the one or the other), with the version's record.
func (b *Backend) restore(r *os.Root, bucket, key, vid string, o *object) error {
	vpath := versionFile(key, vid)
	m := o.m
	if o.bad != "" {
		var err error
		if m, err = b.markModified(o, bucket, vpath, vid); err != nil {
			return err
		}
	}
	dir, _ := splitKey(key)
	mkdir := func() error { return mkdirs(r, bucket, key, dir, sameOwner(r, o.f)) }
	if err := inDir(r, dir, func(bool) error { return mkdir() }); err != nil {
		return err
	}
	rec := *m
	rec.Key = ""
	err := b.meta.commit(bucket, key, &rec, func() error {
		// The key's directory is made again if a DELETE of another key
		// prunes it meanwhile (inDir).
		return inDir(r, dir, func(again bool) error {
			if again {
				if err := mkdir(); err != nil {
					return err
				}
			}
			if err := r.Rename(vpath, key); err != nil {
				return fmt.Errorf("restore %s/%s: %w", bucket, vpath, err)
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	// The version's own record (sidecar) is no longer needed.
	if err := b.meta.remove(bucket, vpath, func() error { return nil }); err != nil {
		return err
	}
	if err := syncIn(r, dir); err != nil {
		return err
	}
	vdir := path.Dir(vpath)
	_ = syncIn(r, vdir)
	pruneDirs(r, vdir)
	return nil
}

// versionEntry is one file in .basalt-versions/<key>/.
type versionEntry struct {
	id     string // "" for null
	marker bool
	stamp  int64 // ns: from the id, or the file's (record's) mtime for null
}

// versionStamp orders versions: the time in the id, or mtime for null.
func versionStamp(id string, mtime int64) int64 {
	if id == "" {
		return mtime
	}
	n, err := strconv.ParseUint(id[:16], 16, 64)
	if err != nil {
		return 0
	}
	return int64(n)
}

// versionsOf lists the non-current versions and delete markers of key,
// newest first.
func (b *Backend) versionsOf(r *os.Root, key string) ([]versionEntry, error) {
	ents, err := fs.ReadDir(r.FS(), versionsDir+"/"+key)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []versionEntry
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		name, marker, ok := parseVersionName(e.Name())
		if !ok {
			continue
		}
		v := versionEntry{marker: marker}
		if name != nullVersion {
			v.id = name
		}
		var mtime int64
		if v.id == "" {
			if fi, err := e.Info(); err == nil {
				mtime = fi.Sys().(*syscall.Stat_t).Mtim.Nano()
			}
		}
		v.stamp = versionStamp(v.id, mtime)
		out = append(out, v)
	}
	sortVersions(out)
	return out, nil
}

func sortVersions(vs []versionEntry) {
	slices.SortStableFunc(vs, func(a, b versionEntry) int {
		if a.stamp != b.stamp {
			if a.stamp > b.stamp {
				return -1
			}
			return 1
		}
		return strings.Compare(b.id, a.id)
	})
}

// openVersion opens version vid ("" for the current object) of
// bucket/key to serve it (GET, HEAD, a copy's source): its file must be
// one the bucket's owner may read (ownerMayRead), and then match its
// record (else ObjectModifiedOutsideS3). In that order: the answer for a
// file the owner may not read must not say how it changed (its size or
// mtime), as a listing does not (listDenied).
func (b *Backend) openVersion(r *os.Root, bucket, key, vid string) (*object, error) {
	o, name, why, err := b.findVersion(r, bucket, key, vid)
	if err != nil {
		return nil, err
	}
	if err := ownerMayRead(r, bucket, key, name, o.st); err != nil {
		o.f.Close()
		return nil, err
	}
	if why != "" {
		o.f.Close()
		return nil, errModified(bucket, name, why)
	}
	return o, nil
}

// findVersion opens version vid ("" for the current object) of
// bucket/key, says at which path of the bucket it found it, and how the
// file differs from its record (inspect).
func (b *Backend) findVersion(r *os.Root, bucket, key, vid string) (*object, string, string, error) {
	if vid == "" {
		o, why, err := b.inspect(r, bucket, key)
		return o, key, why, err
	}
	if !validVersionID(vid) {
		return nil, "", "", errInvalidVersion(vid)
	}
	want := vid
	if want == nullVersion {
		want = ""
	}
	o, why, err := b.inspect(r, bucket, key)
	var cur *object // the current object, if it is not the version asked for
	if err == nil {
		if o.versionID() == want {
			return o, key, why, nil
		}
		cur = o
		defer cur.f.Close()
	} else if !isNoSuchKey(err) {
		return nil, "", "", err
	}
	vf := versionFile(key, want)
	o, why, err = b.inspect(r, bucket, vf)
	if err == nil {
		return o, vf, why, nil
	}
	if !isNoSuchKey(err) {
		return nil, "", "", err
	}
	if _, merr := r.Lstat(markerFile(key, want)); merr == nil {
		// The marker of a DELETE that has not unlinked the object the
		// key still holds is no version (the listing leaves it out, and
		// the next request on the key removes it): as if it did not
		// exist, not the 405 of a delete marker.
		if cur == nil || !markerPending(r, key, want, cur) {
			return nil, "", "", s3err.GetAPIError(s3err.ErrMethodNotAllowed)
		}
	}
	return nil, "", "", s3err.GetNoSuchVersionErr(key, vid)
}

// ListObjectVersions lists the current objects (IsLatest), their
// versions newest first, and delete markers, by key. It reads every key
// under the prefix before answering a page.
func (b *Backend) ListObjectVersions(ctx context.Context, in *s3.ListObjectVersionsInput) (s3response.ListVersionsResult, error) {
	out, err := b.listVersions(ctx, in)
	if err == nil && urlEncoding(ctx, in.EncodingType) {
		// As ListObjects: the names, URL-encoded (version ids need none).
		out.EncodingType = types.EncodingTypeUrl
		for i := range out.Versions {
			out.Versions[i].Key = ptr(encodeName(*out.Versions[i].Key))
		}
		for i := range out.DeleteMarkers {
			out.DeleteMarkers[i].Key = ptr(encodeName(*out.DeleteMarkers[i].Key))
		}
		encodeNames(nil, out.CommonPrefixes, out.Prefix, out.Delimiter, out.KeyMarker, out.NextKeyMarker)
	}
	return out, err
}

// listVersions is ListObjectVersions but for the names' encoding.
func (b *Backend) listVersions(ctx context.Context, in *s3.ListObjectVersionsInput) (s3response.ListVersionsResult, error) {
	bucket, prefix, delim := str(in.Bucket), str(in.Prefix), str(in.Delimiter)
	keyMarker, vidMarker := str(in.KeyMarker), str(in.VersionIdMarker)
	maxk := maxKeys(in.MaxKeys)
	r, err := b.openBucket(bucket)
	if err != nil {
		return s3response.ListVersionsResult{}, err
	}
	defer r.Close()
	out := s3response.ListVersionsResult{Name: &bucket, Prefix: &prefix, Delimiter: &delim, MaxKeys: &maxk,
		KeyMarker: &keyMarker, VersionIdMarker: &vidMarker}
	truncated := false
	if maxk == 0 {
		// An empty page, not truncated: one truncated without a next
		// marker would have paginators ask again forever.
		out.IsTruncated = &truncated
		return out, nil
	}
	keys, err := b.versionedKeys(ctx, r, prefix)
	if err != nil {
		return s3response.ListVersionsResult{}, err
	}
	// Files are opened through dirChains (listEntry): one for the current
	// objects, one for the version files, as the keys' order walks both
	// trees at once.
	cur, err := openChain(r)
	if err != nil {
		return s3response.ListVersionsResult{}, err
	}
	defer cur.close()
	old, err := openChain(r)
	if err != nil {
		return s3response.ListVersionsResult{}, err
	}
	defer old.close()
	count := int32(0)
	lastKey, lastVid := "", ""
	seenCP := map[string]bool{}
	full := func() bool { return count >= maxk }
	for _, key := range keys {
		if keyMarker != "" && (key < keyMarker || key == keyMarker && vidMarker == "") {
			continue
		}
		if delim != "" {
			if i := strings.Index(key[len(prefix):], delim); i >= 0 {
				cp := key[:len(prefix)+i+len(delim)]
				// The common prefix that ended the previous page (its
				// key-marker) is not listed again. Only that one: a
				// key-marker that merely ends with the delimiter may be
				// a key listed as a key (prefix "2024-", key "2024-"),
				// after which its older versions and the keys it
				// prefixes follow.
				if seenCP[cp] || cp == keyMarker {
					continue
				}
				if full() {
					truncated = true
					break
				}
				seenCP[cp] = true
				out.CommonPrefixes = append(out.CommonPrefixes, types.CommonPrefix{Prefix: ptr(cp)})
				count++
				lastKey, lastVid = cp, ""
				continue
			}
		}
		vers, err := b.keyVersions(r, bucket, key, cur, old)
		if err != nil {
			return s3response.ListVersionsResult{}, err
		}
		if key == keyMarker && vidMarker != "" {
			vers = vers[pageStart(vers, vidMarker):]
		}
		for _, v := range vers {
			if full() {
				truncated = true
				break
			}
			if v.ver != nil {
				out.Versions = append(out.Versions, *v.ver)
				lastVid = *v.ver.VersionId
			} else {
				out.DeleteMarkers = append(out.DeleteMarkers, *v.mark)
				lastVid = *v.mark.VersionId
			}
			lastKey = key
			count++
		}
		if truncated {
			break
		}
	}
	out.IsTruncated = &truncated
	if truncated {
		out.NextKeyMarker = ptr(lastKey)
		if lastVid != "" {
			out.NextVersionIdMarker = ptr(lastVid)
		}
	}
	return out, nil
}

// listedVersion is a version or a delete marker of a listing.
type listedVersion struct {
	ver   *s3response.ObjectVersion
	mark  *types.DeleteMarkerEntry
	id    string // "" for null
	stamp int64  // its place in the order (versionStamp)
}

// pageStart returns the index in vers (one key's entries in listing
// order, keyVersions) of the first entry after the version id marker vid
// (as S3 shows it). That is the entry after the marker's own if it is
// still there. If it is gone (deleted between two pages), it is the first
// entry that did not come before the marker's place: non-current entries
// are ordered by stamp, newest first, then by id descending
// (sortVersions), and the stamp of an id is the clock in its first 16
// digits (versionStamp; a current object, listed first, is normally the
// newest). So nothing is skipped; an entry may be listed again only if
// the current object is older than the marker was (a PUT published after
// a concurrent one that drew a later id). The place of a gone null
// version is unknown (its stamp was its file's mtime): the key's entries
// are listed from the first.
func pageStart(vers []listedVersion, vid string) int {
	for i, v := range vers {
		if showVersion(v.id) == vid {
			return i + 1
		}
	}
	if vid == nullVersion || !validVersionID(vid) {
		return 0
	}
	stamp := versionStamp(vid, 0)
	for i, v := range vers {
		if v.stamp < stamp || v.stamp == stamp && v.id < vid {
			return i
		}
	}
	return len(vers)
}

// keyVersions returns key's current object and versions, newest first,
// the first one marked IsLatest. It opens the current object through cur
// and the version files through old (listEntry).
func (b *Backend) keyVersions(r *os.Root, bucket, key string, cur, old *dirChain) ([]listedVersion, error) {
	var out []listedVersion
	k := key
	describe := func(c *dirChain, p, vid string) *s3response.ObjectVersion {
		o, why, err := b.inspect(c, bucket, p)
		if err != nil {
			if !isNoSuchKey(err) {
				b.log.Warn("version listing skips a file", "bucket", bucket, "path", p, "err", err)
			}
			return nil
		}
		defer o.f.Close()
		f := false
		v := &s3response.ObjectVersion{Key: &k, VersionId: ptr(showVersion(vid)), IsLatest: &f}
		denied, ok := b.listDenied(c, bucket, p, o.st)
		if !ok {
			return nil
		}
		if denied {
			v.Size, v.LastModified = ptr(int64(0)), ptr(deniedTime)
			v.StorageClass = types.ObjectVersionStorageClass(storageClassDenied)
			return v
		}
		if why != "" {
			size, mtime := o.st.Size, time.Unix(0, o.st.Mtim.Nano()).UTC()
			v.Size, v.LastModified = &size, &mtime
			v.StorageClass = types.ObjectVersionStorageClass(storageClassModified)
			return v
		}
		size, mtime := o.m.Size, o.m.mtime().UTC()
		v.Size, v.LastModified, v.ETag = &size, &mtime, ptr(o.m.ETag)
		v.StorageClass = types.ObjectVersionStorageClassStandard
		if o.m.Checksum != nil {
			v.ChecksumAlgorithm = []types.ChecksumAlgorithm{o.m.Checksum.Algorithm}
			v.ChecksumType = o.m.Checksum.Type
		}
		return v
	}
	curID, hasCur := "", false
	var curObj *object
	if o, err := b.openAny(cur, bucket, key); err == nil {
		o.f.Close()
		vid := o.versionID()
		curID, hasCur, curObj = vid, true, o
		if v := describe(cur, key, vid); v != nil {
			out = append(out, listedVersion{ver: v, id: vid, stamp: versionStamp(vid, o.st.Mtim.Nano())})
		}
	}
	vs, err := b.versionsOf(r, key)
	if err != nil {
		return nil, err
	}
	for _, e := range vs {
		if hasCur && !e.marker && e.id == curID {
			// A link to the current object that a write kept before it
			// died (keepCurrent, then a crash before its rename): the
			// same version, listed once.
			continue
		}
		if e.marker {
			f := false
			m := &types.DeleteMarkerEntry{Key: &k, VersionId: ptr(showVersion(e.id)), IsLatest: &f}
			if fi, err := r.Lstat(markerFile(key, e.id)); err == nil {
				if hasCur && markerPending(r, key, e.id, curObj) {
					continue // its DELETE has not unlinked the current object
				}
				t := fi.ModTime().UTC()
				m.LastModified = &t
			}
			out = append(out, listedVersion{mark: m, id: e.id, stamp: e.stamp})
			continue
		}
		if v := describe(old, versionFile(key, e.id), e.id); v != nil {
			out = append(out, listedVersion{ver: v, id: e.id, stamp: e.stamp})
		}
	}
	if len(out) > 0 {
		t := true
		if out[0].ver != nil {
			out[0].ver.IsLatest = &t
		} else {
			out[0].mark.IsLatest = &t
		}
	}
	return out, nil
}

// versionedKeys returns, sorted, the keys under prefix that have a
// current object or a version file.
func (b *Backend) versionedKeys(ctx context.Context, r *os.Root, prefix string) ([]string, error) {
	set := map[string]bool{}
	fsys := r.FS()
	// compatible: a directory d (a key prefix) may hold keys under prefix.
	compatible := func(d string) bool {
		d += "/"
		return strings.HasPrefix(prefix, d) || strings.HasPrefix(d, prefix)
	}
	walk := func(base string, add func(p string, d fs.DirEntry)) error {
		err := fs.WalkDir(fsys, base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == base && errors.Is(err, fs.ErrNotExist) {
					return fs.SkipAll
				}
				b.log.Warn("version listing skips a directory", "path", p, "err", err)
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			rel := p
			if base != "." {
				rel = strings.TrimPrefix(strings.TrimPrefix(p, base), "/")
			}
			if d.IsDir() {
				if p == base {
					return nil
				}
				if base == "." && strings.HasPrefix(d.Name(), reservedPrefix) {
					return fs.SkipDir
				}
				if !compatible(rel) {
					return fs.SkipDir
				}
				return nil
			}
			add(rel, d)
			return nil
		})
		return err
	}
	err := walk(".", func(p string, d fs.DirEntry) {
		if d.Type().IsRegular() && strings.HasPrefix(p, prefix) && checkKey(p) == nil {
			set[p] = true
		}
	})
	if err != nil {
		return nil, err
	}
	err = walk(versionsDir, func(p string, d fs.DirEntry) {
		if !d.Type().IsRegular() {
			return
		}
		if key, _, _, ok := parseVersionPath(versionsDir + "/" + p); ok && strings.HasPrefix(key, prefix) {
			set[key] = true
		}
	})
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys, nil
}

// settlePendingMarkers settles (settleDeletes, under the key's lock) each
// key whose version directory holds a marker a DELETE wrote aside
// (pendingMarker) and, stopped by a crash or an error, never renamed into
// place. Such a file is no version, but DeleteBucket cannot remove a
// directory that holds it; settleDeletes removes it, as the next request
// on the key would. The walk stops at the first real version or delete
// marker, and then settles nothing: the bucket is not empty anyway. The
// caller holds bucketLock exclusively.
func (b *Backend) settlePendingMarkers(r *os.Root, bucket string) error {
	var keys []string
	versions := false
	err := fs.WalkDir(r.FS(), versionsDir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // no versions, or a directory pruned meanwhile
		}
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if d.Name() != pendingMarker {
			versions = true
			return fs.SkipAll
		}
		if key := strings.TrimPrefix(path.Dir(p), versionsDir+"/"); checkKey(key) == nil {
			keys = append(keys, key)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("look for unfinished deletes in %s: %w", bucket, err)
	}
	if versions {
		return nil
	}
	for _, key := range keys {
		unlock, err := b.keyLock(bucket, key)
		if err != nil {
			return fmt.Errorf("settle deletes of %s/%s: %w", bucket, key, err)
		}
		err = b.settleDeletes(r, bucket, key)
		unlock()
		if err != nil {
			return fmt.Errorf("settle deletes of %s/%s: %w", bucket, key, err)
		}
	}
	return nil
}

// hasVersions reports whether the bucket holds any non-current version
// or delete marker.
func hasVersions(r *os.Root) bool {
	found := false
	_ = fs.WalkDir(r.FS(), versionsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if !d.IsDir() {
			found = true
			return fs.SkipAll
		}
		return nil
	})
	return found
}
