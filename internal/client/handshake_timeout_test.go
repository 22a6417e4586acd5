package client

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
)

// TestStalledHandshakeEnds: a node that accepts connections but never
// answers the TLS handshake (stopped, wedged, its accept backlog still
// taking connections) is Unreachable after a bounded time, also for the
// calls without an overall timeout (object export, unexport, verify:
// long), whose context is the CLI's background one. Their transport had
// no handshake or dial timeout, so `basalt object verify` against such a
// node waited for ever instead of failing.
func TestStalledHandshakeEnds(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	c := New("https://"+l.Addr().String(), &tls.Config{})
	done := make(chan error, 1)
	go func() {
		_, err := c.VerifyObjects(context.Background(), "b", false, false)
		done <- err
	}()
	select {
	case err := <-done:
		if e, ok := errs.As(err); !ok || e.Code != CodeUnreachable {
			t.Fatalf("a stalled handshake: %v, want %s", err, CodeUnreachable)
		}
	case <-time.After(tlsHandshakeTimeout + 20*time.Second):
		t.Fatal("verify against a node that never answers the handshake did not end")
	}
}
