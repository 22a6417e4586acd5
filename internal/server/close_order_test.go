package server

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/volume"
)

// A node that shuts down keeps its liveness key until its volume service
// has stopped — its jobs ended, its stacks closed, its write leases given
// up. While a node has no liveness key the others adopt the workflows
// recorded for it (volume/orphans.go); revoked first, as it was, they
// could run a workflow this node was still running.
func TestLivenessOutlastsTheVolumeService(t *testing.T) {
	tmp := t.TempDir()
	a, err := startNode(t, nodeConfig(t, "a", filepath.Join(tmp, "a"), filepath.Join(tmp, "store")))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			a.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bob := volume.Caller{Name: "bob", ID: "u-bob"}
	v, err := a.volumes.CreateVolume(ctx, bob, volume.CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.volumes.Attach(ctx, bob, v.ID, "hv1", meta.ModeRW); err != nil {
		t.Fatal(err)
	}
	leaseKey := ""
	if r, err := a.meta.Client().Get(ctx, "/basalt/leases/volumes/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	} else {
		for _, kv := range r.Kvs {
			if strings.Contains(string(kv.Key), v.ID) {
				leaseKey = string(kv.Key)
			}
		}
	}
	if leaseKey == "" {
		t.Fatal("no write lease held for the rw attachment")
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	events := a.meta.Client().Watch(wctx, "/basalt/", clientv3.WithPrefix())
	var order []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r := range events {
			for _, ev := range r.Events {
				if ev.Type == clientv3.EventTypeDelete {
					order = append(order, string(ev.Kv.Key))
				}
			}
		}
	}()
	time.Sleep(100 * time.Millisecond) // the watch is set up
	a.Close()
	closed = true
	wcancel()
	<-done
	for _, k := range order {
		if k == "/basalt/alive/a" {
			t.Fatalf("the liveness key went before the write lease %s (deletes: %v)", leaseKey, order)
		}
		if k == leaseKey {
			return
		}
	}
	t.Fatalf("the write lease's deletion was not seen (deletes: %v)", order)
}
