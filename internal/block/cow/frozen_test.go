package cow

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// smallMirrorSpec: a mirror below cow whose regions are the chunks.
const smallMirrorSpec = `{"type":"cow","params":{"chunk":8192},"children":[{"type":"mirror","params":{"region":8192},"children":[{"type":"file","params":{"path":"leg0.img"}},{"type":"file","params":{"path":"leg1.img"}}]}]}`

// TestCollapseBesideFrozenInstance: a volume froze an image (it still has
// the read-write instance it wrote as the top, and holds the image's
// frozen lock), then was flattened off it, while a clone sits on the
// image. With the snapshot deleted, the clone collapses the image into its
// top. Its collapse must not open a second read-write instance beside the
// volume's: the volume's mirror, closing, writes its stale write-intent
// map over the one the clone's writes rely on, and after a power loss a
// region whose legs differ is not resynchronised — the clone reads two
// versions of one chunk. (As for maintainers: it waits until that volume
// closes, here after a refusal.)
func TestCollapseBesideFrozenInstance(t *testing.T) {
	const chunk = 8192
	fs := blocktest.NewFaultFS()
	env := testEnv(t, 8*chunk)
	env.MetaFS = fs.Open
	spec := blocktest.Cached(t, smallMirrorSpec)
	v := build(t, env, spec)
	// The FaultFS keeps metadata in memory; the frozen lock is a flock on
	// the real image.sb (holdFrozen): give it a file to lock.
	if err := os.WriteFile(filepath.Join(env.Images, v.Top(), imgFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	vOpen := true
	defer func() {
		if vOpen {
			v.Close()
		}
	}()
	if err := v.WriteAt(bytes.Repeat([]byte{0xA0}, chunk), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(); err != nil {
		t.Fatal(err)
	}
	img, err := v.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	cenv := env
	cenv.Dir, cenv.Base = filepath.Join(t.TempDir(), "clone"), img
	c := build(t, cenv, spec)
	if err := c.WriteAt(bytes.Repeat([]byte{0xB1}, chunk), chunk, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := v.Flatten(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	// The snapshot is deleted: only the clone's top sits on img.
	if err := c.Collapse(context.Background(), img, nil); err != nil {
		if !errors.Is(err, ErrFrozenOpen) {
			t.Fatal(err)
		}
		if err := v.Close(); err != nil {
			t.Fatal(err)
		}
		vOpen = false
		if err := c.Collapse(context.Background(), img, nil); err != nil {
			t.Fatalf("collapse once the volume closed: %v", err)
		}
	}
	if c.Top() != img {
		t.Fatalf("top %s after the collapse, want %s", c.Top(), img)
	}
	if vOpen {
		if err := v.Close(); err != nil {
			t.Fatal(err)
		}
		vOpen = false
	}
	// A write into chunk 1, not flushed; the power fails with one leg's
	// copy of it on disk and not the other's.
	if err := c.WriteAt(bytes.Repeat([]byte{0xC2}, chunk), chunk, false); err != nil {
		t.Fatal(err)
	}
	fs.Keep = func(i int) bool { return i%2 == 0 }
	rfs := fs.Restart()
	c.Close()
	cenv.Create, cenv.MetaFS = false, rfs.Open
	c = build(t, cenv, spec)
	defer c.Close()
	// Reads take the legs in turn: every one must say the same.
	first := make([]byte, chunk)
	if err := c.ReadAt(first, chunk); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, bytes.Repeat([]byte{0xB1}, chunk)) && !bytes.Equal(first, bytes.Repeat([]byte{0xC2}, chunk)) {
		t.Fatalf("chunk 1 reads %x…, neither the flushed nor the newest data", first[:4])
	}
	for range 4 {
		got := make([]byte, chunk)
		if err := c.ReadAt(got, chunk); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, first) {
			t.Fatalf("chunk 1 reads %x… then %x…: the mirror's legs differ and no resync covered them", first[:4], got[:4])
		}
	}
}
