package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// MarkerFile, at the store's root, names the store: its id, which the
// cluster's metadata records too (meta.Store.StoreID).
//
// Why: --store is usually a directory on a shared file system (Lustre,
// CephFS, NFS) mounted on every node. A node started while that file system
// is not mounted would otherwise take the empty mount point (or a directory
// it creates there, on its local disk) for the store — answering every
// volume and object as missing, and putting new volumes and PUT objects
// where no other node sees them and the mount will later hide them. With
// the marker, a store without one is the cluster's only on the cluster's
// first start; afterwards it is refused.
const MarkerFile = ".basalt-store"

// marker is MarkerFile's content.
type marker struct {
	ID        string    `json:"store_id"`
	CreatedAt time.Time `json:"created_at"`
}

// ReadID returns the id in root's marker; ok is false when root has none
// (or does not exist).
func ReadID(root string) (id string, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(root, MarkerFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("store %s: %w", root, err)
	}
	var m marker
	if err := json.Unmarshal(b, &m); err != nil || m.ID == "" {
		return "", false, fmt.Errorf("store %s: %s is not a store marker (%d bytes): %v", root, MarkerFile, len(b), err)
	}
	return m.ID, true, nil
}

// Claim makes root a store named id: it creates root if needed and writes
// its marker, durably, unless root has one already. It returns the id the
// marker holds: id, or the one another node wrote first.
func Claim(root, id string) (string, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("store %s: %w", root, err)
	}
	b, _ := json.Marshal(marker{ID: id, CreatedAt: time.Now().UTC()})
	tmp, err := os.CreateTemp(root, MarkerFile+".*")
	if err != nil {
		return "", fmt.Errorf("store %s: %w", root, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("store %s: marker: %w", root, err)
	}
	// A link, not a rename: it fails if a marker exists, so of two nodes
	// claiming one store at once the second takes the first one's id.
	err = os.Link(tmp.Name(), filepath.Join(root, MarkerFile))
	if errors.Is(err, fs.ErrExist) {
		got, ok, err := ReadID(root)
		if err == nil && !ok {
			err = fmt.Errorf("store %s: %s vanished while claimed", root, MarkerFile)
		}
		return got, err
	}
	if err != nil {
		return "", fmt.Errorf("store %s: marker: %w", root, err)
	}
	// The marker named in root, and root in its parent (it may be new).
	for _, d := range []string{root, filepath.Dir(root)} {
		if err := block.SyncDir(d); err != nil {
			return "", fmt.Errorf("store %s: %w", root, err)
		}
	}
	return id, nil
}
