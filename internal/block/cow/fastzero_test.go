package cow

import (
	"bytes"
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// TestFastZero: cow declares fast zeroing (so every volume, cow on top,
// offers NBD's FAST_ZERO). A fast zero of chunks the top holds, or nobody
// holds, is done by the top's stack; one touching a chunk a base holds,
// which would need a copy-up, fails with ErrNotSupported having changed
// nothing, and the same zero without Fast still works.
func TestFastZero(t *testing.T) {
	const chunk = 8192 // fileSpec's
	env := testEnv(t, 8*chunk)
	l := build(t, env, fileSpec)
	if c := l.Capabilities(); !c.WriteZeroes || !c.FastZero {
		t.Fatalf("capabilities %+v: no fast zero", c)
	}
	model := make([]byte, 8*chunk)
	write := func(off int64, p []byte) {
		t.Helper()
		if err := l.WriteAt(p, off, false); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
	zero := func(off, n int64, f block.ZeroFlags) error {
		err := l.WriteZeroes(off, n, f)
		if err == nil {
			clear(model[off : off+n])
		}
		return err
	}
	fast := block.ZeroFlags{Fast: true}

	write(0, bytes.Repeat([]byte{0xAA}, 4*chunk)) // chunks 0-3
	snapModel := append([]byte(nil), model...)
	img, err := l.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	write(chunk, bytes.Repeat([]byte{0xBB}, chunk)) // chunk 1 copied up to the top

	// Chunk 1 (top) and chunk 2 (base): refused, neither changed.
	if err := zero(chunk, 2*chunk, fast); !errors.Is(err, block.ErrNotSupported) {
		t.Fatalf("fast zero over a base-held chunk: %v, want ErrNotSupported", err)
	}
	expect(t, l, model, "after a refused fast zero")
	// Part of a base-held chunk: refused.
	if err := zero(3*chunk+100, 1000, fast); !errors.Is(err, block.ErrNotSupported) {
		t.Fatalf("fast zero inside a base-held chunk: %v, want ErrNotSupported", err)
	}
	expect(t, l, model, "after a refused fast zero")
	// Inside the top's chunk 1, and over chunks nobody holds (4-7, in
	// every mode): done.
	if err := zero(chunk+100, 1000, fast); err != nil {
		t.Fatalf("fast zero inside a top-held chunk: %v", err)
	}
	write(5*chunk, bytes.Repeat([]byte{0xCC}, chunk))
	for _, f := range []block.ZeroFlags{fast, {Fast: true, NoHole: true}, {Fast: true, FUA: true}} {
		write(4*chunk+7, bytes.Repeat([]byte{0xDD}, 2*chunk)) // chunk 7 untouched at first
		if err := zero(4*chunk, 4*chunk, f); err != nil {
			t.Fatalf("fast zero %+v over chunks the top holds or nobody held: %v", f, err)
		}
		expect(t, l, model, "after a fast zero")
	}
	// The refused zero, without Fast, copies up.
	if err := zero(chunk, 2*chunk, block.ZeroFlags{}); err != nil {
		t.Fatal(err)
	}
	expect(t, l, model, "after a zero over a base-held chunk")

	l = reopen(t, l, &env, fileSpec)
	defer l.Close()
	expect(t, l, model, "reopened")
	c := clone(t, env, img, fileSpec)
	defer c.Close()
	expect(t, c, snapModel, "the snapshot")
}
