package api

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestSnapshotTokenDocumentedAsCallers: a snapshot's client_token is
// the caller's (volume.CreateSnapshot records it under the caller, as
// docs/api.md's Idempotency convention and openapi.json say), but the
// POST /v1/snapshots section of docs/api.md said a repeat was looked up
// "in the owner's namespace (the volume's owner, even when an
// administrator makes the call)": an administrator following it would
// expect its retry to return the snapshot the owner made with that
// token. The section must say what the server does.
func TestSnapshotTokenDocumentedAsCallers(t *testing.T) {
	e := newNodeEnv(t, nil)
	_, alice := e.user("alice", false)
	_, admin := e.user("root", true)
	st, _, body := e.do(alice, "POST", "/v1/volumes", `{"name":"db","size":"1MiB"}`)
	if st != 201 {
		t.Fatalf("create: %d %s", st, body)
	}
	var v Volume
	json.Unmarshal([]byte(body), &v)
	snap := func(who string, body string) Snapshot {
		t.Helper()
		c := alice
		if who == "admin" {
			c = admin
		}
		st, _, out := e.do(c, "POST", "/v1/snapshots", body)
		if st != 201 {
			t.Fatalf("%s: snapshot %s: %d %s", who, body, st, out)
		}
		var sn Snapshot
		json.Unmarshal([]byte(out), &sn)
		return sn
	}
	mine := snap("alice", `{"volume":"`+v.ID+`","name":"nightly","client_token":"t1"}`)
	// The admin's "t1" is the admin's own: a new snapshot, not alice's.
	if theirs := snap("admin", `{"volume":"`+v.ID+`","name":"by-admin","client_token":"t1"}`); theirs.ID == mine.ID {
		t.Fatalf("the admin's token t1 returned alice's snapshot %s", mine.ID)
	}

	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "#### `POST /v1/snapshots`")
	if !ok {
		t.Fatal("docs/api.md has no POST /v1/snapshots section")
	}
	sec, _, _ = strings.Cut(sec, "\n#### ")
	sec = strings.Join(strings.Fields(sec), " ")
	if strings.Contains(sec, "owner's namespace") || strings.Contains(sec, "even when an administrator makes the call") {
		t.Errorf("docs/api.md, POST /v1/snapshots, says a client_token is looked up in the volume owner's namespace; it is the caller's")
	}
	if !strings.Contains(sec, "tokens are the caller's") {
		t.Errorf("docs/api.md, POST /v1/snapshots, does not say that client tokens are the caller's")
	}
}
