package client

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/errs"
)

// TestRedirectNotFollowed: the API never redirects, so a redirect comes
// from something else (a proxy, a load balancer, another service on the
// port) and is reported as such. Followed, it turned a DELETE or POST
// into a GET of the new location (net/http does so for 301, 302 and
// 303), and that GET's 200 was reported as the deletion or creation
// done — though nothing was deleted or created.
func TestRedirectNotFollowed(t *testing.T) {
	var deletes, posts int
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodDelete:
			deletes++
			http.Redirect(w, r, "/elsewhere", http.StatusMovedPermanently)
		case http.MethodPost:
			posts++
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"id":"vol-1","name":"v","size_bytes":1,"status":"available"}`))
		}
	}))
	defer srv.Close()
	trusting := &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	c := New(srv.URL, trusting)

	err := c.DeleteVolume(context.Background(), "v")
	if e, ok := errs.As(err); !ok || e.Code != CodeBadResponse || !strings.Contains(e.Message, "/elsewhere") {
		t.Fatalf("DELETE answered by a redirect: %v, want %s naming where it pointed", err, CodeBadResponse)
	}
	v, err := c.CreateVolume(context.Background(), api.CreateVolumeRequest{Name: "v", Size: 1 << 20})
	if e, ok := errs.As(err); !ok || e.Code != CodeBadResponse {
		t.Fatalf("POST answered by a redirect: %+v, %v, want %s", v, err, CodeBadResponse)
	}
	if deletes != 1 || posts != 1 {
		t.Fatalf("%d DELETEs and %d POSTs sent, want one of each", deletes, posts)
	}
}
