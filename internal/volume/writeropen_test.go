package volume

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// storeContent maps every file of the store to the hash of its bytes.
func storeContent(t *testing.T, e *env) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	err := filepath.WalkDir(e.st.Root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		out[p] = sha256.Sum256(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestWriterOpenAfterLeaseLostWritesNothing: a workflow that took the
// volume's lease, lost it, and only then opens the volume's stack is
// refused (TestWriterOpenedAfterLeaseLost) — and opening and closing that
// stack must not write the volume either: another node holds the lease
// now. Here the volume is mirrored, and this node's earlier writes left
// write-intent bits on disk (its stack was fenced before it could clear
// them), so a stack opened read-write resynchronises those regions and
// clears the bits at once, and its close syncs the intent map: writes,
// made while this node holds no lease at all, that its fence let through.
func TestWriterOpenAfterLeaseLostWritesNothing(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	a := e.started(Config{Node: uniq("a"), ImageGrace: time.Hour})
	b := e.started(Config{Node: uniq("b"), ImageGrace: time.Hour})
	v, err := a.CreateVolume(ctx, caller("alice"), CreateVolume{Name: "v", SizeBytes: 1 << 20, Type: "mirrored"})
	if err != nil {
		t.Fatal(err)
	}
	holder, token, err := a.leases.use(ctx, v.ID) // a workflow on a takes the lease
	if err != nil || holder != a.cfg.Node {
		t.Fatalf("use: %s, %v", holder, err)
	}
	defer a.leases.unuse(context.Background(), v.ID)
	// a writes (the mirror's intent bits are on disk before the write is
	// acknowledged) and keeps the stack open: its intent bits would be
	// cleared only seconds later.
	l, release, err := a.acquireWriter(e.volume(v.ID), token)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if err := l.WriteAt(bytes.Repeat([]byte{0x5a}, 64<<10), 0, false); err != nil {
		t.Fatal(err)
	}
	leaseLostTo(t, e, a, b, v.ID)
	before := storeContent(t, e)
	if l2, release2, err := a.acquireWriter(e.volume(v.ID), token); err == nil {
		release2()
		t.Fatalf("a opened the volume as its writer after losing the lease (%T)", l2)
	} else if !errors.Is(err, errLeaseLost) {
		t.Fatalf("a's open: %v, want %v", err, errLeaseLost)
	}
	for p, h := range storeContent(t, e) {
		if before[p] != h {
			t.Errorf("%s changed by a's refused open, while b holds the lease", p)
		}
	}
}
