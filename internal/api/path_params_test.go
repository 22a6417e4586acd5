package api

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// pathParamRoutes are the routes that take a path parameter, with a body
// they would accept.
var pathParamRoutes = []struct{ method, pattern, body string }{
	{"DELETE", "/v1/nodes/{name}", ""},
	{"GET", "/v1/users/{name}", ""},
	{"DELETE", "/v1/users/{name}", ""},
	{"POST", "/v1/users/{name}/credentials", ""},
	{"GET", "/v1/volumes/{id}", ""},
	{"DELETE", "/v1/volumes/{id}", ""},
	{"POST", "/v1/volumes/{id}/extend", `{"size":"2GiB"}`},
	{"POST", "/v1/volumes/{id}/flatten", ""},
	{"POST", "/v1/volumes/{id}/repair", ""},
	{"POST", "/v1/volumes/{id}/scrub", ""},
	{"GET", "/v1/types/{name}", ""},
	{"DELETE", "/v1/types/{name}", ""},
	{"GET", "/v1/snapshots/{id}", ""},
	{"DELETE", "/v1/snapshots/{id}", ""},
	{"POST", "/v1/snapshots/{id}/export", `{"to":"s3://b/k"}`},
	{"GET", "/v1/attachments/{id}", ""},
	{"DELETE", "/v1/attachments/{id}", ""},
}

// TestPathParameterOddBytes: whatever a path parameter holds — NUL, an
// escaped slash, bytes that are not UTF-8, a dot segment, nothing, 200 KB
// — every route answers a JSON error saying that nothing has that name (or
// that the request is invalid), never a 500, a panic or a redirect to
// another route, and neither the answer nor the log line carries a huge
// value. Dot and empty segments used to get net/http's 307 redirect (an
// HTML body) to the cleaned path: GET /v1/volumes/. led to the volume list,
// POST /v1/volumes/./extend to a volume named "extend". A 200 KB id was
// logged in full with the request, and echoed in the error message.
func TestPathParameterOddBytes(t *testing.T) {
	e := newNodeEnv(t, stubObjects{})
	_, admin := e.user("root", true)
	_, alice := e.user("alice", false)
	var log bytes.Buffer
	e.s.d.Log = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	long := strings.Repeat("a", 200<<10)
	values := []string{"%00", "a%00b", "%2F", "a%2Fb", "%FF", "%C3%28", "%2E%2E", "%20", long, ".", "..", ""}
	for _, rt := range pathParamRoutes {
		for _, v := range values {
			target := strings.NewReplacer("{name}", v, "{id}", v).Replace(rt.pattern)
			for _, who := range [][]*x509.Certificate{admin, alice} {
				log.Reset()
				r := httptest.NewRequest(rt.method, target, strings.NewReader(rt.body))
				r.TLS = &tls.ConnectionState{PeerCertificates: who}
				w := httptest.NewRecorder()
				e.s.ServeHTTP(w, r)
				shown := target
				if len(shown) > 80 {
					shown = shown[:80] + "…"
				}
				var eb ErrorBody
				if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil || eb.Error.Code == "" {
					t.Errorf("%s %s: HTTP %d %.200q, want a JSON error", rt.method, shown, w.Code, w.Body)
					continue
				}
				// AdminRequired: an ordinary user on an administrator's route.
				ok := []string{"NotFound", "InvalidRequest", "UnknownVolumeType", "AdminRequired"}
				if w.Code < 400 || w.Code >= 500 || !slices.Contains(ok, eb.Error.Code) {
					t.Errorf("%s %s: HTTP %d %s %.200q, want 404 NotFound or 400 InvalidRequest", rt.method, shown, w.Code, eb.Error.Code, eb.Error.Message)
				}
				if len(eb.Error.Message) > 4<<10 {
					t.Errorf("%s %s: a message of %d bytes", rt.method, shown, len(eb.Error.Message))
				}
				if log.Len() > 4<<10 {
					t.Errorf("%s %s: logged %d bytes", rt.method, shown, log.Len())
				}
			}
		}
	}
}
