package parity

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// fillingSpec is specFor with every leg under a filling layer
// (blocktest.FillingType); it returns their switches, by leg.
func fillingSpec(t *testing.T, n int, chunk int64) (string, []*atomic.Bool) {
	return refusingSpec(t, n, chunk, syscall.ENOSPC)
}

// refusingSpec is fillingSpec whose legs' file system, switched on, is
// full (errno ENOSPC) or read-only (EROFS).
func refusingSpec(t *testing.T, n int, chunk int64, errno syscall.Errno) (string, []*atomic.Bool) {
	var kids []string
	var sw []*atomic.Bool
	for i := range n {
		id := fmt.Sprintf("%s/%d", t.Name(), i)
		sw = append(sw, blocktest.NewFullSwitch(id))
		child := fmt.Sprintf(`{"type":"file","params":{"path":"leg%d.img"}}`, i)
		kids = append(kids, blocktest.RefusingSpec(id, errno, child))
	}
	return fmt.Sprintf(`{"type":"parity","params":{"chunk":%d},"children":[%s]}`, chunk, strings.Join(kids, ",")), sw
}

func setAll(sw []*atomic.Bool, v bool) {
	for _, s := range sw {
		s.Store(v)
	}
}

func wantNoSpace(t *testing.T, err error, what string) {
	t.Helper()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("%s on a full store: %v, want ENOSPC", what, err)
	}
}

func wantAllOK(t *testing.T, l *Layer, what string) {
	t.Helper()
	if st := string(l.state); strings.Trim(st, string(legOK)) != "" || l.frozen.Load() {
		t.Fatalf("%s: leg states %q (frozen %v), want every leg ok: a full store is not a failed leg", what, st, l.frozen.Load())
	}
}

// TestOpenWhileStoreFull: a parity volume detached while its store is full
// (its close cannot flush, so the stripes written last keep their intent
// bits) must open again while the store is still full: recovering those
// stripes needs parity writes the legs refuse, which must not make the
// volume unavailable. It opens, reads, refuses writes with the file
// system's error, and recovers once space is back — before the first
// update, so every stripe's parity matches its data afterwards.
func TestOpenWhileStoreFull(t *testing.T) {
	const chunk = 4096
	spec, full := fillingSpec(t, 3, chunk)
	dsz := int64(2 * chunk)
	env := block.Env{Dir: t.TempDir(), Size: 16 * dsz, Create: true}
	l := build(t, env, spec)
	rng := rand.New(rand.NewPCG(41, 1))
	model := randBytes(rng, env.Size)
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{100, 5*dsz + 3000, 11 * dsz} {
		p := randBytes(rng, 5000)
		if err := l.WriteAt(p, off, false); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
	setAll(full, true)
	if err := l.Close(); err == nil {
		t.Fatal("close over full legs flushed nothing, and said nothing")
	}

	env.Create = false
	l = build(t, env, spec)
	defer func() { l.Close() }()
	wantAllOK(t, l, "opened on a full store")
	mustRead(t, l, model, "opened on a full store")
	wantNoSpace(t, l.WriteAt(randBytes(rng, 3000), 7*dsz, false), "write")
	wantNoSpace(t, l.Flush(), "flush")
	mustRead(t, l, model, "after refused writes")

	setAll(full, false)
	p := randBytes(rng, 3000)
	if err := l.WriteAt(p, 7*dsz, false); err != nil {
		t.Fatalf("write once space is back: %v", err)
	}
	copy(model[7*dsz:], p)
	if err := l.Flush(); err != nil {
		t.Fatalf("flush once space is back: %v", err)
	}
	wantAllOK(t, l, "space back")
	mustRead(t, l, model, "space back")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkParity(t, env, 3, chunk)
}

// TestNoSpaceFailsNoLeg: a leg that refuses part of a stripe update for
// want of space is not broken — the store is full — so it must not be
// failed (degrading the volume; a second leg refusing would freeze it, and
// writes would fail with EIO instead of ENOSPC until a reopen). The update
// fails with the file system's error. Its stripe may be left with parity
// that does not match its data; no later update may build on that, and
// once space is back the parity is recomputed before anything else, so a
// leg lost afterwards reconstructs exactly what the volume read.
func TestNoSpaceFailsNoLeg(t *testing.T) {
	const chunk = 4096
	spec, full := fillingSpec(t, 3, chunk)
	dsz := int64(2 * chunk)
	env := block.Env{Dir: t.TempDir(), Size: 16 * dsz, Create: true}
	l := build(t, env, spec)
	defer func() { l.Close() }()
	rng := rand.New(rand.NewPCG(42, 1))
	model := randBytes(rng, env.Size)
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}

	const s = 2
	full[l.parityLeg(s)].Store(true) // the data lands, the parity does not
	off := s*dsz + 1000
	wantNoSpace(t, l.WriteAt(randBytes(rng, 2000), off, false), "a stripe update")
	wantAllOK(t, l, "after a refused update")
	if err := l.ReadAt(model[off:off+2000], off); err != nil { // what it reads now
		t.Fatal(err)
	}
	// The stripe's parity is stale now: a second update of it must not
	// fold its change into that parity. Neither may any update go on
	// while the store is full.
	setAll(full, true)
	wantNoSpace(t, l.WriteAt(randBytes(rng, 100), s*dsz+chunk+10, false), "a second update")
	wantNoSpace(t, l.WriteAt(randBytes(rng, 100), 9*dsz, false), "an update elsewhere")
	wantNoSpace(t, l.Flush(), "flush")
	wantAllOK(t, l, "after more refusals")
	mustRead(t, l, model, "full")

	setAll(full, false)
	p := randBytes(rng, 300)
	if err := l.WriteAt(p, s*dsz+chunk+10, false); err != nil {
		t.Fatalf("write once space is back: %v", err)
	}
	copy(model[s*dsz+chunk+10:], p)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	mustRead(t, l, model, "space back")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkParity(t, env, 3, chunk)
	// A data leg of the stripe lost: reconstructed from the parity.
	if err := os.Remove(legPath(env, l.dataLeg(s, 0))); err != nil {
		t.Fatal(err)
	}
	env.Create = false
	l = build(t, env, spec)
	mustRead(t, l, model, "data leg lost")
}

// TestNoSpaceWhileDegraded: the same with a leg already missing, where a
// stripe's missing chunk exists only as parity (and in the journal, written
// before the update). A refused update must not lose that chunk: it is
// never reconstructed from the stripe's stale parity, and the recovery once
// space is back takes it from the journal — so it reads as before the
// refused write or as that write left it, and every other byte as before.
func TestNoSpaceWhileDegraded(t *testing.T) {
	const chunk = 4096
	spec, full := fillingSpec(t, 3, chunk)
	dsz := int64(2 * chunk)
	env := block.Env{Dir: t.TempDir(), Size: 16 * dsz, Create: true}
	l := build(t, env, spec)
	rng := rand.New(rand.NewPCG(43, 1))
	model := randBytes(rng, env.Size)
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	const s = 3
	m := l.dataLeg(s, 0) // lost: chunk 0 of stripe s exists only as parity
	if err := os.Remove(legPath(env, m)); err != nil {
		t.Fatal(err)
	}
	env.Create = false
	l = build(t, env, spec)
	defer func() { l.Close() }()
	mustRead(t, l, model, "degraded")

	full[l.parityLeg(s)].Store(true)
	w := randBytes(rng, 2000)
	off := s*dsz + 1000 // inside the missing chunk
	wantNoSpace(t, l.WriteAt(w, off, false), "an update of a degraded stripe")
	if l.frozen.Load() || l.state[l.parityLeg(s)] != legOK {
		t.Fatalf("leg states %q (frozen %v) after a refused update: the full leg was failed", l.state, l.frozen.Load())
	}
	got := make([]byte, chunk)
	if err := l.ReadAt(got, s*dsz); err == nil {
		refused := bytes.Clone(model[s*dsz : s*dsz+chunk])
		copy(refused[1000:], w)
		if !bytes.Equal(got, model[s*dsz:s*dsz+chunk]) && !bytes.Equal(got, refused) {
			t.Fatal("the missing chunk read from the stripe's stale parity")
		}
	}
	full[l.parityLeg(s)].Store(false)
	p := randBytes(rng, 100)
	if err := l.WriteAt(p, 10*dsz, false); err != nil {
		t.Fatalf("write once space is back: %v", err)
	}
	copy(model[10*dsz:], p)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := l.ReadAt(got, s*dsz); err != nil {
		t.Fatalf("the missing chunk once space is back: %v", err)
	}
	if !bytes.Equal(got[1000:3000], model[off:off+2000]) && !bytes.Equal(got[1000:3000], w) {
		t.Fatal("the refused write's range reads as neither the old data nor the write")
	}
	copy(model[off:], got[1000:3000])
	mustRead(t, l, model, "space back")
	l.Close()
	l = build(t, env, spec)
	mustRead(t, l, model, "reopened")
}

// copyStore copies the regular files of dir into a new directory: what a
// machine that stopped now leaves (the files are plain, nothing cached).
func copyStore(t *testing.T, dir string) string {
	t.Helper()
	to := t.TempDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// TestFullStoreRandomOps: random writes, zeroes and flushes while legs
// fill up and free space at random, healthy and degraded, some runs
// stopped and reopened (from a copy of the files) mid-way. Nothing may
// fail a leg or freeze the layer, every refusal must be ENOSPC, a refused
// write's range reads as whatever it left (or EIO, for a missing chunk of
// a stripe it left unsettled, until space is back), and once space is back
// every byte reads as acknowledged or left, the parity matches the data,
// and a leg lost then is reconstructed exactly. The same holds for a store
// whose file system turns read-only (EROFS) and writable again.
func TestFullStoreRandomOps(t *testing.T) {
	t.Run("full", func(t *testing.T) { refusingStoreRandomOps(t, syscall.ENOSPC) })
	t.Run("read-only", func(t *testing.T) { refusingStoreRandomOps(t, syscall.EROFS) })
}

func refusingStoreRandomOps(t *testing.T, errno syscall.Errno) {
	const chunk = 4096
	for seed := range uint64(12) {
		spec, full := refusingSpec(t, 4, chunk, errno)
		dsz := int64(3 * chunk)
		env := block.Env{Dir: t.TempDir(), Size: 24 * dsz, Create: true}
		l := build(t, env, spec)
		rng := rand.New(rand.NewPCG(seed, 5))
		model := randBytes(rng, env.Size)
		if err := l.WriteAt(model, 0, false); err != nil {
			t.Fatal(err)
		}
		missing := -1
		if seed%2 == 1 {
			missing = int(seed/2) % 4
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(legPath(env, missing)); err != nil {
				t.Fatal(err)
			}
			env.Create = false
			l = build(t, env, spec)
		}
		l.cleanDelay = 0
		var unread [][2]int64 // refused ranges that read as EIO for now
		refused := func(off, n int64) {
			if err := l.ReadAt(model[off:off+n], off); errors.Is(err, syscall.EIO) {
				unread = append(unread, [2]int64{off, n})
			} else if err != nil {
				t.Fatalf("seed %d: read after a refused write: %v", seed, err)
			}
		}
		for op := range 200 {
			if rng.IntN(10) == 0 {
				for _, s := range full {
					s.Store(rng.IntN(3) == 0)
				}
			}
			off := rng.Int64N(env.Size)
			n := min(rng.Int64N(3*dsz)+1, env.Size-off)
			n, err := blocktest.RandomOp(rng, l, model, off, n, func(n int64) []byte { return randBytes(rng, n) })
			if err != nil {
				if !errors.Is(err, errno) {
					t.Fatalf("seed %d op %d: %v, want success or %v", seed, op, err, errno)
				}
				if n > 0 {
					refused(off, n)
				}
			}
			if st := string(l.state); l.frozen.Load() || missing < 0 && strings.Trim(st, string(legOK)) != "" {
				t.Fatalf("seed %d op %d: leg states %q, frozen %v", seed, op, st, l.frozen.Load())
			}
		}
		if seed%3 == 0 {
			old := l
			env.Dir, env.Create = copyStore(t, env.Dir), false
			for _, s := range full {
				s.Store(rng.IntN(2) == 0)
			}
			l = build(t, env, spec)
			old.Close()
		}
		setAll(full, false)
		if err := l.Flush(); err != nil {
			t.Fatalf("seed %d: flush once space is back: %v", seed, err)
		}
		for _, r := range unread {
			if err := l.ReadAt(model[r[0]:r[0]+r[1]], r[0]); err != nil {
				t.Fatalf("seed %d: a refused range once space is back: %v", seed, err)
			}
		}
		mustRead(t, l, model, "space back")
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		env.Create = false
		if missing < 0 {
			checkParity(t, env, 4, chunk)
			if err := os.Remove(legPath(env, int(seed/2)%4)); err != nil {
				t.Fatal(err)
			}
		}
		l = build(t, env, spec)
		mustRead(t, l, model, "a leg lost once space was back")
		l.Close()
	}
}

// TestRebuildRefusedForSpace: rebuilding a lost leg onto a full store stops
// with the store's error; the leg stays rebuilding (not failed again, its
// progress kept), and the first flush once space is back starts the
// rebuild again, which completes.
func TestRebuildRefusedForSpace(t *testing.T) {
	const chunk = 4096
	spec, full := fillingSpec(t, 3, chunk)
	dsz := int64(2 * chunk)
	env := block.Env{Dir: t.TempDir(), Size: 64 * dsz, Create: true}
	l := build(t, env, spec)
	rng := rand.New(rand.NewPCG(44, 1))
	model := randBytes(rng, env.Size)
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(legPath(env, 1)); err != nil {
		t.Fatal(err)
	}
	env.Create = false
	l = build(t, env, spec)
	defer func() { l.Close() }()
	full[1].Store(true) // its replacement finds the store full
	wantNoSpace(t, l.Repair(t.Context(), nil), "a rebuild")
	if l.state[1] != legRebuilding || l.frozen.Load() {
		t.Fatalf("leg states %q (frozen %v) after a rebuild the full store stopped: want leg 1 rebuilding", l.state, l.frozen.Load())
	}
	mustRead(t, l, model, "rebuild stopped")

	full[1].Store(false)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	l.rb.mu.Lock()
	run := l.rb.cur
	l.rb.mu.Unlock()
	if run == nil {
		t.Fatal("no rebuild started by the flush once space was back")
	}
	<-run.done
	if run.err != nil || string(l.state) != "ooo" {
		t.Fatalf("rebuild once space was back: %v; leg states %q", run.err, l.state)
	}
	mustRead(t, l, model, "rebuilt")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkParity(t, env, 3, chunk)
}
