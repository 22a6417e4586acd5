// Package store owns the data root (--store): the directory tree on the
// site's file system that holds volume data.
//
// Layout (documented in docs/formats.md):
//
//	STORE/volumes/<id>/      a volume's stack directory: layer metadata of
//	                         the layers above cow (cow.sb, checksum.meta...)
//	STORE/images/<image>/    a copy-on-write image: its own layer stack's
//	                         files (data.img, legs...), alloc.map, image.sb
//	STORE/tmp/               scratch (health checks, type validation)
//	STORE/buckets/<bucket>/  S3 objects as plain files (package objects)
//	STORE/objects/           the object store's own scratch: uploads being
//	                         written, multipart parts, metadata sidecars
//
// Which images are live is decided by package cow (Collect); this package
// only names places and answers for the file system as a whole.
package store

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/basalt-storage/basalt/internal/block"
	"golang.org/x/sys/unix"
)

// Store is a data root.
type Store struct {
	Root string
	// ID is the store's id (MarkerFile), once the node has checked it
	// against the cluster's; Check then finds the marker still there.
	ID string

	probeMu sync.Mutex
	probing *probe // the Check under way for Probe, if any
}

// Open creates the layout under root if needed.
func Open(root string) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"volumes", "images", "tmp", "buckets", "objects"} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o755); err != nil {
			return nil, fmt.Errorf("store %s: %w", abs, err)
		}
	}
	return &Store{Root: abs}, nil
}

// VolumeDir is volume id's stack directory.
func (s *Store) VolumeDir(id string) string { return filepath.Join(s.Root, "volumes", id) }

// ImagesDir holds every copy-on-write image.
func (s *Store) ImagesDir() string { return filepath.Join(s.Root, "images") }

// TempDir is scratch space on the store's file system.
func (s *Store) TempDir() string { return filepath.Join(s.Root, "tmp") }

// BucketsDir holds one directory per S3 bucket.
func (s *Store) BucketsDir() string { return filepath.Join(s.Root, "buckets") }

// ObjectsDir is the object store's scratch, on the same file system as
// the buckets so that finished uploads are renamed into place.
func (s *Store) ObjectsDir() string { return filepath.Join(s.Root, "objects") }

// RemoveVolume deletes volume id's stack directory; a missing one is not an
// error (deletes are retried).
//
// id must name one entry of volumes/: RemoveAll of an id that is empty,
// "." or "..", or holds a separator, would take every volume, the images
// or the whole store with it (VolumeDir cleans the path).
func (s *Store) RemoveVolume(id string) error {
	if id == "" || id == "." || id == ".." || strings.ContainsRune(id, filepath.Separator) {
		return fmt.Errorf("remove volume %q: not a volume id", id)
	}
	if err := os.RemoveAll(s.VolumeDir(id)); err != nil {
		return fmt.Errorf("remove volume %s: %w", id, err)
	}
	return block.SyncDir(filepath.Join(s.Root, "volumes"))
}

// Capacity is the size of the file system under the store.
type Capacity struct {
	TotalBytes int64 `json:"total_bytes"`
	FreeBytes  int64 `json:"free_bytes"`
}

// Capacity reads the file system's size and free space.
func (s *Store) Capacity() (Capacity, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.Root, &st); err != nil {
		return Capacity{}, fmt.Errorf("statfs %s: %w", s.Root, err)
	}
	// Block counts are in fragments (f_frsize, as statvfs and df read
	// them); f_bsize is only the preferred I/O size, which differs on
	// some file systems (NFS, FUSE). Kernels before 2.6 left frsize 0.
	unit := int64(st.Frsize)
	if unit == 0 {
		unit = int64(st.Bsize)
	}
	return Capacity{
		TotalBytes: int64(st.Blocks) * unit,
		FreeBytes:  int64(st.Bavail) * unit,
	}, nil
}

// Check proves the store is usable: it exists, is a directory, still
// holds its marker (a shared file system unmounted under a running node
// leaves the mount point, without it) and accepts a synced write.
//
// The probe file is one of this check's own: every node checks the one
// shared store (and a node may run several checks at once), and with one
// fixed name a check removed another's file under it and failed.
func (s *Store) Check() error {
	if s.ID != "" {
		m, ok, err := ReadMarker(s.Root)
		switch {
		case err != nil:
			return err
		case !ok:
			return fmt.Errorf("store %s: its marker %s is gone: is the store's file system still mounted?", s.Root, MarkerFile)
		case m.ID != s.ID:
			return fmt.Errorf("store %s: its marker names store %s, not %s, the one this node opened", s.Root, m.ID, s.ID)
		}
	}
	f, err := os.CreateTemp(filepath.Join(s.Root, "tmp"), ".health-*")
	if err != nil {
		return fmt.Errorf("store %s not writable: %w", s.Root, err)
	}
	_, err = f.Write([]byte("ok"))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if rerr := os.Remove(f.Name()); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("store %s not writable: %w", s.Root, err)
	}
	return nil
}
