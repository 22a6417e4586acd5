package parity

import (
	"bytes"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// writeFails is a leg whose writes fail (a medium error on its disk)
// while its reads, of what it held before, still succeed. (A refusal by
// the store's file system — full, or turned read-only — is not a leg
// failure: full_test.)
type writeFails struct{ block.Layer }

func (w writeFails) WriteAt([]byte, int64, bool) error { return syscall.EIO }
func (w writeFails) WriteZeroes(int64, int64, block.ZeroFlags) error {
	return syscall.EIO
}

// An update that landed although leg b refused its write leaves b's chunk
// stale until b is marked failed. A second update of the same stripe, and
// a read, in the window between the first update releasing the stripe and
// markFailed must not use that chunk: the parity they compute and the data
// they return must be as if b were already out, and the second update is
// acknowledged only once b is out durably. Every byte is checked against a
// model afterwards, and after a reopen (b's stale file is then present).
func TestUpdateInFailingLegWindow(t *testing.T) {
	t.Parallel()
	const chunk = 4096
	for _, tc := range []struct {
		name string
		n    int
		// first: 1024 bytes at first in data chunk 0 (on leg b);
		// second: len at off, overlapping it and read-modify-write or
		// reconstruct-write (both read b's chunk where the first wrote).
		first, off, len int64
	}{
		{"read-modify-write", 4, 0, 512, 1024},
		{"read-modify-write across chunks", 3, 3072, 3584, 1536},
		{"reconstruct-write", 4, 0, 1024, 3*chunk - 2048},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := specFor(tc.n, chunk)
			dsz := int64(tc.n-1) * chunk
			env := block.Env{Dir: t.TempDir(), Size: 8 * dsz, Create: true}
			l := build(t, env, spec)
			rng := rand.New(rand.NewPCG(7, uint64(tc.n)))
			model := randBytes(rng, l.Size())
			if err := l.WriteAt(model, 0, true); err != nil {
				t.Fatal(err)
			}
			const s = 1
			base := s * dsz
			b := l.dataLeg(s, 0)
			l.children[b] = writeFails{l.children[b]}

			firstData := randBytes(rng, 1024)
			second := randBytes(rng, tc.len)
			ran := false
			l.landedHook = func() {
				if ran {
					return
				}
				ran = true
				if err := l.WriteAt(second, base+tc.off, false); err != nil {
					t.Errorf("second update: %v", err)
					return
				}
				got := make([]byte, len(second))
				if err := l.ReadAt(got, base+tc.off); err != nil {
					t.Errorf("read in the window: %v", err)
				} else if !bytes.Equal(got, second) {
					t.Errorf("read in the window after the second update was acknowledged: not its data")
				}
			}
			if err := l.WriteAt(firstData, base+tc.first, false); err != nil {
				t.Fatalf("first update: %v", err)
			}
			if !ran {
				t.Fatal("the hook did not run: the first update did not land with a leg error")
			}
			if t.Failed() {
				t.FailNow()
			}
			copy(model[base+tc.first:], firstData)
			copy(model[base+tc.off:], second)
			if l.state[b] != legFailed || l.disk[b] != legFailed {
				t.Fatalf("leg %d: state %q disk %q, want failed", b, l.state[b], l.disk[b])
			}
			if l.failing[b].Load() {
				t.Fatalf("leg %d still failing once marked failed", b)
			}
			mustRead(t, l, model, "after both updates")
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			env.Create = false
			l = build(t, env, spec)
			defer l.Close()
			if l.state[b] != legFailed {
				t.Fatalf("leg %d not failed after reopen", b)
			}
			mustRead(t, l, model, "after reopen")
		})
	}
}

// The flush acquirePair runs when no journal pair is free must leave the
// intent bits alone while a leg that failed a write is not yet out, as
// Flush does: the stripe that leg left stale is inconsistent on disk until
// markFailed, and a crash with its bit cleared would leave it unrecovered
// (the write hole). It answers the failing leg's error instead, which
// sends its caller through markFailed like any update in the window.
func TestInternalFlushInFailingLegWindow(t *testing.T) {
	t.Parallel()
	const chunk = 4096
	spec := specFor(4, chunk)
	dsz := int64(3 * chunk)
	env := block.Env{Dir: t.TempDir(), Size: 8 * dsz, Create: true}
	l := build(t, env, spec)
	defer l.Close()
	const s = 1
	b := l.dataLeg(s, 0)
	l.children[b] = writeFails{l.children[b]}
	ran := false
	l.landedHook = func() {
		if ran {
			return
		}
		ran = true
		l.mode.RLock()
		err := l.internalFlush()
		l.mode.RUnlock()
		if asLegError(err) == nil {
			t.Errorf("internal flush in the window: %v, want the failing leg's error", err)
		}
		if !l.bm.Get(l.intentBit(s, l.epoch)) {
			t.Errorf("intent bit of stripe %d cleared while leg %d is failing", s, b)
		}
	}
	if err := l.WriteAt(bytes.Repeat([]byte{7}, 1024), s*dsz, false); err != nil {
		t.Fatalf("update: %v", err)
	}
	if !ran {
		t.Fatal("the hook did not run: the update did not land with a leg error")
	}
}

// A Close in the same window must not clear the intent bits while leg b,
// whose write of the update failed, is still in service: b's chunk of the
// stripe is stale while its parity is new, and a reopen trusting b (and
// the stripe, its bit clear) would serve the stale chunk and, b or another
// leg lost later, reconstruct garbage. Close marks b failed first, as
// Flush would, so the reopen finds b out and the stripe consistent on the
// other legs. The update itself is not acknowledged (closed meanwhile).
func TestCloseInFailingLegWindow(t *testing.T) {
	t.Parallel()
	const n, chunk = 4, 4096
	spec := specFor(n, chunk)
	dsz := int64((n - 1) * chunk)
	env := block.Env{Dir: t.TempDir(), Size: 8 * dsz, Create: true}
	l := build(t, env, spec)
	rng := rand.New(rand.NewPCG(9, 9))
	model := randBytes(rng, l.Size())
	if err := l.WriteAt(model, 0, true); err != nil {
		t.Fatal(err)
	}
	const s = 1
	b := l.dataLeg(s, 0)
	l.children[b] = writeFails{l.children[b]}
	ran := false
	l.landedHook = func() {
		if ran {
			return
		}
		ran = true
		if err := l.Close(); err != nil {
			t.Errorf("close in the window: %v", err)
		}
	}
	p := randBytes(rng, 1024)
	if err := l.WriteAt(p, s*dsz, false); err == nil {
		t.Fatal("update acknowledged although the layer closed before marking its failed leg")
	}
	if !ran {
		t.Fatal("the hook did not run: the update did not land with a leg error")
	}
	if t.Failed() {
		t.FailNow()
	}
	env.Create = false
	l = build(t, env, spec)
	defer l.Close()
	if l.state[b] != legFailed {
		t.Fatalf("leg %d: state %q after a close in the window, want failed", b, l.state)
	}
	got := make([]byte, len(p))
	if err := l.ReadAt(got, s*dsz); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, p) && !bytes.Equal(got, model[s*dsz:s*dsz+int64(len(p))]) {
		t.Fatal("the unacknowledged update reads as neither its data nor what was there")
	}
	copy(model[s*dsz:], got)
	mustRead(t, l, model, "reopened")
}
