package server

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestServicePortsBoundFirst: the service ports are bound before the
// embedded member's listeners, so a member port chosen by the kernel can
// never be one of them. Shown with the member's HTTP endpoint told to
// use the S3 port: the member, not the gateway, must be the one refused.
func TestServicePortsBoundFirst(t *testing.T) {
	tmp := t.TempDir()
	cfg := nodeConfig(t, "a", filepath.Join(tmp, "a"), filepath.Join(tmp, "store"))
	cfg.EtcdHTTP = cfg.S3
	n, err := startNodeOnce(t, cfg) // the port taken on purpose: no second try
	if err == nil {
		n.Close()
		t.Fatal("started with the member's HTTP port equal to the S3 port")
	}
	if strings.Contains(err.Error(), "s3 listen") {
		t.Fatalf("the gateway was refused its port, so the member bound first: %v", err)
	}
	// Nothing is left holding a port: the same addresses start a node.
	cfg.EtcdHTTP = freeAddr(t)
	n, err = startNode(t, cfg)
	if err != nil {
		t.Fatalf("start after the failed start: %v", err)
	}
	n.Close()
}

// TestS3PortZero: --s3 HOST:0 serves on the port the kernel chose, and
// the S3 URL handed to users (s3.env) names that port.
func TestS3PortZero(t *testing.T) {
	tmp := t.TempDir()
	cfg := nodeConfig(t, "a", filepath.Join(tmp, "a"), filepath.Join(tmp, "store"))
	cfg.S3 = "127.0.0.1:0"
	n, err := startNode(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	_, port, err := net.SplitHostPort(strings.TrimPrefix(n.s3URL(), "http://"))
	if err != nil || port == "0" {
		t.Fatalf("S3 URL %q: want the bound port", n.s3URL())
	}
	c, err := net.Dial("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatalf("S3 URL %q: %v", n.s3URL(), err)
	}
	c.Close()
}
