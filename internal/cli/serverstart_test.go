package cli

import (
	"bytes"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestJoinTokenWithoutJoin: --join-token without --join (the URL
// forgotten) is refused; it used to be ignored, and the node started a
// cluster of its own instead of joining one.
func TestJoinTokenWithoutJoin(t *testing.T) {
	dir := t.TempDir()
	done := make(chan runResult, 1)
	go func() {
		done <- mainRun("server", "--data", dir, "--api", freeAddr(t), "--s3", freeAddr(t), "--nbd", freeAddr(t),
			"--etcd-client", freeAddr(t), "--etcd-peer", freeAddr(t), "--voters", "1", "--join-token", "basalt-join.x.y")
	}()
	select {
	case r := <-done:
		if r.code != 1 || !strings.Contains(r.stderr, "(UsageError)") || !strings.Contains(r.stderr, "--join") {
			t.Errorf("server --join-token without --join: %+v", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("server --join-token without --join started a node")
	}
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReadyBannerEndpoint: the command `basalt server` suggests
// once ready works as printed: it names the endpoint when the API is not
// at the CLI's default, and an address the node's certificate covers
// (127.0.0.1, not the [::] of an --api without a host).
func TestReadyBannerEndpoint(t *testing.T) {
	dir := t.TempDir()
	_, port, _ := net.SplitHostPort(freeAddr(t))
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- Main([]string{"server", "--data", dir, "--api", ":" + port, "--s3", freeAddr(t), "--nbd", freeAddr(t),
			"--etcd-client", freeAddr(t), "--etcd-peer", freeAddr(t), "--voters", "1", "--log-level", "error"}, &stdout, &stderr)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(stderr.String(), "basalt status") {
		select {
		case code := <-done:
			t.Fatalf("server exited %d: %s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ready banner: %s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	banner := stderr.String()
	// The server stops on SIGTERM (runServer catches it).
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Error("server did not stop on SIGTERM")
	}
	if !strings.Contains(banner, "BASALT_ENDPOINT=https://127.0.0.1:"+port+" ") || strings.Contains(banner, "[::]") {
		t.Errorf("ready banner of a node on --api :%s:\n%s", port, banner)
	}
}
