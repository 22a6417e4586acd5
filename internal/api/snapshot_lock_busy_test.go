package api

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/lock"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestSnapshotLockBusyDocumented: a clone (POST /v1/volumes with
// from_snapshot) and a snapshot export take the snapshot's workflow lock
// for reading, and answer 409 VolumeBusy when a snapshot delete holds it
// for writing past the lock wait (docs/api.md's error table says so for
// clones). Neither operation listed VolumeBusy — not in openapi.json's
// x-error-codes, not in its Errors in docs/api.md — so a client generated
// from the description did not know the code it was answered.
func TestSnapshotLockBusyDocumented(t *testing.T) {
	e := newNodeEnv(t, stubObjects{})
	_, alice := e.user("alice", false)
	st, _, body := e.do(alice, "POST", "/v1/volumes", `{"name":"db","size":"1MiB"}`)
	if st != 201 {
		t.Fatalf("create: %d %s", st, body)
	}
	st, _, body = e.do(alice, "POST", "/v1/snapshots", `{"volume":"db","name":"nightly"}`)
	if st != 201 {
		t.Fatalf("snapshot: %d %s", st, body)
	}
	var sn Snapshot
	if err := json.Unmarshal([]byte(body), &sn); err != nil {
		t.Fatal(err)
	}

	// Hold the snapshot's lock as a snapshot delete does, from another
	// node's session.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := lock.Open(ctx, e.meta.Client(), meta.LocksPrefix, 30, lock.Options{Owner: "deleter"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h, err := l.Acquire(ctx, "snapshot/"+sn.ID, lock.Write)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(context.Background())

	cases := []struct {
		method, pattern, target, body string
	}{
		{"POST", "/v1/volumes", "/v1/volumes", `{"name":"copy","from_snapshot":"` + sn.ID + `"}`},
		{"POST", "/v1/snapshots/{id}/export", "/v1/snapshots/" + sn.ID + "/export", `{"to":"s3://images/db.raw"}`},
	}
	type answer struct {
		st   int
		code string
		body string
	}
	answers := make([]answer, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Add(1)
		go func() { // each waits out the lock wait: together, not one after the other
			defer wg.Done()
			st, code, body := e.do(alice, c.method, c.target, c.body)
			answers[i] = answer{st, code, body}
		}()
	}
	wg.Wait()
	for i, c := range cases {
		a := answers[i]
		if a.st != 409 || a.code != errs.CodeVolumeBusy {
			t.Errorf("%s %s while a delete holds the snapshot: %d %s %s, want 409 VolumeBusy", c.method, c.target, a.st, a.code, a.body)
			continue
		}
		op := openapiOp(t, c.method, c.pattern)
		codes, _ := op["x-error-codes"].([]any)
		if !slices.Contains(codes, any(errs.CodeVolumeBusy)) {
			t.Errorf("%s %s answers VolumeBusy, which is not among its x-error-codes %v", c.method, c.pattern, codes)
		}
	}
}
