package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A --name that cannot be a node's is refused before anything starts:
// no embedded etcd member, nothing in the data directory's meta/.
func TestBadNameRefusedFirst(t *testing.T) {
	dir := t.TempDir()
	cfg := nodeConfig(t, "bad/name", filepath.Join(dir, "data"), filepath.Join(dir, "store"))
	n, err := startNode(t, cfg)
	if err == nil {
		n.Close()
		t.Fatal("a node named bad/name started")
	}
	if !strings.Contains(err.Error(), "--name") || !strings.Contains(err.Error(), "InvalidName") {
		t.Fatalf("error %q does not name --name and InvalidName", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.Data, "meta")); !os.IsNotExist(err) {
		t.Fatalf("the embedded etcd started for a node named bad/name (meta/: %v)", err)
	}
}
