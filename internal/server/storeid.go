package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/basalt-storage/basalt/internal/store"
)

// identifyStore checks that --store is the cluster's store before anything
// uses it: its marker (store.MarkerFile) must name the store the metadata
// records. A node whose shared file system is not mounted thus refuses to
// start, instead of serving an empty directory as the store
// (store.MarkerFile says why that loses data). It returns the store's id.
//
// The first start to find no id recorded records its store's: the
// cluster's first start, or the first of a build that writes markers. A
// store without a marker is claimed then only if it looks like the
// cluster's store — it holds the layout a store gets (volumes/), or the
// cluster has no volume, snapshot or bucket yet — so that a node of an
// upgraded cluster whose file system is not mounted cannot claim its
// empty mount point for the cluster. A store with a marker whose id is not
// recorded is accepted only if this cluster made it (its first start
// stopped before recording the id), not another cluster's.
func (n *Node) identifyStore(ctx context.Context) (string, error) {
	root, err := filepath.Abs(n.cfg.Store)
	if err != nil {
		return "", err
	}
	recorded, err := n.meta.StoreID(ctx, "")
	if err != nil {
		return "", fmt.Errorf("store id: %w", err)
	}
	m, ok, err := store.ReadMarker(root)
	if err != nil {
		return "", err
	}
	if !ok {
		if recorded != "" {
			return "", fmt.Errorf("store %s has no %s marker, but this cluster's store, %s, has one: "+
				"is the file system that holds the store mounted here? If this really is the cluster's store "+
				"and its marker was lost, write {\"store_id\":%q,\"cluster_id\":%q} to %s",
				root, store.MarkerFile, recorded, recorded, n.clusterID, filepath.Join(root, store.MarkerFile))
		}
		if !laidOut(root) {
			data, err := n.meta.HoldsData(ctx)
			if err != nil {
				return "", fmt.Errorf("store %s: %w", root, err)
			}
			if data {
				return "", fmt.Errorf("store %s holds no store (no %s marker, no volumes/ directory), but this cluster has volumes, snapshots or buckets: "+
					"is the file system that holds the store mounted here?", root, store.MarkerFile)
			}
		}
		if m, err = store.Claim(root, store.Marker{ID: randomID(), Cluster: n.clusterID}); err != nil {
			return "", err
		}
	}
	if recorded == "" {
		if m.Cluster != n.clusterID {
			return "", fmt.Errorf("store %s is store %s of cluster %s, not of this cluster (%s): --store names another cluster's store",
				root, m.ID, m.Cluster, n.clusterID)
		}
		if recorded, err = n.meta.StoreID(ctx, m.ID); err != nil {
			return "", fmt.Errorf("store id: %w", err)
		}
	}
	if m.ID != recorded {
		return "", fmt.Errorf("store %s is store %s, not this cluster's store %s: --store names another cluster's store (or another file system)",
			root, m.ID, recorded)
	}
	return m.ID, nil
}

// laidOut reports whether root holds a store's layout (store.Open made
// it): a store in use before markers were written.
func laidOut(root string) bool {
	st, err := os.Stat(filepath.Join(root, "volumes"))
	return err == nil && st.IsDir()
}

// storeBeforeJoin refuses to join with a --store that is not a store: no
// marker and no store layout. The cluster has started on its store, so
// this node's shared file system is not mounted (or --store is wrong).
// Checked before the join, which a later refusal (identifyStore) would
// leave half done. It returns the store's marker (zero without one),
// which the join request carries for the cluster to check against its
// own (cluster.Service.checkStore).
func (n *Node) storeBeforeJoin() (store.Marker, error) {
	root, err := filepath.Abs(n.cfg.Store)
	if err != nil {
		return store.Marker{}, err
	}
	if m, ok, err := store.ReadMarker(root); err != nil || ok {
		return m, err
	}
	if laidOut(root) {
		return store.Marker{}, nil // a store of a cluster that has yet to write its marker
	}
	if _, err := os.Stat(root); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return store.Marker{}, fmt.Errorf("store %s: %w", root, err)
	}
	return store.Marker{}, fmt.Errorf("store %s has no %s marker, but the cluster this node joins has started on its store: "+
		"is the file system that holds the store mounted here, and does --store name the directory the other nodes use?",
		root, store.MarkerFile)
}
