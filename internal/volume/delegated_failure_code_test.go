package volume

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestDelegatedFailureKeepsItsCode: an extend that fails for a reason the
// caller can act on — here a size the file system cannot hold, EFBIG —
// answers InvalidSize (400) where it runs. Handed to the volume's writer,
// another node, and failing there, it answered 500 InternalError around
// the bare message: the failure's code was lost with the record. The
// record keeps it now (meta.Failure), and the waiting call answers as
// the writer would have.
func TestDelegatedFailureKeepsItsCode(t *testing.T) {
	// Files may not grow beyond 1 TiB in this process: truncating the
	// volume's file to 2 TiB fails with EFBIG on any file system (Go
	// ignores SIGXFSZ). Etcd's and the other tests' files stay far below.
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = 1 << 40
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_FSIZE, &old) })

	e := newEnv(t)
	cfg := Config{Overcommit: 1e6} // provisioning allows 2 TiB
	cfg.Node = uniq("a")
	a := e.started(cfg)
	cfg.Node = uniq("b")
	b := e.started(cfg)
	e.settle()
	ctx := ctxT(t)
	alice := caller("alice")
	const huge = 2 << 40

	// Where it runs: what the API answers InvalidSize (errs.Public).
	local, err := a.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.ExtendVolume(ctx, alice, local.ID, huge)
	if e, ok := errs.Public(err); !ok || e.Code != errs.CodeInvalidSize {
		t.Fatalf("extend to 2 TiB where it runs: %v; want what the API answers InvalidSize", err)
	}

	// Handed to b, which writes the volume: the same answer.
	v := e.writtenBy(a, b, alice)
	_, err = a.ExtendVolume(ctx, alice, v.ID, huge)
	e2, ok := errs.Public(err)
	if !ok || e2.Code != errs.CodeInvalidSize {
		t.Fatalf("extend to 2 TiB handed to b: %v; want InvalidSize", err)
	}
	if e := e2; e.Kind.Status() != 400 || !strings.Contains(e.Message, v.ID) || !strings.Contains(e.Message, "smaller size") {
		t.Errorf("delegated extend's error: %d %q; want 400 naming the volume and what to do", e.Kind.Status(), e.Message)
	}
	cur := e.volume(v.ID)
	if cur.SizeBytes != 1<<20 || cur.Status != meta.StatusInUse || cur.Failure == nil || cur.Failure.Code != errs.CodeInvalidSize {
		t.Errorf("volume after the failed extend: %d bytes, %s, failure %+v", cur.SizeBytes, cur.Status, cur.Failure)
	}
	// A later success clears it.
	if _, err := a.ExtendVolume(ctx, alice, v.ID, 2<<20); err != nil {
		t.Fatal(err)
	}
	if cur := e.volume(v.ID); cur.Failure != nil || cur.StatusMessage != "" {
		t.Errorf("volume after a successful extend still records a failure: %+v %q", cur.Failure, cur.StatusMessage)
	}
}
