package cow

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
)

// TestResizeAfterRefusedCommit: a snapshot whose cow.sb write the full
// store refused may have landed, so cow.sb may name the refused snapshot's
// new image rather than the top the layer goes on with. A Resize then
// grows that top and is acknowledged; it must settle cow.sb first (as a
// write does), or a reopen before anything else rewrote cow.sb finds the
// other image, at the old size: the acknowledged growth is lost.
func TestResizeAfterRefusedCommit(t *testing.T) {
	const chunk = 8192
	fm := &fullMeta{names: []string{volFile}}
	env := testEnv(t, 8*chunk)
	env.MetaFS = fm.open
	l := build(t, env, fileSpec)
	defer func() { l.Close() }()
	data := bytes.Repeat([]byte{1}, chunk)
	if err := l.WriteAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	top := l.Top()
	fm.full.Store(true)
	if _, err := l.Snapshot("s"); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("snapshot with cow.sb refused: %v, want ENOSPC", err)
	}
	fm.full.Store(false)
	if err := l.Resize(16 * chunk); err != nil {
		t.Fatalf("resize once space is back: %v", err)
	}
	// A crash now: nothing flushed or wrote since the resize.
	l.Close()
	env.Create = false
	l = build(t, env, fileSpec)
	if l.Top() != top || l.Size() != 16*chunk {
		t.Fatalf("after reopen: top %s of %d bytes, want %s of %d bytes (the acknowledged resize)", l.Top(), l.Size(), top, 16*chunk)
	}
	got := make([]byte, chunk)
	if err := l.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after reopen chunk 0: %v, or not what was flushed", err)
	}
}
