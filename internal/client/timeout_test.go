package client

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/errs"
)

// TestNoAnswerAfterSent: a request the server received but did not
// answer in time is not one that could not reach it. Reported as
// "cannot reach", a create that timed out — and may well have been
// carried out — invited the caller to repeat it, creating a second
// volume. The error says the request was sent and may have been done.
func TestNoAnswerAfterSent(t *testing.T) {
	release := make(chan struct{})
	received := make(chan struct{}, 1)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received <- struct{}{}
		<-release // the volume is being created; the answer comes too late
	}))
	defer srv.Close()
	trusting := &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	c := New(srv.URL, trusting)
	c.http.Timeout = 300 * time.Millisecond

	_, err := c.CreateVolume(context.Background(), api.CreateVolumeRequest{Name: "v", Size: 1 << 20})
	select {
	case <-received:
	default:
		t.Fatal("the request did not reach the server")
	}
	e, ok := errs.As(err)
	if !ok || e.Code != CodeUnreachable {
		t.Fatalf("a create the server did not answer in time: %v, want %s", err, CodeUnreachable)
	}
	if strings.Contains(e.Message, "cannot reach") || !strings.Contains(e.Message, "may have been carried out") {
		t.Fatalf("a create the server received but did not answer in time is reported as %q: "+
			"it must say that it was sent and may have been carried out", e.Message)
	}

	// Nothing sent: the server is gone. That one could not reach it.
	close(release)
	srv.Close()
	_, err = c.CreateVolume(context.Background(), api.CreateVolumeRequest{Name: "v", Size: 1 << 20})
	if e, ok := errs.As(err); !ok || e.Code != CodeUnreachable || !strings.Contains(e.Message, "cannot reach") {
		t.Fatalf("a server that is gone: %v", err)
	}
}
