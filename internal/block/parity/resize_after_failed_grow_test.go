package parity

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// refusingMeta fails every metadata write while refusing is set.
type refusingMeta struct {
	block.MetaFile
	refusing *atomic.Bool
}

func (f refusingMeta) WriteAt(p []byte, off int64) (int, error) {
	if f.refusing.Load() {
		return 0, errInjected
	}
	return f.MetaFile.WriteAt(p, off)
}

// TestResizeBelowAFailedGrowth: a Resize grows the legs and the bitmap
// before the superblock records the size; when that write fails the
// device stays at its old size with legs and bitmap already larger. A
// later Resize to a size between the two (the volume service returns a
// failed extend to rest at the old size, so any new target is fair) must
// grow the device, not fail because the bitmap "cannot shrink"; and the
// size it records, and what is written there, must hold after a reopen.
func TestResizeBelowAFailedGrowth(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	const dsz = (n - 1) * chunk
	spec := specFor(n, chunk)
	fs := blocktest.NewFaultFS()
	var refusing atomic.Bool
	env := block.Env{Dir: t.TempDir(), Size: 4 * dsz, Create: true, MetaFS: func(path string) (block.MetaFile, error) {
		f, err := fs.Open(path)
		return refusingMeta{f, &refusing}, err
	}}
	l := build(t, env, spec)
	defer func() { l.Close() }()
	head := bytes.Repeat([]byte{5}, dsz)
	if err := l.WriteAt(head, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	refusing.Store(true)
	if err := l.Resize(12 * dsz); !errors.Is(err, errInjected) {
		t.Fatalf("resize with the superblock write refused: %v, want the injected error", err)
	}
	refusing.Store(false)
	if got := l.Size(); got != 4*dsz {
		t.Fatalf("size %d after the refused resize, want the old %d", got, 4*dsz)
	}
	if err := l.Resize(8*dsz + 512); err != nil {
		t.Fatalf("resize to less than the refused growth: %v", err)
	}
	tail := bytes.Repeat([]byte{9}, dsz)
	if err := l.WriteAt(tail, 7*dsz+512, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	env.Create = false
	l = build(t, env, spec)
	if got := l.Size(); got != 8*dsz+512 {
		t.Fatalf("size %d after reopen, want %d", got, 8*dsz+512)
	}
	want := append(append(head, make([]byte, 6*dsz+512)...), tail...)
	mustRead(t, l, want, "grown after a refused growth, reopened")
}
