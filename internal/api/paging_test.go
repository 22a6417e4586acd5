package api

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"regexp"
	"slices"
	"testing"
)

// get sends GET target as who and returns the status, the body decoded
// into out, and the rel="next" URL of the Link header ("" without one).
func (e *nodeEnv) get(who []*x509.Certificate, target string, out any) (int, string) {
	e.t.Helper()
	r := httptest.NewRequest("GET", target, nil)
	r.TLS = &tls.ConnectionState{PeerCertificates: who}
	w := httptest.NewRecorder()
	e.s.ServeHTTP(w, r)
	if w.Code == 200 {
		if err := json.Unmarshal(w.Body.Bytes(), out); err != nil {
			e.t.Fatalf("GET %s: %v", target, err)
		}
	}
	m := regexp.MustCompile(`^<([^>]+)>; rel="next"$`).FindStringSubmatch(w.Header().Get("Link"))
	if m == nil {
		return w.Code, ""
	}
	return w.Code, m[1]
}

// TestPaging: ?limit pages a list in its order, the Link header leads to
// the rest, and a page goes on after its token's position even when the
// item it names was deleted meanwhile.
func TestPaging(t *testing.T) {
	e := newNodeEnv(t, nil)
	_, alice := e.user("alice", false)
	for i := range 7 {
		if st, _, out := e.do(alice, "POST", "/v1/volumes", fmt.Sprintf(`{"size":"1MiB","name":"p%d"}`, i)); st != 201 {
			t.Fatalf("create: %d %s", st, out)
		}
	}
	var all []Volume
	if st, next := e.get(alice, "/v1/volumes", &all); st != 200 || next != "" || len(all) != 7 {
		t.Fatalf("whole list: %d, %d volumes, next %q", st, len(all), next)
	}
	ids := func(vs []Volume) (out []string) {
		for _, v := range vs {
			out = append(out, v.ID)
		}
		return out
	}
	var paged []Volume
	target, pages := "/v1/volumes?limit=3", 0
	for target != "" {
		var p []Volume
		st, next := e.get(alice, target, &p)
		if st != 200 || len(p) > 3 {
			t.Fatalf("GET %s: %d, %d items", target, st, len(p))
		}
		paged, target, pages = append(paged, p...), next, pages+1
		if pages == 1 {
			// The last item of the first page goes; the next page
			// starts where it was.
			if st, _, out := e.do(alice, "DELETE", "/v1/volumes/"+p[len(p)-1].ID, ""); st != 202 && st != 204 {
				t.Fatalf("delete: %d %s", st, out)
			}
		}
	}
	if !slices.Equal(ids(paged), ids(all)) || pages != 3 {
		t.Errorf("paged %v in %d pages, want %v in 3", ids(paged), pages, ids(all))
	}
	for _, target := range []string{"/v1/volumes?limit=0", "/v1/volumes?limit=1001", "/v1/volumes?limit=x",
		"/v1/volumes?after=nope", "/v1/snapshots?limit=-1", "/v1/attachments?after=bW9v"} {
		if st, code, out := e.do(alice, "GET", target, ""); st != 400 || code != "InvalidRequest" {
			t.Errorf("GET %s: HTTP %d %.200s, want 400 InvalidRequest", target, st, out)
		}
	}
	// The other paged lists take the parameters with their filters.
	var sn []Snapshot
	if st, next := e.get(alice, "/v1/snapshots?volume=p1&limit=1", &sn); st != 200 || next != "" {
		t.Errorf("snapshots page: %d, next %q", st, next)
	}
}
