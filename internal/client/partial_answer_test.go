package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/errs"
)

// TestAnswerBrokenOff: an answer whose status came but whose body broke
// off (the connection cut mid-body) is no "cannot reach": the status says
// what the server did. A create answered 201 was reported only as
// "reading the answer: unexpected EOF", with nothing to tell a caller
// that the volume exists, who would then create it again. The error
// names the status and, for a success, says the request was carried out.
func TestAnswerBrokenOff(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id": "vol-0123456789abcdef",`)
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack() // cut the connection mid-body
		if err == nil {
			conn.Close()
		}
	}))
	defer srv.Close()
	trusting := &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	c := New(srv.URL, trusting)
	c.http.Transport.(*http.Transport).ForceAttemptHTTP2 = false // Hijack is HTTP/1's

	_, err := c.CreateVolume(context.Background(), api.CreateVolumeRequest{Name: "v", Size: 1 << 20})
	e, ok := errs.As(err)
	if !ok || e.Code != CodeUnreachable {
		t.Fatalf("an answer broken off: %v, want %s", err, CodeUnreachable)
	}
	if !strings.Contains(e.Message, "201") || !strings.Contains(e.Message, "was carried out") {
		t.Fatalf("a create answered 201 whose body broke off is reported as %q: it must name the status and say "+
			"that the request was carried out", e.Message)
	}
}
