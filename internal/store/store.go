// Package store owns the data root (--store): the directory tree on the
// site's file system that holds volume and snapshot data as sparse files.
//
// Layout (documented in docs/formats.md):
//
//	STORE/volumes/<id>.img     a volume's bytes, sparse
//	STORE/snapshots/<id>.img   a snapshot's bytes, sparse, never written after creation
//	STORE/tmp/                 files being built; renamed into place when complete
//
// Invariants: a file under volumes/ or snapshots/ is complete (jobs build in
// tmp/ and rename); creating or extending never writes data blocks (O(1)
// thin provisioning); copies keep holes as holes.
package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Store is a data root.
type Store struct {
	Root string
}

// Open creates the layout under root if needed.
func Open(root string) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"volumes", "snapshots", "tmp"} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o755); err != nil {
			return nil, fmt.Errorf("store %s: %w", abs, err)
		}
	}
	return &Store{Root: abs}, nil
}

// VolumePath is where volume id's bytes live.
func (s *Store) VolumePath(id string) string { return filepath.Join(s.Root, "volumes", id+".img") }

// SnapshotPath is where snapshot id's bytes live.
func (s *Store) SnapshotPath(id string) string {
	return filepath.Join(s.Root, "snapshots", id+".img")
}

// TempPath is where a job builds the file that will become final.
func (s *Store) TempPath(final string) string {
	return filepath.Join(s.Root, "tmp", filepath.Base(final)+".partial")
}

// CreateSparse creates path with the given size without writing data. It
// fails if path exists, so a retried create never truncates live data.
func (s *Store) CreateSparse(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("size %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// Resize grows path to size (never shrinks: callers check; this refuses).
func (s *Store) Resize(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("resize %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > size {
		return fmt.Errorf("resize %s: refusing to shrink from %d to %d", path, st.Size(), size)
	}
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("resize %s: %w", path, err)
	}
	return f.Sync()
}

// Remove deletes path; a missing file is not an error (deletes are retried).
func (s *Store) Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// Exists reports whether path exists.
func (s *Store) Exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
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
	return Capacity{
		TotalBytes: int64(st.Blocks) * int64(st.Bsize),
		FreeBytes:  int64(st.Bavail) * int64(st.Bsize),
	}, nil
}

// Check proves the store is usable: it exists, is a directory and accepts a
// synced write.
func (s *Store) Check() error {
	p := filepath.Join(s.Root, "tmp", ".health")
	if err := os.WriteFile(p, []byte("ok"), 0o600); err != nil {
		return fmt.Errorf("store %s not writable: %w", s.Root, err)
	}
	return os.Remove(p)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
