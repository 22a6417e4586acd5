package cow

import (
	"encoding/json"
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
	Tag    string
}

// ReadImage reads image id's superblock from the image directory.
func ReadImage(images, id string) (Image, error) {
	b, payload, err := superblock.Open(filepath.Join(images, id, imgFile))
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", id, err)
	}
	b.Close()
	var m imageMeta
	if err := json.Unmarshal(payload, &m); err != nil {
		return Image{}, fmt.Errorf("image %s: %w", id, err)
	}
	return Image{ID: m.ID, Parent: m.Parent, Size: m.Size, Tag: m.Tag}, nil
}

// TopOf is the top image of the cow layer whose directory is dir.
func TopOf(dir string) (string, error) {
	b, payload, err := superblock.Open(filepath.Join(dir, volFile))
	if err != nil {
		return "", err
	}
	b.Close()
	var vm volMeta
	if err := json.Unmarshal(payload, &vm); err != nil {
		return "", fmt.Errorf("%s: %w", volFile, err)
	}
	return vm.Top, nil
}

// Collect removes the images that no root needs: an image is live if it is
// a root (a volume's top, a snapshot's image), the parent of a live image,
// or younger than grace (it may be a top or snapshot being created right
// now, not yet recorded). It returns the ids removed. An image whose
// superblock cannot be read is kept while a root names it; otherwise, once
// older than grace, it is the leftover of a creation that crashed before
// its superblock was written, and is removed.
func Collect(images string, roots []string, grace time.Duration) ([]string, error) {
	entries, err := os.ReadDir(images)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	parent := map[string]string{}
	young := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		id := e.Name()
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) < grace {
			young[id] = true
		}
		if im, err := ReadImage(images, id); err == nil {
			parent[id] = im.Parent
		}
	}
	live := map[string]bool{}
	var mark func(id string)
	mark = func(id string) {
		for id != "" && !live[id] {
			live[id] = true
			id = parent[id]
		}
	}
	for _, id := range roots {
		mark(id)
	}
	for id := range young {
		mark(id)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || live[id] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(images, id)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}
