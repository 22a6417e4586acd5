package cow

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// TestSnapshotReadInPlace: read-only with Env.Base opens a snapshot's image
// as it was frozen, whatever the volume wrote since, and writes nothing.
func TestSnapshotReadInPlace(t *testing.T) {
	env := testEnv(t, 1<<20)
	l := build(t, env, fileSpec)
	defer l.Close()
	rng := rand.New(rand.NewPCG(3, 3))
	model := make([]byte, env.Size)
	randomOps(t, rng, l, model, 40)
	img, err := l.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	frozen := append([]byte(nil), model...)
	randomOps(t, rng, l, model, 40)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	renv := env
	renv.Dir, renv.Create, renv.ReadOnly, renv.Base = t.TempDir(), false, true, img
	s := build(t, renv, fileSpec)
	defer s.Close()
	expect(t, s, frozen, "snapshot read in place")
	expect(t, l, model, "volume")
	if err := s.WriteAt([]byte{1}, 0, false); err == nil {
		t.Fatal("a write to a snapshot read in place succeeded")
	}
	if ents, _ := os.ReadDir(renv.Dir); len(ents) != 0 {
		t.Fatalf("reading a snapshot created %d files in its directory", len(ents))
	}
}

// TestCopyOutIn: a snapshot copied to a file (block.CopyOut, by the cow
// and file layers' FileCopier) holds exactly the snapshot's bytes, with
// its never-written chunks as holes; a new volume filled from that file
// (block.CopyIn) reads the same; and no write through one changes the
// other, nor the snapshot.
func TestCopyOutIn(t *testing.T) {
	const size = 4<<20 + 8192 + 512 // not a multiple of the chunk
	env := testEnv(t, size)
	l := build(t, env, fileSpec)
	defer l.Close()
	rng := rand.New(rand.NewPCG(5, 5))
	model := make([]byte, size)
	// Data in the first half only: the second half must stay holes.
	for range 30 {
		off := rng.Int64N(size / 2)
		p := make([]byte, min(rng.Int64N(20<<10)+1, size/2-off))
		for i := range p {
			p[i] = byte(rng.Uint32()) | 1
		}
		if err := l.WriteAt(p, off, false); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
	img, err := l.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	frozen := append([]byte(nil), model...)
	randomOps(t, rng, l, model, 20) // after the snapshot: must not show

	renv := env
	renv.Dir, renv.Create, renv.ReadOnly, renv.Base = t.TempDir(), false, true, img
	s := build(t, renv, fileSpec)
	defer s.Close()
	path := filepath.Join(t.TempDir(), "image.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var seen int64
	rep, err := block.CopyOut(s, f, size, func(done, total int64) { seen = done })
	if err != nil {
		t.Fatal(err)
	}
	if seen != size || rep.Bytes != size {
		t.Fatalf("progress ended at %d, report %+v; want %d", seen, rep, size)
	}
	if rep.DataBytes == 0 || rep.DataBytes > size/2+8192 || rep.UserBytes != 0 {
		t.Fatalf("report %+v: want data from the written half only, none through user space", rep)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, frozen) {
		t.Fatal("the exported file differs from the snapshot")
	}
	if a := allocated(t, path); a >= size*3/4 {
		t.Fatalf("the exported file has %d bytes allocated of %d: the never-written half was not left as holes", a, int64(size))
	}

	// A new volume from the file.
	nenv := testEnv(t, size)
	v := build(t, nenv, fileSpec)
	defer v.Close()
	if _, err := block.CopyIn(v, f, size, nil); err != nil {
		t.Fatal(err)
	}
	expect(t, v, frozen, "volume made from the file")
	// Writes through either name stay there.
	if err := v.WriteAt(bytes.Repeat([]byte{0xee}, 8192), 0, false); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, frozen) {
		t.Fatal("a write to the new volume changed the file")
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xdd}, 8192), 8192); err != nil {
		t.Fatal(err)
	}
	vm := append([]byte(nil), frozen...)
	copy(vm, bytes.Repeat([]byte{0xee}, 8192))
	expect(t, v, vm, "new volume after the file was written")
	expect(t, s, frozen, "snapshot after both were written")
	expect(t, l, model, "origin volume")

	// After a reopen the imported chunks are the top's (bits persisted by
	// CopyIn's flush), also across a snapshot of the new volume.
	if _, err := v.Snapshot("t"); err != nil {
		t.Fatal(err)
	}
	v.Close()
	nenv.Create = false
	v = build(t, nenv, fileSpec)
	expect(t, v, vm, "new volume after snapshot and reopen")
}

// allocated is the space a file's blocks take.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}
