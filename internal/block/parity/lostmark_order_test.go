package parity

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/bitmap"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/fault"
)

// A stripe's 3+n bitmap bits can straddle two bitmap pages, and the pages
// written by one bitmap sync land independently (each is a shadow-updated
// slot of its own; a power loss keeps any of the writes not yet synced).
// Recovery after a crash in which a leg vanished marks the interrupted
// stripe's chunk on that leg lost and recomputes the parity with zeroes
// standing in for it, then clears the intent bit. Were the lost mark and
// the cleared intent bit made durable by the same sync, a crash landing
// the page that clears the intent bit but not the one holding the mark
// would leave a stripe no later open recovers, whose chunk reads back as
// the zeroes the parity now reconstructs — wrong data, never EIO. A crash
// at each of the open's metadata writes (whole or torn, the earlier cached
// writes kept) must leave the chunk reading as EIO at the next open.
func TestLostMarkDurableBeforeIntentCleared(t *testing.T) {
	t.Parallel()
	const n, chunk = 3, 4096
	dsz := int64(n-1) * chunk
	// The first stripe whose bits straddle bitmap pages 0 and 1.
	const s = bitmap.BitsPerPage / (3 + n)
	spec := specFor(n, chunk)
	fs := blocktest.NewFaultFS()
	env := block.Env{Dir: t.TempDir(), Size: (s + 2) * dsz, Create: true, MetaFS: fs.Open}
	l := build(t, env, spec)
	l.cleanDelay = time.Hour
	m := l.dataLeg(s, 0)
	if in, lo := l.intentBit(s, l.epoch)/bitmap.BitsPerPage, l.lostBit(s, m)/bitmap.BitsPerPage; in == lo {
		t.Fatalf("stripe %d's intent bit and lost bit for leg %d share page %d: the test does not set up what it means to", s, m, in)
	}
	if err := l.WriteAt(randBytes(rand.New(rand.NewPCG(3, 3)), 100), s*dsz, false); err != nil {
		t.Fatal(err)
	}
	// Power lost with the stripe's intent bit set; leg m gone with it.
	fs.Crash()
	l.Close()
	loseLeg(t, env, m)
	env.Create = false
	crashed := copyStore(t, env.Dir)

	// open opens the crashed store (its legs as the crash left them, its
	// metadata from a restart) with metadata that crashes at write k
	// (never if k < 0), and returns the FaultFS holding that metadata.
	open := func(k int, tear func(int) bool) (block.Env, *blocktest.FaultFS, error) {
		e := env
		restoreStore(t, crashed, env.Dir)
		mfs := fs.Restart()
		mfs.CrashAt, mfs.Tear, mfs.Keep = k, tear, blocktest.KeepAll
		e.MetaFS = mfs.Open
		lb, err := block.Build(e, blocktest.Spec(t, spec))
		if err == nil {
			lb.Close()
		}
		return e, mfs, err
	}
	_, mfs, err := open(-1, nil)
	if err != nil {
		t.Fatal(err)
	}
	writes := mfs.Writes()
	if writes < 2 {
		t.Fatalf("the open made %d metadata writes", writes)
	}
	for k := range writes {
		for _, tear := range []func(int) bool{nil, fault.Half(bitmap.SlotSize)} {
			what := fmt.Sprintf("crash at metadata write %d of %d (torn %v)", k, writes, tear != nil)
			e, mfs, _ := open(k, tear)
			if !mfs.Crashed() {
				t.Fatalf("%s: no crash", what)
			}
			e.MetaFS = mfs.Restart().Open
			l := build(t, e, spec)
			got := make([]byte, chunk)
			err := l.ReadAt(got, s*dsz)
			l.Close()
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("%s: the chunk lost on leg %d reads %v (first byte %#x), want EIO", what, m, err, got[0])
			}
		}
	}
}

// restoreStore copies the files of from into to (metadata in a FaultFS is
// keyed by its path, so a store is reset in place rather than copied).
func restoreStore(t *testing.T, from, to string) {
	t.Helper()
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
