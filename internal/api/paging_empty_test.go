package api

import (
	"fmt"
	"testing"
)

// TestPagingEmptyParams: ?limit= and ?after= given empty (a script's
// "?limit=$N&after=$NEXT" with a variable unset) are InvalidRequest, as
// an empty ?volume= is. They were read as left out: an empty limit
// answered the whole list — the very thing the script paged to avoid —
// and an empty after the first page again, so a paging loop whose token
// went missing started over without end. docs/api.md: "A limit out of
// range or an after that is not such a token is InvalidRequest".
func TestPagingEmptyParams(t *testing.T) {
	e := newNodeEnv(t, nil)
	_, alice := e.user("alice", false)
	for i := range 3 {
		if st, _, out := e.do(alice, "POST", "/v1/volumes", fmt.Sprintf(`{"size":"1MiB","name":"p%d"}`, i)); st != 201 {
			t.Fatalf("create: %d %s", st, out)
		}
	}
	for _, list := range []string{"/v1/volumes", "/v1/snapshots", "/v1/attachments", "/v1/attachments?volume=p0", "/v1/snapshots?volume=p0"} {
		sep := "?"
		if list != "/v1/volumes" && list != "/v1/snapshots" && list != "/v1/attachments" {
			sep = "&"
		}
		for _, q := range []string{"limit=", "limit=&after=", "limit=2&after=", "after="} {
			target := list + sep + q
			if st, code, body := e.do(alice, "GET", target, ""); st != 400 || code != "InvalidRequest" {
				t.Errorf("GET %s: %d %s %s, want 400 InvalidRequest", target, st, code, body)
			}
		}
		// Left out, or given, they still work.
		for _, q := range []string{"", "limit=2"} {
			target := list
			if q != "" {
				target += sep + q
			}
			if st, code, body := e.do(alice, "GET", target, ""); st != 200 {
				t.Errorf("GET %s: %d %s %s, want 200", target, st, code, body)
			}
		}
	}
}
