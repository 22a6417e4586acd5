package client

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
)

// Answers that are not the API's get codes that say so: a server whose
// certificate the identity's CA did not sign is not "unreachable" (a
// retry will not help), and an error page without the API's body is not
// the server's InternalError.
func TestForeignAnswers(t *testing.T) {
	proxy := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "<html>502 Bad Gateway</html>", http.StatusBadGateway)
	}))
	defer proxy.Close()
	trusting := &tls.Config{RootCAs: proxy.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}

	err := New(proxy.URL, trusting).do(context.Background(), http.MethodGet, "/v1/status", nil, nil)
	if e, ok := errs.As(err); !ok || e.Code != CodeBadResponse {
		t.Fatalf("a proxy's error page: %v", err)
	}

	err = New(proxy.URL, &tls.Config{}).do(context.Background(), http.MethodGet, "/v1/status", nil, nil)
	if e, ok := errs.As(err); !ok || e.Code != CodeServerUntrusted {
		t.Fatalf("a server of another CA: %v", err)
	}

	proxy.Close()
	err = New(proxy.URL, trusting).do(context.Background(), http.MethodGet, "/v1/status", nil, nil)
	if e, ok := errs.As(err); !ok || e.Code != CodeUnreachable {
		t.Fatalf("a server that is gone: %v", err)
	}
}
