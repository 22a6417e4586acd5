package server

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/basalt-storage/basalt/internal/store"
)

// identifyStore checks that --store is the cluster's store before anything
// uses it: its marker (store.MarkerFile) must name the store the metadata
// records. The cluster's first start records the store it finds, or makes
// one: a store without a marker is accepted only then (or from a build
// that wrote none: the first start of this one records it), and a store
// with a marker whose id is not recorded yet only if this cluster made it
// (its first start stopped before recording the id) — not another
// cluster's. A node whose shared file system is not mounted thus refuses
// to start, instead of serving an empty directory as the store
// (store.MarkerFile says why that loses data). It returns the store's id.
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

// storeBeforeJoin refuses to join with a --store that has no marker: the
// cluster has started, so its store has one, and this node's shared file
// system is not mounted (or --store is wrong). Checked before the join,
// which a later refusal would leave half done.
func (n *Node) storeBeforeJoin() error {
	root, err := filepath.Abs(n.cfg.Store)
	if err != nil {
		return err
	}
	if _, ok, err := store.ReadMarker(root); err != nil || ok {
		return err
	}
	return fmt.Errorf("store %s has no %s marker, but the cluster this node joins has started on its store: "+
		"is the file system that holds the store mounted here, and does --store name the directory the other nodes use?",
		root, store.MarkerFile)
}
