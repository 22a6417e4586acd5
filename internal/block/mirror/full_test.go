package mirror

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// fillingSpec is a mirror over file legs, each under a filling layer
// (blocktest.FillingType) whose switch is named after the test and the leg.
func fillingSpec(t *testing.T, params string, legs ...string) (string, []*atomic.Bool) {
	return refusingSpec(t, syscall.ENOSPC, params, legs...)
}

// refusingSpec is fillingSpec whose legs' file system, switched on, is
// full (errno ENOSPC) or read-only (EROFS).
func refusingSpec(t *testing.T, errno syscall.Errno, params string, legs ...string) (string, []*atomic.Bool) {
	var kids []string
	var sw []*atomic.Bool
	for _, p := range legs {
		id := t.Name() + "/" + p
		sw = append(sw, blocktest.NewFullSwitch(id))
		child := `{"type":"file","params":{"path":"` + p + `"}}`
		kids = append(kids, blocktest.RefusingSpec(id, errno, child))
	}
	spec := `{"type":"mirror","params":` + params + `,"children":[` + kids[0]
	for _, k := range kids[1:] {
		spec += "," + k
	}
	return spec + "]}", sw
}

// fullMetaFS opens metadata files whose writes and syncs fail with ENOSPC
// while full is set (nothing lands).
type fullMetaFS struct{ full atomic.Bool }

func (m *fullMetaFS) open(path string) (block.MetaFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	return &fullMetaFile{File: f, full: &m.full}, nil
}

type fullMetaFile struct {
	*os.File
	full *atomic.Bool
}

func (f *fullMetaFile) WriteAt(p []byte, off int64) (int, error) {
	if f.full.Load() {
		return 0, syscall.ENOSPC
	}
	return f.File.WriteAt(p, off)
}

func (f *fullMetaFile) Sync() error {
	if f.full.Load() {
		return syscall.ENOSPC
	}
	return f.File.Sync()
}

// TestNoSpaceFailsNoLeg: a leg that refuses a write or a flush for want
// of space is not broken — the store is full — so it must not be failed
// (which would leave every mirrored volume of a full store degraded until
// someone repairs it). The write fails with the file system's error; the
// legs may now differ in its region, so reads there all come from one leg
// until the region is copied across, which happens once space is back:
// then the copies agree, also after a reopen.
func TestNoSpaceFailsNoLeg(t *testing.T) {
	const region = 65536
	spec, full := fillingSpec(t, `{"region":65536}`, "a.img", "b.img")
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := openMirror(t, env, spec)
	defer func() { l.Close() }()
	l.clearDelay.Store(0)
	model := fillAll(t, l, 31)

	full[1].Store(true) // leg b's writes need space it does not get
	p := randBytes(rand.New(rand.NewPCG(31, 2)), region)
	if err := l.WriteAt(p, 3*region, false); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write refused by a full leg: %v, want ENOSPC", err)
	}
	if err := l.Flush(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("flush refused by a full leg: %v, want ENOSPC", err)
	}
	if s := legStates(l); s[0] != legOK || s[1] != legOK {
		t.Fatalf("legs %v after a full store refused a write: want both ok", s)
	}
	// Both legs are in service, but in that region only one holds the
	// data the mirror serves: one more loss would lose it.
	if st := l.Describe().State; st != block.StateDegraded {
		t.Fatalf("state %q while a region waits to be copied across, want %q", st, block.StateDegraded)
	}
	first := make([]byte, region)
	if err := l.ReadAt(first, 3*region); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		again := make([]byte, region)
		if err := l.ReadAt(again, 3*region); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, first) {
			t.Fatal("reads of the region a leg refused return different data")
		}
	}
	copy(model[3*region:], first)

	full[1].Store(false)
	if err := l.Flush(); err != nil {
		t.Fatalf("flush once space is back: %v", err)
	}
	l.bg.Wait() // the region's copy across, started by the flush
	checkCopies(t, l, model)
	if st := l.Describe().State; st != block.StateOK {
		t.Fatalf("state %q once the region is copied across, want %q", st, block.StateOK)
	}
	write(t, l, model, p, 3*region)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	mustClose(t, l)
	env.Create = false
	l = openMirror(t, env, spec)
	if l.needsResync() {
		t.Fatal("regions left to resync after a clean close")
	}
	checkCopies(t, l, model)
}

// TestReopenWhileStoreFull: a mirror detached while its store is full
// (its close cannot flush) and attached again while it still is opens
// with both legs in service: the regions written since the last flush
// are resynchronised, and a resync that meets a full store leaves them to
// later instead of failing the leg it copies to. Once space is back a
// flush brings the legs together.
func TestReopenWhileStoreFull(t *testing.T) {
	const region = 65536
	spec, full := fillingSpec(t, `{"region":65536}`, "a.img", "b.img")
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := openMirror(t, env, spec)
	defer func() { l.Close() }()
	model := fillAll(t, l, 32)
	write(t, l, model, randBytes(rand.New(rand.NewPCG(32, 2)), 2*region), 5*region+100)
	full[0].Store(true)
	full[1].Store(true)
	if err := l.Close(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("close over full legs: %v, want ENOSPC", err)
	}

	env.Create = false
	l = openMirror(t, env, spec)
	l.bg.Wait() // the resync of the dirty regions meets the full store
	if s := legStates(l); s[0] != legOK || s[1] != legOK {
		t.Fatalf("legs %v after reopening on a full store: want both ok", s)
	}
	checkAll(t, l, model)

	full[0].Store(false)
	full[1].Store(false)
	if err := l.Flush(); err != nil {
		t.Fatalf("flush once space is back: %v", err)
	}
	l.bg.Wait()
	if l.needsResync() {
		t.Fatal("regions still to resync after space came back")
	}
	checkCopies(t, l, model)
}

// TestOpenWithMetadataFull: recording a leg state at open (a leg that did
// not open is failed) needs a superblock write; with the store full that
// must not keep the volume from opening. It opens degraded, serves reads,
// and refuses writes (with the file system's error) until the failure is
// durable — a write must never be acknowledged that the missing leg,
// still ok on disk, lacks. Once space is back the failure is recorded, so
// the leg's stale file, put back, is not trusted.
func TestOpenWithMetadataFull(t *testing.T) {
	const region = 65536
	dir := t.TempDir()
	meta := &fullMetaFS{}
	env := block.Env{Dir: dir, Size: 1 << 20, Create: true, MetaFS: meta.open}
	spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img")
	l := openMirror(t, env, spec)
	model := fillAll(t, l, 33)
	mustClose(t, l)
	b := filepath.Join(dir, "b.img")
	if err := os.Rename(b, b+".away"); err != nil {
		t.Fatal(err)
	}

	meta.full.Store(true)
	env.Create = false
	l = openMirror(t, env, spec) // fails the test if it does not open
	defer func() { l.Close() }()
	if s := legStates(l); s[0] != legOK || s[1] != legFailed {
		t.Fatalf("legs %v, want [ok failed]", s)
	}
	checkAll(t, l, model)
	p := randBytes(rand.New(rand.NewPCG(33, 2)), region)
	if err := l.WriteAt(p, 2*region, false); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write before the leg's failure is durable: %v, want ENOSPC", err)
	}
	meta.full.Store(false)
	write(t, l, model, p, 2*region)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	mustClose(t, l)
	if err := os.Rename(b+".away", b); err != nil {
		t.Fatal(err)
	}
	l = openMirror(t, env, spec)
	if s := legStates(l); s[0] != legOK || s[1] != legFailed {
		t.Fatalf("legs %v with the stale leg back, want [ok failed]", s)
	}
	checkAll(t, l, model)
}

// TestShortLegWithMetadataFull: a leg found shorter than the mirror at
// open is marked stale from its end on, durably before its failure is
// recorded (a failed leg's size is not checked again, and Repair copies
// only stale regions). With the store full neither write can be made at
// open; the volume opens anyway, and the first superblock write after
// space is back must still come after the stale map: the leg, grown by a
// repair after a crash at that point, gets every region it lacks.
func TestShortLegWithMetadataFull(t *testing.T) {
	const region = 65536
	dir := t.TempDir()
	meta := &fullMetaFS{}
	env := block.Env{Dir: dir, Size: 1 << 20, Create: true, MetaFS: meta.open}
	spec := mirrorSpec(`{"region":65536}`, "a.img", "b.img")
	l := openMirror(t, env, spec)
	model := fillAll(t, l, 34)
	mustClose(t, l)
	if err := os.Truncate(filepath.Join(dir, "b.img"), 5*region); err != nil {
		t.Fatal(err)
	}

	meta.full.Store(true)
	env.Create = false
	l = openMirror(t, env, spec)
	defer func() { l.Close() }()
	if s := legStates(l); s[1] != legFailed {
		t.Fatalf("legs %v, want leg b failed", s)
	}
	checkAll(t, l, model)
	meta.full.Store(false)
	write(t, l, model, []byte("after space came back"), region)
	// The machine stops here, before anything else reaches the disk.
	crashed := copyDir(t, dir)
	l2 := openMirror(t, block.Env{Dir: crashed, Size: env.Size}, spec)
	defer l2.Close()
	if s := legStates(l2); s[1] != legFailed {
		t.Fatalf("legs %v after the crash, want leg b failed", s)
	}
	if err := l2.Repair(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	checkCopies(t, l2, model)
}

// TestFullStoreRandomOps: random writes, zeroes and flushes while legs
// fill up and free space at random, with every leg ok or one failed, some
// runs stopped and reopened (from a copy of the files) mid-way. No ok leg
// may be failed, every refusal must be ENOSPC, reads are stable (a refused
// write's range reads as whatever it left), and once space is back a
// flush brings every copy to exactly what the volume reads — also after a
// repair of the failed leg and a reopen. The same holds for a store whose
// file system turns read-only (EROFS) and writable again.
func TestFullStoreRandomOps(t *testing.T) {
	t.Run("full", func(t *testing.T) { refusingStoreRandomOps(t, syscall.ENOSPC) })
	t.Run("read-only", func(t *testing.T) { refusingStoreRandomOps(t, syscall.EROFS) })
}

func refusingStoreRandomOps(t *testing.T, errno syscall.Errno) {
	for seed := range uint64(8) {
		spec, full := refusingSpec(t, errno, `{"region":16384}`, "a.img", "b.img", "c.img")
		env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
		l := openMirror(t, env, spec)
		l.clearDelay.Store(0)
		rng := rand.New(rand.NewPCG(seed, 9))
		model := fillAll(t, l, seed)
		failed := seed%2 == 1
		if failed {
			l.failLeg(2, l.legs[2].dev, errors.New("a disk error"))
			if err := l.persist(); err != nil {
				t.Fatal(err)
			}
		}
		for op := range 150 {
			if rng.IntN(8) == 0 {
				for _, s := range full {
					s.Store(rng.IntN(3) == 0)
				}
			}
			off := rng.Int64N(env.Size)
			n := min(rng.Int64N(50000)+1, env.Size-off)
			n, err := blocktest.RandomOp(rng, l, model, off, n, func(n int64) []byte { return randBytes(rng, n) })
			if err != nil {
				if !errors.Is(err, errno) {
					t.Fatalf("seed %d op %d: %v, want success or %v", seed, op, err, errno)
				}
				if n > 0 {
					if err := l.ReadAt(model[off:off+n], off); err != nil {
						t.Fatal(err)
					}
				}
			}
			if op%10 == 0 {
				checkAll(t, l, model)
			}
			if s := legStates(l); s[0] != legOK || s[1] != legOK {
				t.Fatalf("seed %d op %d: legs %v", seed, op, s)
			}
		}
		if seed%3 == 0 {
			old := l
			env.Dir, env.Create = copyDir(t, env.Dir), false
			l = openMirror(t, env, spec)
			l.clearDelay.Store(0)
			old.bgCancel() // the old machine is gone: no resync of its own
			defer old.Close()
			checkAll(t, l, model)
		}
		for _, s := range full {
			s.Store(false)
		}
		if err := l.Flush(); err != nil {
			t.Fatalf("seed %d: flush once space is back: %v", seed, err)
		}
		l.bg.Wait()
		checkAll(t, l, model)
		if failed {
			if err := l.Repair(t.Context(), nil); err != nil {
				t.Fatal(err)
			}
		}
		checkCopies(t, l, model)
		mustClose(t, l)
		env.Create = false
		l = openMirror(t, env, spec)
		checkCopies(t, l, model)
		mustClose(t, l)
	}
}

// TestRepairCopyRefusedForSpace: a layer above (checksum) repairing a bad
// copy writes it through WriteCopy; a full store refusing that write is
// not the leg's failure either.
func TestRepairCopyRefusedForSpace(t *testing.T) {
	spec, full := fillingSpec(t, `{"region":65536}`, "a.img", "b.img")
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := openMirror(t, env, spec)
	defer l.Close()
	model := fillAll(t, l, 35)
	full[1].Store(true)
	if err := l.WriteCopy(1, model[8192:16384], 8192); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a repair write the full store refuses: %v, want ENOSPC", err)
	}
	if s := legStates(l); s[0] != legOK || s[1] != legOK {
		t.Fatalf("legs %v after a refused repair write: want both ok", s)
	}
}

// TestRebuildRefusedForSpace: a repair that rebuilds a leg on a full store
// stops with the store's error and keeps what it copied; the leg stays
// rebuilding rather than failed again, and the next repair, once space is
// back, finishes it.
func TestRebuildRefusedForSpace(t *testing.T) {
	spec, full := fillingSpec(t, `{"region":65536}`, "a.img", "b.img")
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := openMirror(t, env, spec)
	defer func() { l.Close() }()
	model := fillAll(t, l, 36)
	l.failLeg(1, l.legs[1].dev, errors.New("a disk error"))
	write(t, l, model, randBytes(rand.New(rand.NewPCG(36, 2)), 300000), 100000)
	full[1].Store(true)
	if err := l.Repair(t.Context(), nil); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("repair onto a full store: %v, want ENOSPC", err)
	}
	if s := legStates(l); s[0] != legOK || s[1] != legRebuilding {
		t.Fatalf("legs %v after a repair the full store stopped: want [ok rebuilding]", s)
	}
	full[1].Store(false)
	if err := l.Repair(t.Context(), nil); err != nil {
		t.Fatalf("repair once space is back: %v", err)
	}
	checkCopies(t, l, model)
}

// targetReadOnly is a leg whose storage target refuses writes with a bare
// EROFS (one object storage target of a parallel file system gone
// read-only) while the rest of the file system takes them.
type targetReadOnly struct{ block.Layer }

func (targetReadOnly) WriteAt([]byte, int64, bool) error {
	return &os.PathError{Op: "write", Path: "leg", Err: syscall.EROFS}
}
func (targetReadOnly) WriteZeroes(int64, int64, block.ZeroFlags) error { return syscall.EROFS }
func (targetReadOnly) Flush() error                                    { return syscall.EROFS }

// TestOneTargetReadOnlyFailsTheLeg: an EROFS that only one leg gives — its
// storage target read-only, not the store (block.StoreRefused) — is that
// leg's failure: the leg is failed and the mirror goes on, degraded, with
// the write acknowledged by the other leg, as redundancy is for.
func TestOneTargetReadOnlyFailsTheLeg(t *testing.T) {
	spec, _ := fillingSpec(t, `{"region":65536}`, "a.img", "b.img")
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	l := openMirror(t, env, spec)
	defer func() { l.Close() }()
	model := fillAll(t, l, 5)
	l.mu.Lock()
	l.legs[1].dev = targetReadOnly{l.legs[1].dev}
	l.mu.Unlock()
	p := randBytes(rand.New(rand.NewPCG(5, 1)), 4096)
	if err := l.WriteAt(p, 8192, false); err != nil {
		t.Fatalf("write with one leg's target read-only: %v", err)
	}
	copy(model[8192:], p)
	if s := legStates(l); s[0] != legOK || s[1] != legFailed {
		t.Fatalf("legs %v, want leg b failed", s)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	checkAll(t, l, model)
}
