package api

import (
	"encoding/json"
	"testing"
)

// TestEmptyVolumeFilter: ?volume= with no value (a script's
// "?volume=$VOL" with VOL unset) is no filter at all to url.Values.Get,
// and GET /v1/attachments?volume= answered every attachment of the
// caller, export secrets included — the filter dropped, which checkQuery
// refuses for a misspelt or doubled one and the CLI for --volume "".
// It is InvalidRequest; leaving the parameter out still lists everything.
func TestEmptyVolumeFilter(t *testing.T) {
	e := newNodeEnv(t, nil)
	_, alice := e.user("alice", false)
	if st, _, out := e.do(alice, "POST", "/v1/volumes", `{"size":"1GiB","name":"a"}`); st != 201 {
		t.Fatalf("create: %d %s", st, out)
	}
	if st, _, out := e.do(alice, "POST", "/v1/attachments", `{"volume":"a","host":"h1"}`); st != 201 {
		t.Fatalf("attach: %d %s", st, out)
	}
	if st, _, out := e.do(alice, "POST", "/v1/snapshots", `{"volume":"a"}`); st != 201 {
		t.Fatalf("snapshot: %d %s", st, out)
	}
	for _, target := range []string{"/v1/attachments?volume=", "/v1/attachments?volume", "/v1/attachments?limit=5&volume=",
		"/v1/snapshots?volume=", "/v1/snapshots?volume"} {
		if st, code, out := e.do(alice, "GET", target, ""); st != 400 || code != "InvalidRequest" {
			t.Errorf("GET %s: HTTP %d %.200s, want 400 InvalidRequest", target, st, out)
		}
	}
	for _, target := range []string{"/v1/attachments", "/v1/snapshots"} {
		var list []json.RawMessage
		st, _, out := e.do(alice, "GET", target, "")
		if err := json.Unmarshal([]byte(out), &list); st != 200 || err != nil || len(list) != 1 {
			t.Errorf("GET %s: HTTP %d %.200s, want the one item", target, st, out)
		}
	}
}
