package api

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/volume"
)

// TestDelegatedExtendNotDoneIs202: a volume written by another node is
// extended by that node; the call waits for it a while (volume.Config.DelegateWait) and then
// answers with the volume still extending. It answered 200 OK — the
// answer of a finished, synchronous extend — with status "extending" and
// the old size, though the extend had not happened and could still fail.
// It answers 202 Accepted, as a snapshot handed to a writer that has not
// taken it yet does (status creating).
func TestDelegatedExtendNotDoneIs202(t *testing.T) {
	// The wait is shortened: the default is 30 s.
	e := newNodeEnvWith(t, volume.Config{DelegateWait: 2 * time.Second})
	_, alice := e.user("alice", false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A node that holds the volumes' write leases and does nothing: the
	// workflows handed to it are not done within the wait.
	lease, err := e.meta.GrantLease(ctx, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer e.meta.RevokeLease(context.Background(), lease)
	ghost := uniq("ghost")
	vol := func(name string) string {
		st, _, body := e.do(alice, "POST", "/v1/volumes", `{"name":"`+name+`","size":"1MiB"}`)
		if st != 201 {
			t.Fatalf("create: %d %s", st, body)
		}
		var v Volume
		json.Unmarshal([]byte(body), &v)
		if _, err := e.meta.AcquireVolumeLease(ctx, v.ID, ghost, lease); err != nil {
			t.Fatal(err)
		}
		return v.ID
	}
	grow, snap := vol("grow"), vol("snap")

	var wg sync.WaitGroup
	var extSt, snapSt int
	var extBody, snapBody string
	wg.Add(2)
	go func() {
		defer wg.Done()
		extSt, _, extBody = e.do(alice, "POST", "/v1/volumes/"+grow+"/extend", `{"size":"2MiB"}`)
	}()
	go func() {
		defer wg.Done()
		snapSt, _, snapBody = e.do(alice, "POST", "/v1/snapshots", `{"volume":"`+snap+`"}`)
	}()
	wg.Wait()

	var v Volume
	if err := json.Unmarshal([]byte(extBody), &v); err != nil {
		t.Fatalf("extend: %d %s", extSt, extBody)
	}
	if v.Status != "extending" {
		t.Fatalf("extend handed to an idle writer: %d %s; want the volume still extending", extSt, extBody)
	}
	if extSt != 202 {
		t.Errorf("extend not done by the volume's writer within the wait: HTTP %d with status %s and size %d; want 202", extSt, v.Status, v.SizeBytes)
	}
	var sn Snapshot
	if err := json.Unmarshal([]byte(snapBody), &sn); err != nil || sn.Status != "creating" || snapSt != 202 {
		t.Errorf("snapshot not taken by the volume's writer within the wait: HTTP %d %s; want 202, creating", snapSt, snapBody)
	}
	// openapi.json declares the 202.
	op := openapiOp(t, "POST", "/v1/volumes/{id}/extend")
	if responses, _ := op["responses"].(map[string]any); responses["202"] == nil {
		t.Errorf("openapi.json declares no 202 for POST /v1/volumes/{id}/extend")
	}
}
