package cow

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
)

// TestResizeBelowAFailedGrowth: a Resize grows the top's stack before it
// records the size in image.sb; when that record is refused (a full store,
// or a crash) the volume stays at its old size with a stack already
// larger. A later Resize to a size between the two — the volume service
// returns a failed extend to rest at the old size, so any new target is
// fair — must grow the volume, not fail because the stack "cannot shrink";
// and what it records must hold after a reopen.
func TestResizeBelowAFailedGrowth(t *testing.T) {
	const chunk = 8192
	fm := &fullMeta{names: []string{imgFile}}
	env := testEnv(t, 8*chunk)
	env.MetaFS = fm.open
	l := build(t, env, fileSpec)
	defer func() { l.Close() }()
	data := bytes.Repeat([]byte{7}, chunk)
	if err := l.WriteAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	fm.full.Store(true)
	if err := l.Resize(16 * chunk); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("resize with image.sb refused: %v, want ENOSPC", err)
	}
	fm.full.Store(false)
	if n := l.Size(); n != 8*chunk {
		t.Fatalf("size %d after the refused resize, want the old %d", n, 8*chunk)
	}
	if err := l.Resize(12 * chunk); err != nil {
		t.Fatalf("resize to less than the refused growth, once space is back: %v", err)
	}
	tail := bytes.Repeat([]byte{9}, chunk)
	if err := l.WriteAt(tail, 11*chunk, false); err != nil {
		t.Fatal(err)
	}
	l = reopen(t, l, &env, fileSpec)
	if n := l.Size(); n != 12*chunk {
		t.Fatalf("size %d after reopen, want %d", n, 12*chunk)
	}
	want := append(append(data, make([]byte, 10*chunk)...), tail...)
	expect(t, l, want, "grown after a refused growth, reopened")
}
