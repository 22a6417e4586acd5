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

// Marker is MarkerFile's content: the store's id and the cluster that
// made it. The cluster tells a store whose id this cluster has yet to
// record — its first start stopped between writing the marker and
// recording the id — from another cluster's store.
type Marker struct {
	ID        string    `json:"store_id"`
	Cluster   string    `json:"cluster_id,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// ReadMarker returns root's marker; ok is false when root has none (or
// does not exist).
func ReadMarker(root string) (m Marker, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(root, MarkerFile))
	if errors.Is(err, fs.ErrNotExist) {
		return m, false, nil
	}
	if err != nil {
		return m, false, fmt.Errorf("store %s: %w", root, err)
	}
	if err := json.Unmarshal(b, &m); err != nil || m.ID == "" {
		return m, false, fmt.Errorf("store %s: %s is not a store marker (%d bytes): %v", root, MarkerFile, len(b), err)
	}
	return m, true, nil
}

// Claim makes root a store named by m: it creates root if needed and
// writes m as its marker, durably, unless root has one already. It
// returns the marker root holds: m, or the one another node wrote first.
func Claim(root string, m Marker) (Marker, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return m, fmt.Errorf("store %s: %w", root, err)
	}
	m.CreatedAt = time.Now().UTC()
	b, _ := json.Marshal(m)
	tmp, err := os.CreateTemp(root, MarkerFile+".*")
	if err != nil {
		return m, fmt.Errorf("store %s: %w", root, err)
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
		return m, fmt.Errorf("store %s: marker: %w", root, err)
	}
	// A link, not a rename: it fails if a marker exists, so of two nodes
	// claiming one store at once the second takes the first one's.
	err = os.Link(tmp.Name(), filepath.Join(root, MarkerFile))
	if errors.Is(err, fs.ErrExist) {
		got, ok, err := ReadMarker(root)
		if err == nil && !ok {
			err = fmt.Errorf("store %s: %s vanished while claimed", root, MarkerFile)
		}
		return got, err
	}
	if err != nil {
		return m, fmt.Errorf("store %s: marker: %w", root, err)
	}
	// The marker named in root, and root in its parent (it may be new).
	for _, d := range []string{root, filepath.Dir(root)} {
		if err := block.SyncDir(d); err != nil {
			return m, fmt.Errorf("store %s: %w", root, err)
		}
	}
	return m, nil
}
