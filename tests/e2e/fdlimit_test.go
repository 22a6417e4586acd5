package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestOutOfDescriptors: the server process runs out of file descriptors
// for a while — its limit lowered under it (prlimit), then connections
// opened to its S3 and NBD ports until it cannot accept more, as a storm
// of clients does. Once descriptors are free again, both serve again
// without a restart: S3 (whose HTTP server stops on such an accept error,
// and is started again) and NBD (which keeps accepting).
func TestOutOfDescriptors(t *testing.T) {
	requireTools(t, "prlimit", "aws", "nbdinfo")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	s3 := n.S3User(admin)
	s3.AWSOK("s3api", "create-bucket", "--bucket", "fds")
	body := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(body, []byte("still here"), 0o600); err != nil {
		t.Fatal(err)
	}
	s3.AWSOK("s3api", "put-object", "--bucket", "fds", "--key", "k", "--body", body)
	admin.CreateVolume("--size", "16MiB", "--name", "v")
	a := admin.Attach("v", "h1", "rw")

	pid := strconv.Itoa(n.cmd.Process.Pid)
	fds, err := os.ReadDir(filepath.Join("/proc", pid, "fd"))
	if err != nil {
		t.Fatal(err)
	}
	limits := strings.Fields(toolOK(t, time.Minute, "prlimit", "--pid", pid, "--nofile", "--noheadings", "--output", "SOFT,HARD").Stdout)
	if len(limits) != 2 {
		t.Fatalf("prlimit: %q", limits)
	}
	restore := func() { toolOK(t, time.Minute, "prlimit", "--pid", pid, "--nofile="+limits[0]+":"+limits[1]) }
	toolOK(t, time.Minute, "prlimit", "--pid", pid, fmt.Sprintf("--nofile=%d:%s", len(fds)+8, limits[1]))
	restored := false
	t.Cleanup(func() {
		if !restored {
			restore()
		}
	})
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, port := range []int{n.S3, n.NBD} {
		for range 24 {
			// Some are reset: the server cannot take them.
			if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second); err == nil {
				conns = append(conns, c)
			}
		}
	}
	time.Sleep(2 * time.Second) // the server's accepts fail meanwhile
	restore()
	restored = true
	for _, c := range conns {
		c.Close()
	}
	conns = nil

	got := filepath.Join(t.TempDir(), "got")
	for start := time.Now(); ; time.Sleep(500 * time.Millisecond) {
		r := s3.AWS("s3api", "get-object", "--bucket", "fds", "--key", "k", got)
		if r.Code == 0 {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("S3 does not serve again 30s after descriptors were free: %s", r)
		}
	}
	if b, err := os.ReadFile(got); err != nil || string(b) != "still here" {
		t.Errorf("GET after the descriptor shortage: %q, %v", b, err)
	}
	nbdinfo(t, a.NBDURI)
	if log := n.Log(); !strings.Contains(log, "too many open files") {
		t.Errorf("the server never ran out of descriptors: the test did not test anything")
	}
}
