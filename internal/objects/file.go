package objects

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/versity/versitygw/s3err"
	"golang.org/x/sys/unix"
)

// createTemp creates a file in Work/tmp for an object being written.
func (b *Backend) createTemp() (*os.File, error) {
	f, err := os.CreateTemp(b.tmp, "obj-*")
	if err != nil {
		return nil, fmt.Errorf("create temp file: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return f, nil
}

// discard closes and removes a temp file.
func discard(f *os.File) {
	f.Close()
	os.Remove(f.Name())
}

// splitKey returns key's directory ("." for none) and base name.
func splitKey(key string) (dir, base string) {
	dir, base = path.Split(key)
	if dir == "" {
		return ".", base
	}
	return dir[:len(dir)-1], base
}

func errParentIsFile(bucket, key string) error {
	return s3err.APIError{
		Code: "ObjectParentIsFile",
		Description: fmt.Sprintf("Cannot store %s/%s: a prefix of the key is a file (an object and a \"directory\" "+
			"of the same name cannot both exist here).", bucket, key),
		HTTPStatusCode: http.StatusConflict,
	}
}

func errKeyIsDirectory(bucket, key string) error {
	return s3err.APIError{
		Code: "ExistingObjectIsDirectory",
		Description: fmt.Sprintf("Cannot store %s/%s: the key names a directory (other objects have it as a prefix).",
			bucket, key),
		HTTPStatusCode: http.StatusConflict,
	}
}

// mkdirs creates dir (of key) and its missing ancestors inside r, made
// durable by makeDirs; a file on the way is ObjectParentIsFile. created,
// if not nil, is called with each directory it created.
func mkdirs(r *os.Root, bucket, key, dir string, created func(string) error) error {
	err := makeDirs(r, dir, created)
	if errors.Is(err, syscall.ENOTDIR) {
		return errParentIsFile(bucket, key)
	}
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bucket, err)
	}
	return nil
}

// dirMaker is where makeDirs works: an *os.Root (a bucket), or the
// directory tree below an absolute path (under).
type dirMaker interface {
	Mkdir(name string, perm fs.FileMode) error
	Open(name string) (*os.File, error)
	Name() string // the tree's own path: where durableDirs files its entries
}

// under is the dirMaker of the tree below an absolute directory.
type under string

func (u under) Mkdir(name string, perm fs.FileMode) error {
	return os.Mkdir(filepath.Join(string(u), name), perm)
}

func (u under) Open(name string) (*os.File, error) { return os.Open(filepath.Join(string(u), name)) }

func (u under) Name() string { return string(u) }

// durableDirs holds the directories (tree path + "/" + dir) this process
// has made durable — created or found, each parent synced — so that a PUT
// into a known prefix syncs no directory it did not change (an fsync with
// nothing to write still flushes the device cache on ext4). An entry may
// outlive its directory: one removed through this process (pruneDirs, a
// bucket's deletion) is forgotten there; one removed otherwise (another
// gateway's prune, a user) is found missing by makeDirs, which then
// forgets the tree's entries and takes the slow path. (A directory another
// gateway removes and creates again between two of this process's writes
// is trusted without a sync: on journaling file systems the fsync of the
// write's own directory commits that creation too.)
var durableDirs sync.Map

// forgetDirs drops the durableDirs entries of dir (a tree path joined
// with a directory in it) and of everything below it. It reads the whole
// map: for removals of whole trees (a bucket), not for each object.
func forgetDirs(dir string) {
	durableDirs.Range(func(k, _ any) bool {
		if s := k.(string); s == dir || strings.HasPrefix(s, dir+"/") {
			durableDirs.Delete(k)
		}
		return true
	})
}

// makeDirs creates dir (slash-separated, relative to d; "." is d itself)
// and its missing ancestors, and fsyncs the parent of every component,
// in order from the top — of those that existed too: another writer
// (another request, another gateway) may have created one a moment ago
// and not yet synced its parent, and nothing stored below it may be
// acknowledged before it is durable. A directory this process made
// durable before is only checked (durableDirs). A component that is a file
// fails with ENOTDIR or EEXIST. created, if not nil, is called with each
// directory this call created, before its parent is synced.
func makeDirs(d dirMaker, dir string, created func(string) error) error {
	if dir == "." || dir == "" {
		return nil
	}
	tree := d.Name()
	if _, ok := durableDirs.Load(tree + "/" + dir); ok {
		if isDirIn(d, dir) == nil {
			return nil
		}
		forgetDirs(tree + "/" + dir) // removed behind this process: start over
	}
	for i := 0; i <= len(dir); i++ {
		if i < len(dir) && dir[i] != '/' {
			continue
		}
		cur := dir[:i]
		err := d.Mkdir(cur, 0o755)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create directory %s: %w", cur, err)
		}
		if err == nil && created != nil {
			if err := created(cur); err != nil {
				return err
			}
		}
		parent := path.Dir(cur)
		f, err := d.Open(parent)
		if err != nil {
			return fmt.Errorf("sync directory %s: %w", parent, err)
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("sync directory %s: %w", parent, err)
		}
		traceFS("sync parent", cur)
	}
	// The last component may exist as a file (Mkdir said EEXIST).
	if err := isDirIn(d, dir); err != nil {
		return err
	}
	for i := 0; i <= len(dir); i++ {
		if i == len(dir) || dir[i] == '/' {
			durableDirs.Store(tree+"/"+dir[:i], struct{}{})
		}
	}
	return nil
}

// isDirIn checks that dir in d is a directory.
func isDirIn(d dirMaker, dir string) error {
	f, err := d.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.IsDir() {
		return fmt.Errorf("open directory %s: %w", dir, syscall.ENOTDIR)
	}
	return nil
}

// syncIn fsyncs directory dir inside r.
func syncIn(r *os.Root, dir string) error {
	d, err := r.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// dirRetries bounds how often a write makes the directory it needs again
// after finding it gone (inDir).
const dirRetries = 8

// forgetDir drops the durableDirs entries of dir (slash-separated, in the
// tree named tree) and of its ancestors: one of them was found gone.
func forgetDir(tree, dir string) {
	for i := 0; i <= len(dir); i++ {
		if i == len(dir) || dir[i] == '/' {
			durableDirs.Delete(tree + "/" + dir[:i])
		}
	}
}

// inDir runs step, which creates directory dir of r (mkdirs) if again is
// set and then uses it. A DELETE of the last object below dir removes it
// (pruneDirs) at any moment the directory is empty, so between a write's
// mkdirs and the rename, link or create that fills it, the directory (or
// an ancestor) may be gone: step then fails with ENOENT, and inDir
// forgets what it knew of dir and runs step again with again set, at
// most dirRetries times.
func inDir(r *os.Root, dir string, step func(again bool) error) error {
	err := step(false)
	for i := 0; i < dirRetries && errors.Is(err, fs.ErrNotExist); i++ {
		forgetDir(r.Name(), dir)
		err = step(true)
	}
	return err
}

// publish renames the temp file tmp (in Work/tmp) to bucket/key inside r
// through m (which publishes the metadata record with it) and fsyncs the
// directory. tmp must be synced. The key's directory is made again if a
// DELETE removes it meanwhile (inDir). renamed reports whether the rename
// happened, also when a later step failed: the object it replaced is then
// gone from the key.
func (b *Backend) publish(r *os.Root, bucket, key string, tmp *os.File, m *objectMeta) (renamed bool, err error) {
	dir, base := splitKey(key)
	var parent *os.File
	defer func() {
		if parent != nil {
			parent.Close()
		}
	}()
	// openParent makes the key's directory and opens it.
	openParent := func(bool) error {
		if parent != nil {
			parent.Close()
			parent = nil
		}
		if err := mkdirs(r, bucket, key, dir, sameOwner(r, tmp)); err != nil {
			return err
		}
		d, err := r.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY, 0)
		if errors.Is(err, syscall.ENOTDIR) {
			return errParentIsFile(bucket, key)
		}
		if err != nil {
			return fmt.Errorf("open directory of %s/%s: %w", bucket, key, err)
		}
		parent = d
		return nil
	}
	if err := inDir(r, dir, openParent); err != nil {
		return false, err
	}
	// The object being replaced stays open until after the rename: the
	// rename then only unlinks it, and the inode is freed (its blocks
	// truncated and, on a file system mounted with discard, discarded)
	// when we close it — outside the directory locks the rename holds,
	// which on Linux include a file-system-wide one for renames between
	// directories. Freed while they are held, every concurrent PUT waits.
	old, err := b.refuseUnexported(r, bucket, key)
	if err != nil {
		return false, err
	}
	defer b.release(old)
	tmpName := filepath.Base(tmp.Name())
	unpend := func() {}
	if _, ok := b.meta.(*sidecarMeta); ok {
		// The record names the file until the rename takes it away: a
		// crash in between leaves a record that is not in force, which
		// the next start undoes (sidecarMeta.undoUnfinished).
		pending := pendingName(bucket, key)
		if err := b.renameTemp(tmpName, pending); err != nil {
			return false, fmt.Errorf("publish %s/%s: %w", bucket, key, err)
		}
		orig := tmpName
		tmpName, m.Tmp = pending, pending
		defer func() { m.Tmp = "" }()
		// Not deferred: a crash runs no deferred function, and a test
		// crashes a write by a panic.
		unpend = func() {
			if !renamed {
				// Back to the name the caller removes it by.
				_ = b.renameTemp(pending, orig)
			}
		}
	}
	err = b.meta.commit(bucket, key, m, func() error {
		return inDir(r, dir, func(again bool) error {
			if again {
				if err := openParent(again); err != nil {
					return err
				}
			}
			hookStep("publish rename", key)
			var rerr, perr error
			err := rawFd(b.tmpDir, func(from int) {
				perr = rawFd(parent, func(to int) { rerr = unix.Renameat(from, tmpName, to, base) })
			})
			err = errors.Join(err, perr, rerr)
			switch {
			case errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST):
				return errKeyIsDirectory(bucket, key)
			case err != nil:
				// ENOENT: the directory was removed after it was opened.
				return fmt.Errorf("publish %s/%s: %w", bucket, key, err)
			}
			renamed = true
			return nil
		})
	})
	if err != nil {
		unpend()
		return renamed, err
	}
	traceFS("rename", key)
	if err := faultFS("sync dir", dir); err != nil {
		return true, err
	}
	if err := parent.Sync(); err != nil {
		return true, err
	}
	traceFS("sync dir", dir)
	return true, nil
}

// renameTemp renames the file from to to, both in Work/tmp.
func (b *Backend) renameTemp(from, to string) error {
	var rerr error
	err := rawFd(b.tmpDir, func(fd int) { rerr = unix.Renameat(fd, from, fd, to) })
	return errors.Join(err, rerr)
}

// refuseUnexported fails when bucket/key is a regular file without basalt
// metadata: S3 writes never replace what users put there directly. An
// object changed behind S3 (its record invalid included) is replaced. It
// returns the object there, open (nil if there is none), for release.
func (b *Backend) refuseUnexported(r *os.Root, bucket, key string) (*os.File, error) {
	fi, err := r.Lstat(key)
	if err != nil || !fi.Mode().IsRegular() {
		return nil, nil // nothing there, or something the rename refuses anyway
	}
	o, err := b.openAny(r, bucket, key)
	if err == nil {
		return o.f, nil
	}
	if isNoSuchKey(err) {
		return nil, errUnexportedFile(bucket, key)
	}
	return nil, err
}

// release closes f (nil: nothing) off the request path when it can: the
// last close of a replaced object frees its inode, which on file systems
// that discard freed blocks synchronously takes a device round trip. At
// most cap(b.closing) closes run in the background; beyond that the
// caller closes (so a burst of overwrites cannot pile up threads).
func (b *Backend) release(f *os.File) {
	if f == nil {
		return
	}
	select {
	case b.closing <- struct{}{}:
		b.closers.Add(1)
		go func() {
			defer b.closers.Done()
			f.Close()
			traceFS("release", f.Name())
			<-b.closing
		}()
	default:
		f.Close()
		traceFS("release", f.Name())
	}
}

// fsTrace, when set (tests), is told of the steps that make a write
// durable, as they complete: "sync file" (the temp file's data and
// record), "sync parent" (the parent of a directory the write needs, by
// the directory's name relative to its tree: see makeDirs), "rename"
// (published), "sync dir" (the rename made durable), "release" (the
// replaced object closed); and "part" (UploadPart renamed a part's bytes
// into its upload directory, by the file's name; its record follows).
// (Atomic: a request's goroutine may still trace after the test that
// set it has ended and cleared it.)
var fsTrace atomic.Pointer[func(op, name string)]

func traceFS(op, name string) {
	if f := fsTrace.Load(); f != nil {
		(*f)(op, name)
	}
}

// stepHook, when set (tests), is told of steps at which tests make
// another request land, or a crash happen ("create upload":
// CreateMultipartUpload about to make its directory; "complete part":
// Complete about to open a part's file; "publish rename": a write about
// to rename its object into place, its record written). fsTrace, by
// contrast, traces the steps that make writes durable.
var stepHook atomic.Pointer[func(op, name string)]

func hookStep(op, name string) {
	if f := stepHook.Load(); f != nil {
		(*f)(op, name)
	}
}

// fsFault, when set (tests), fails steps that come after a write's or a
// delete's change is made: it is asked before "sync dir" in publish
// (after the rename) and before "delete sync dir" in deleteObject (after
// the unlink), and an error it returns is that step's. A versioned
// DELETE also asks it at "delete version kept" (deleteMarker: the
// current object linked to its version file, no marker made yet),
// "delete marker made" (the marker in place, the current object not yet
// removed), "delete finish note" (finishDelete: all done but clearing
// the marker's note) and "version uncovered" (DELETE ?versionId=: the
// uncovered version restored, the deleted one not yet removed); an
// error there stops the DELETE as a crash would.
var fsFault atomic.Pointer[func(op, name string) error]

func faultFS(op, name string) error {
	if f := fsFault.Load(); f != nil {
		return (*f)(op, name)
	}
	return nil
}

// pruneDirs removes the now empty directories from dir up to (not
// including) the bucket directory, fsyncing each parent.
func pruneDirs(r *os.Root, dir string) {
	for dir != "." && dir != "" {
		fi, err := r.Lstat(dir)
		if err != nil || !fi.IsDir() {
			return
		}
		if err := r.Remove(dir); err != nil {
			return
		}
		durableDirs.Delete(r.Name() + "/" + dir) // empty: nothing below it is known
		dir = path.Dir(dir)
		_ = syncIn(r, dir)
	}
}
