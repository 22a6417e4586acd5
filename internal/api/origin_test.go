package api

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A state-changing request a browser sends from another site's page is
// refused before routing or authentication: with a client certificate
// installed, the browser would present it for that page's form too.
// Requests without the browser's headers — every client that is not a
// browser — and safe methods are routed as before.
func TestCrossOriginRefused(t *testing.T) {
	s := New(Deps{Log: slog.New(slog.DiscardHandler)})
	do := func(method string, hdr map[string]string) (int, string) {
		r := httptest.NewRequest(method, "https://node:8443/v1/volumes", strings.NewReader(`{"size":"1GiB"}`))
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		var eb ErrorBody
		json.Unmarshal(w.Body.Bytes(), &eb)
		return w.Code, eb.Error.Code
	}
	for _, h := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site"},
		{"Origin": "https://evil.example"},
	} {
		if st, code := do(http.MethodPost, h); st != http.StatusForbidden || code != "CrossOriginRequest" {
			t.Errorf("POST with %v: %d %s, want 403 CrossOriginRequest", h, st, code)
		}
	}
	// Not a browser's, or a browser's own page, or a safe method: on to
	// authentication (this request has no TLS: CertificateRequired).
	for _, c := range []struct {
		method string
		hdr    map[string]string
	}{
		{http.MethodPost, nil},
		{http.MethodPost, map[string]string{"Sec-Fetch-Site": "same-origin"}},
		{http.MethodPost, map[string]string{"Sec-Fetch-Site": "none"}},
		{http.MethodGet, map[string]string{"Sec-Fetch-Site": "cross-site"}},
	} {
		if _, code := do(c.method, c.hdr); code != "CertificateRequired" {
			t.Errorf("%s with %v: %s, want CertificateRequired", c.method, c.hdr, code)
		}
	}
}
