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

// A success with no body, where an answer is expected, is no answer: it
// once printed a record of zeroes (`basalt status` of a server whose
// status did not encode).
func TestEmptyAnswer(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	trusting := &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	var out struct{ Node string }
	err := New(srv.URL, trusting).do(context.Background(), http.MethodGet, "/v1/status", nil, &out)
	if e, ok := errs.As(err); !ok || e.Code != CodeBadResponse {
		t.Fatalf("an empty 200: %v", err)
	}
	if err := New(srv.URL, trusting).do(context.Background(), http.MethodDelete, "/v1/volumes/x", nil, nil); err != nil {
		t.Fatalf("an empty 200 where no answer is expected: %v", err)
	}
}
