package block

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// countingFence lets writes through until refuse is set, counting those
// under way.
type countingFence struct {
	inflight, entered atomic.Int64
	refuse            atomic.Bool
}

func (f *countingFence) Enter() error {
	if f.refuse.Load() {
		return ErrFenced
	}
	f.inflight.Add(1)
	f.entered.Add(1)
	return nil
}

func (f *countingFence) Exit() { f.inflight.Add(-1) }

// TestFileFenceEnteredAndExited: every way a file is written — write,
// FUA write, zeroes, trim, flush, resize, splice, copy from a file —
// enters its fence before and exits it after (a fence's owner waits for
// the writes under way: a missing Exit would hold it up for good), and
// none writes once the fence refuses.
func TestFileFenceEnteredAndExited(t *testing.T) {
	path, d := openZeroed(t, 1<<20)
	f := &countingFence{}
	d.SetFence(f)
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, make([]byte, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	sf, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	page := make([]byte, 4096)
	for i := range page {
		page[i] = 0x5a
	}
	ops := []struct {
		name string
		do   func() error
	}{
		{"write", func() error { return d.WriteAt(page, 0, false) }},
		{"fua write", func() error { return d.WriteAt(page, 4096, true) }},
		{"zeroes", func() error { return d.WriteZeroes(8192, 4096, ZeroFlags{NoHole: true, FUA: true}) }},
		{"trim", func() error { return d.Trim(12288, 4096, true) }},
		{"flush", d.Flush},
		{"resize", func() error { return d.Resize(2 << 20) }},
		{"splice", func() error {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				return err
			}
			defer unix.Close(p[0])
			defer unix.Close(p[1])
			if _, err := unix.Write(p[1], page); err != nil {
				return err
			}
			d.SpliceFrom(p[0], 16384, len(page))
			return nil
		}},
		{"copy from a file", func() error { return d.CopyFromFile(sf, 0, 8192, &CopyReport{}) }},
	}
	for _, op := range ops {
		before := f.entered.Load()
		if err := op.do(); err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		if f.entered.Load() == before {
			t.Errorf("%s did not enter the fence", op.name)
		}
		if n := f.inflight.Load(); n != 0 {
			t.Fatalf("%s left %d writes under way in the fence", op.name, n)
		}
	}
	f.refuse.Store(true)
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if err := op.do(); op.name != "splice" && !errors.Is(err, ErrFenced) {
			t.Errorf("%s with the fence closed: %v, want ErrFenced", op.name, err)
		}
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != string(want) {
		t.Fatalf("writes went through a closed fence (%v)", err)
	}
}

// limitFence lets the first n writes through, then refuses.
type limitFence struct{ left atomic.Int64 }

func (f *limitFence) Enter() error {
	if f.left.Add(-1) < 0 {
		return ErrFenced
	}
	return nil
}

func (f *limitFence) Exit() {}

// TestFileCopyStopsAtTheFence: a copy into a file (an import: up to 64 MiB
// a step) asked its fence once, at the start, and went on to the end of
// its range however long that took, after the lease it began under had
// run out. It asks again before every piece of at most copyPiece bytes.
func TestFileCopyStopsAtTheFence(t *testing.T) {
	const size = 32 << 20
	path, d := openZeroed(t, size)
	src := filepath.Join(t.TempDir(), "src")
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i%251) + 1
	}
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sf, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	f := &limitFence{}
	f.left.Store(3) // the copy's own entry, then two pieces
	d.SetFence(f)
	if err := d.CopyFromFile(sf, 0, size, &CopyReport{}); !errors.Is(err, ErrFenced) {
		t.Fatalf("copy through a fence that closed during it: %v, want ErrFenced", err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	copied := 0
	for _, b := range got {
		if b != 0 {
			copied++
		}
	}
	if copied > 2*copyPiece {
		t.Fatalf("%d bytes copied after the fence closed; at most %d (two pieces) may be", copied, 2*copyPiece)
	}
}
