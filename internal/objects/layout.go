package objects

// The on-disk layout of non-current versions changed once: version files
// and delete markers were named .basalt-versions/<key>/<id> (null,
// <id>.delete-marker), where key "a"'s version "null" and the directory of
// key "a/null"'s versions wanted the same name. They are now named
// .basalt-versions/<key>/.basalt-version.<id> (versionFile). A gateway
// renames every file of the old layout when it starts, before it serves,
// and then leaves the file Work/layoutDone so that later starts do not
// walk the buckets again. Each rename is one step that a crash cannot
// tear (a sidecar record is written under the new name first, and the
// old record removed last), and the walk is run again until the
// migration has finished once; gateways starting together take turns on
// a lock. Gateways of the old layout must not run beside new ones: the
// names they write would be ignored (docs/objects.md, "Versioning").

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// layoutDone names the file in Work whose presence says the version
// layout is current in every bucket.
const layoutDone = "layout-versions-2"

// migrateLayout renames the version files of the old layout in every
// bucket (see the comment at the top of this file). It goes on past a
// bucket it cannot migrate and then fails without leaving layoutDone, so
// the next start tries again.
func (b *Backend) migrateLayout() error {
	done := filepath.Join(b.work, layoutDone)
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	unlock, err := lockFile(filepath.Join(b.work, "locks", "layout"), unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(done); err == nil {
		return nil // another gateway finished it while this one waited
	}
	ents, err := b.rootDir.FS().(fs.ReadDirFS).ReadDir(".")
	if err != nil {
		return fmt.Errorf("migrate version layout: %w", err)
	}
	var failed []error
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		r, err := b.rootDir.OpenRoot(e.Name())
		if err == nil {
			var n int
			n, err = b.migrateBucket(r, e.Name())
			r.Close()
			if n > 0 {
				b.log.Info("renamed versions to the current layout", "bucket", e.Name(), "files", n)
			}
		}
		if err != nil {
			failed = append(failed, fmt.Errorf("migrate version layout of bucket %s: %w", e.Name(), err))
		}
	}
	if len(failed) > 0 {
		return errors.Join(failed...)
	}
	return writeFileIn(b.tmp, done, nil)
}

// migrateBucket renames the old-layout version files and delete markers
// of one bucket (r) and returns how many it renamed.
func (b *Backend) migrateBucket(r *os.Root, bucket string) (int, error) {
	var old []string
	err := fs.WalkDir(r.FS(), versionsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == versionsDir && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != versionsDir && strings.HasPrefix(name, reservedPrefix) {
				return fs.SkipDir // no key's directory
			}
			return nil
		}
		if d.Type().IsRegular() && !strings.HasPrefix(name, reservedPrefix) &&
			validVersionID(strings.TrimSuffix(name, markerSuffix)) {
			old = append(old, p)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	dirs := map[string]bool{}
	for _, p := range old {
		dir, name := path.Split(p)
		np := dir + versionPrefix + name
		if err := b.renameVersion(r, bucket, p, np); err != nil {
			return 0, err
		}
		dirs[path.Clean(dir)] = true
	}
	for dir := range dirs {
		if err := syncIn(r, dir); err != nil {
			return 0, err
		}
	}
	return len(old), nil
}

// renameVersion renames the version file (or delete marker) p to np, and
// in sidecar mode moves its record along: written under np before the
// rename, removed under p after it.
func (b *Backend) renameVersion(r *os.Root, bucket, p, np string) error {
	rename := func() error { return r.Rename(p, np) }
	sc, ok := b.meta.(*sidecarMeta)
	if !ok || strings.HasSuffix(p, markerSuffix) {
		return rename()
	}
	m, err := sc.read(nil, bucket, p)
	if errors.Is(err, errNoMeta) || errors.As(err, new(badRecord)) {
		return rename() // no record of its own to move: inspect says so under either name
	}
	if err != nil {
		return err
	}
	if err := sc.commit(bucket, np, m, rename); err != nil {
		return err
	}
	return sc.remove(bucket, p, func() error { return nil })
}
