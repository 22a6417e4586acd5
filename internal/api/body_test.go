package api

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/objects"
)

// bodyRoutes are the routes that read a request body, each with a target
// (its path parameters name nothing) and whether it is for administrators.
var bodyRoutes = []struct {
	method, target string
	admin          bool
}{
	{"POST", "/v1/users", true},
	{"POST", "/v1/volumes", false},
	{"POST", "/v1/volumes/nosuch/extend", false},
	{"POST", "/v1/snapshots", false},
	{"POST", "/v1/snapshots/nosuch/export", false},
	{"POST", "/v1/types", true},
	{"POST", "/v1/attachments", false},
	{"POST", "/v1/objects/export", false},
	{"POST", "/v1/objects/unexport", false},
	{"POST", "/v1/nodes/join-token", true},
	{"POST", "/v1/nodes/join-token/revoke", true},
	{"POST", "/v1/nodes/join", true},
}

// bodyEnv is a node with an object store (the object endpoints read their
// body only then), an administrator and an ordinary user.
func bodyEnv(t *testing.T) (e *nodeEnv, admin, alice []*x509.Certificate) {
	t.Helper()
	e = newNodeEnv(t, stubObjects{})
	_, admin = e.user("root", true)
	_, alice = e.user("alice", false)
	dir := t.TempDir()
	bs := mapBuckets{}
	be, err := objects.New(objects.Config{Root: filepath.Join(dir, "buckets"), Work: filepath.Join(dir, "work"), Buckets: bs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Shutdown)
	os.MkdirAll(be.Root(), 0o755)
	e.s.d.Objects, e.s.d.Bucket = be, bs.record
	return e, admin, alice
}

// endless is a body that never ends; it counts what was read of it.
type endless struct{ read int }

func (r *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	r.read += len(p)
	return len(p), nil
}

// TestBodyLimit: a body over 1 MiB is refused with 400 InvalidRequest
// (docs/api.md) on every route that takes one, after reading no more
// than the limit — an endless body does not keep the server reading —
// and one of exactly 1 MiB is still read.
func TestBodyLimit(t *testing.T) {
	e, admin, alice := bodyEnv(t)
	for _, rt := range bodyRoutes {
		who := alice
		if rt.admin {
			who = admin
		}
		body := &endless{}
		r := httptest.NewRequest(rt.method, rt.target, body)
		r.TLS = &tls.ConnectionState{PeerCertificates: who}
		w := httptest.NewRecorder()
		e.s.ServeHTTP(w, r)
		var eb ErrorBody
		json.Unmarshal(w.Body.Bytes(), &eb)
		if w.Code != 400 || eb.Error.Code != "InvalidRequest" || !strings.Contains(eb.Error.Message, "exceeds") {
			t.Errorf("%s %s, endless body: HTTP %d %.200s, want 400 InvalidRequest (too large)", rt.method, rt.target, w.Code, w.Body)
		}
		if body.read > maxBody+64<<10 {
			t.Errorf("%s %s: read %d bytes of the body, limit %d", rt.method, rt.target, body.read, maxBody)
		}
	}
	// The limit itself: a body of exactly 1 MiB (spaces after the object)
	// is read; one byte more is refused.
	obj := `{"volume":"nosuch","host":"h1"}`
	at := obj + strings.Repeat(" ", maxBody-len(obj))
	if st, code, out := e.do(alice, "POST", "/v1/attachments", at); st != 404 || code != "NotFound" {
		t.Errorf("attach, a body of exactly %d bytes: HTTP %d %.200s, want 404 NotFound (the volume)", len(at), st, out)
	}
	if st, code, out := e.do(alice, "POST", "/v1/attachments", at+" "); st != 400 || code != "InvalidRequest" {
		t.Errorf("attach, a body of %d bytes: HTTP %d %.200s, want 400 InvalidRequest", len(at)+1, st, out)
	}
}

// TestBodyNotAnObject: a body must be one JSON object (docs/api.md,
// Conventions); anything else — an array, a number, a string, true, null,
// a truncated object, data after it — is 400 MalformedJSON on every route
// that takes a body. null used to pass as an empty object: POST
// /v1/nodes/join-token answered it with a token valid for 24 hours, and
// the other routes with the error for a missing field (InvalidSize,
// InvalidRequest, InvalidName).
func TestBodyNotAnObject(t *testing.T) {
	e, admin, alice := bodyEnv(t)
	for _, rt := range bodyRoutes {
		who := alice
		if rt.admin {
			who = admin
		}
		for _, body := range []string{`null`, ` null `, `[]`, `[{}]`, `1`, `"x"`, `true`, `{"`, `{}}`, `{} {}`, `{}x`} {
			if st, code, out := e.do(who, rt.method, rt.target, body); st != 400 || code != "MalformedJSON" {
				t.Errorf("%s %s %s: HTTP %d %.200s, want 400 MalformedJSON", rt.method, rt.target, body, st, out)
			}
		}
	}
}

// TestBodyIgnoredWhereNoneIsTaken: routes that take no body ignore one
// (docs/api.md, Conventions): a body, even one that is not JSON, changes
// nothing.
func TestBodyIgnoredWhereNoneIsTaken(t *testing.T) {
	e := newNodeEnv(t, nil)
	alice, aliceCert := e.user("alice", false)
	_, admin := e.user("root", true)
	for _, body := range []string{`{"size":"1GiB","name":"v"}`, `{"size":"1GiB","name":"w"}`} {
		if st, _, out := e.do(aliceCert, "POST", "/v1/volumes", body); st != 201 {
			t.Fatalf("create: %d %s", st, out)
		}
	}
	for _, c := range []struct {
		who            []*x509.Certificate
		method, target string
		status         int
	}{
		{aliceCert, "GET", "/v1/volumes/v", 200},
		{aliceCert, "GET", "/v1/volumes", 200},
		{aliceCert, "POST", "/v1/volumes/v/flatten", 202},
		{aliceCert, "DELETE", "/v1/volumes/w", 204},
		{admin, "GET", "/v1/users/" + alice, 200},
		// Last: it revokes aliceCert.
		{admin, "POST", "/v1/users/" + alice + "/credentials", 201},
	} {
		if st, _, out := e.do(c.who, c.method, c.target, `{"force":true} not json`); st != c.status {
			t.Errorf("%s %s with a body: HTTP %d %.200s, want %d", c.method, c.target, st, out, c.status)
		}
	}
}

// TestContentTypeNotChecked: the body is read as JSON whatever the
// Content-Type says (docs/api.md, Conventions), as curl -d sends
// application/x-www-form-urlencoded; the JSON itself is checked as strictly
// as ever.
func TestContentTypeNotChecked(t *testing.T) {
	e := newNodeEnv(t, nil)
	_, alice := e.user("alice", false)
	for _, ct := range []string{"", "application/json", "application/json; charset=utf-8", "text/plain",
		"application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml"} {
		for body, want := range map[string]int{`{"size":"1MiB"}`: 201, `size=1MiB`: 400} {
			r := httptest.NewRequest("POST", "/v1/volumes", strings.NewReader(body))
			r.TLS = &tls.ConnectionState{PeerCertificates: alice}
			if ct != "" {
				r.Header.Set("Content-Type", ct)
			}
			w := httptest.NewRecorder()
			e.s.ServeHTTP(w, r)
			if w.Code != want {
				out, _ := io.ReadAll(w.Body)
				t.Errorf("Content-Type %q, %s: HTTP %d %s, want %d", ct, body, w.Code, out, want)
			}
		}
	}
}

// TestJoinTokenBodyOptional: POST /v1/nodes/join-token's body is optional
// (docs/api.md); one of only white space is none, not an empty object
// refused with "request body is empty; expected a JSON object".
func TestJoinTokenBodyOptional(t *testing.T) {
	e := newNodeEnv(t, nil)
	_, admin := e.user("root", true)
	for _, body := range []string{"", "\n", " \r\n\t"} {
		if st, _, out := e.do(admin, "POST", "/v1/nodes/join-token", body); st != 201 {
			t.Errorf("join-token %q: HTTP %d %s, want 201", body, st, out)
		}
	}
}

// TestSizeOutOfRange: a size that is no whole number of bytes in (0,
// 1 EiB] — too large for int64, for 1 EiB, negative, fractional (also
// in exponent form), of another type — is 400 InvalidSize on create and
// extend, never a 500 or a volume. (1e3 and 512.0 are whole numbers:
// TestSizeJSONFloatNotation.)
func TestSizeOutOfRange(t *testing.T) {
	e := newNodeEnv(t, nil)
	_, alice := e.user("alice", false)
	if st, _, out := e.do(alice, "POST", "/v1/volumes", `{"size":"1GiB","name":"v"}`); st != 201 {
		t.Fatalf("create: %d %s", st, out)
	}
	for _, size := range []string{`99999999999999999999999`, `9223372036854775808`, `-9223372036854775809`,
		`1152921504606846977`, `"1152921504606846977"`, `"2EiB"`, `"9999999999PiB"`, `-512`, `0`, `1e-3`, `512.5`, `1e19`,
		`"0.5B"`, `true`, `null`, `""`} {
		for _, target := range []string{"/v1/volumes", "/v1/volumes/v/extend"} {
			body := `{"size":` + size + `}`
			if st, code, out := e.do(alice, "POST", target, body); st != 400 || code != "InvalidSize" {
				t.Errorf("POST %s %s: HTTP %d %.200s, want 400 InvalidSize", target, body, st, out)
			}
		}
	}
}
