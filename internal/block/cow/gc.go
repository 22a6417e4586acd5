package cow

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/basalt-storage/basalt/internal/block/superblock"
)

// Image describes a stored image (for the volume service and Collect).
type Image struct {
	ID     string
	Parent string
	Size   int64
	Tag    string // the snapshot whose freeze started the image
	Froze  string // the image that snapshot froze
}

// ReadImage reads image id's superblock from the image directory.
func ReadImage(images, id string) (Image, error) {
	b, payload, err := superblock.Open(filepath.Join(images, id, imgFile))
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", id, err)
	}
	b.Close()
	m, err := decodeImageMeta(payload, id)
	if err != nil {
		return Image{}, err
	}
	return Image{ID: m.ID, Parent: m.Parent, Size: m.Size, Tag: m.Tag, Froze: m.Froze}, nil
}

// TopOf is the top image of the cow layer whose directory is dir.
func TopOf(dir string) (string, error) {
	b, payload, err := superblock.Open(filepath.Join(dir, volFile))
	if err != nil {
		return "", err
	}
	b.Close()
	vm, err := decodeVolMeta(payload)
	if err != nil {
		return "", err
	}
	return vm.Top, nil
}

// Collect removes the images that no root needs: an image is live if it is
// a root (a volume's top, a snapshot's image), the parent of a live image,
// or younger than grace (it may be a top or snapshot being created right
// now, not yet recorded). It returns the ids removed. An image whose
// superblock cannot be read is kept while a root names it; otherwise, once
// older than grace, it is the leftover of a creation that crashed before
// its superblock was written, and is removed. A live image older than
// grace whose superblock cannot be read hides its parent, which may be
// any other image: then nothing is removed and Collect fails.
//
// Collect is ListImages then Sweep. A caller that must keep its own
// creations apart from a collection lists, reads its roots, and only then
// lets creations go on: Sweep considers only the images listed, and an
// image that no root needed once listed is needed by nothing later (a top
// only moves to a newer image or, by a collapse, to its own parent, live
// already; a clone needs a snapshot, itself a root).
func Collect(images string, roots []string, grace time.Duration) ([]string, error) {
	listed, err := ListImages(images)
	if err != nil {
		return nil, err
	}
	return Sweep(images, listed, roots, grace)
}

// Listed is an image directory found by ListImages.
type Listed struct {
	ID       string
	Modified time.Time
}

// ListImages lists the image directories under images.
func ListImages(images string) ([]Listed, error) {
	entries, err := os.ReadDir(images)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Listed
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		l := Listed{ID: e.Name()}
		if info, err := e.Info(); err == nil {
			l.Modified = info.ModTime()
		}
		out = append(out, l)
	}
	return out, nil
}

// Sweep removes the listed images that no root needs (see Collect).
func Sweep(images string, listed []Listed, roots []string, grace time.Duration) ([]string, error) {
	parent := map[string]string{}
	young := map[string]bool{}
	unread := map[string]error{}
	for _, l := range listed {
		if time.Since(l.Modified) < grace {
			young[l.ID] = true
		}
		if im, err := ReadImage(images, l.ID); err == nil {
			parent[l.ID] = im.Parent
		} else {
			unread[l.ID] = err
		}
	}
	live := map[string]bool{}
	var hidden error // a live image whose parent cannot be known
	mark := func(id string) {
		for id != "" && !live[id] {
			live[id] = true
			p, ok := parent[id]
			if !ok {
				// Not listed: created since (a root read after the
				// listing may name it), so its chain may lead into the
				// listed images. Or listed and unreadable.
				im, err := ReadImage(images, id)
				switch {
				case err == nil:
					p = im.Parent
				case young[id]:
					// Being created: its superblock is not written
					// yet, and its parent is a root of its own (a
					// volume's top until the new image replaces it).
				case !exists(filepath.Join(images, id)):
					// Gone, or not made yet (a record names it first):
					// nothing reads through it.
				default:
					if e, ok := unread[id]; ok {
						err = e
					}
					hidden = errors.Join(hidden, err)
				}
			}
			id = p
		}
	}
	for _, id := range roots {
		mark(id)
	}
	for id := range young {
		mark(id)
	}
	if hidden != nil {
		return nil, fmt.Errorf("collect nothing: the parent of a live image is unknown: %w", hidden)
	}
	var removed []string
	var errs []error
	for _, l := range listed {
		if live[l.ID] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(images, l.ID)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, l.ID)
	}
	return removed, errors.Join(errs...)
}

// exists reports whether path exists; an error other than its absence
// counts as existing (it may hide what is there).
func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}
