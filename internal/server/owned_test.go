package server

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/volume"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestOwnedIndexBuiltAtStart: a node started on the metadata of a version
// without the owned index — records, no index — builds it, so that a
// user's list, and an admin's of everything, read through it, hold the
// user's volumes.
func TestOwnedIndexBuiltAtStart(t *testing.T) {
	tmp := t.TempDir()
	cfg := nodeConfig(t, "a", filepath.Join(tmp, "a"), filepath.Join(tmp, "store"))
	a, err := startNode(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg = a.cfg // the ports it got
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bob := volume.Caller{Name: "bob", ID: "u-bob"}
	v, err := a.volumes.CreateVolume(ctx, bob, volume.CreateVolume{Name: "kept", SizeBytes: 1 << 20})
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	// As an earlier version left it.
	for _, prefix := range []string{"/basalt/owned/", "/basalt/ordered/"} {
		if _, err := a.meta.Client().Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
			a.Close()
			t.Fatal(err)
		}
	}
	admin := volume.Caller{Name: "admin", ID: "u-admin", Admin: true}
	if vs, err := a.volumes.Volumes(ctx, admin); err != nil || len(vs) != 0 {
		a.Close()
		t.Fatalf("the admin's list without the index: %d volumes, %v", len(vs), err)
	}
	if vs, err := a.volumes.Volumes(ctx, bob); err != nil || len(vs) != 0 {
		a.Close()
		t.Fatalf("bob's list without the index: %d volumes, %v", len(vs), err)
	}
	a.Close()

	if a, err = startNode(t, cfg); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if vs, err := a.volumes.Volumes(ctx, bob); err != nil || len(vs) != 1 || vs[0].ID != v.ID {
		t.Fatalf("bob's list after the restart: %d volumes, %v", len(vs), err)
	}
	if vs, err := a.volumes.Volumes(ctx, admin); err != nil || len(vs) != 1 || vs[0].ID != v.ID {
		t.Fatalf("the admin's list after the restart: %d volumes, %v", len(vs), err)
	}
	if problems, err := a.meta.CheckOwnedIndex(ctx); err != nil || len(problems) != 0 {
		t.Fatalf("the index after the build: %v, %v", problems, err)
	}
}
