package server

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
)

// TestSecondServerOnDataDirRefused: a second server started on the data
// directory of a running one (other ports, so no listener gives it
// away) is refused at once. Without that it went on to start a second
// etcd member on the first one's database and WAL: it hung, waiting
// for the database's lock, and took the data over the moment the first
// server stopped. Once the first server has stopped, the directory
// starts again.
func TestSecondServerOnDataDirRefused(t *testing.T) {
	tmp := t.TempDir()
	store := filepath.Join(tmp, "store")
	a := firstNode(t, tmp, store, 1)
	closed := false
	defer func() {
		if !closed {
			a.Close()
		}
	}()

	second := nodeConfig(t, "a", a.cfg.Data, store) // same data, fresh ports
	type result struct {
		n   *Node
		err error
	}
	res := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		n, err := Start(ctx, second, testLog(t))
		res <- result{n, err}
	}()
	select {
	case r := <-res:
		if r.err == nil {
			r.n.Close()
			t.Fatal("a second server started on the data directory of a running one")
		}
		if e, ok := errs.As(r.err); !ok || e.Code != CodeDataDirInUse || !strings.Contains(r.err.Error(), a.cfg.Data) {
			t.Fatalf("second server on the same data directory: %v, want %s naming the directory", r.err, CodeDataDirInUse)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a second server on the data directory of a running one was not refused within 20s")
	}

	// The lock goes with the server: the next start on the directory
	// (as after a stop, or a kill -9, which closes the lock file too)
	// is not refused.
	a.Close()
	closed = true
	again, err := startNodeOnce(t, a.cfg)
	if err != nil {
		t.Fatalf("restart on the data directory after the server stopped: %v", err)
	}
	again.Close()
}
