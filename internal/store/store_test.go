package store

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func openT(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// allocated is the number of bytes of disk a file really uses.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// supportsHoles reports whether the file system under dir stores a large
// truncated file without allocating it (tmpfs, ext4, xfs, btrfs do).
func supportsHoles(t *testing.T, dir string) bool {
	t.Helper()
	p := filepath.Join(dir, ".probe")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(p)
	defer f.Close()
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	return allocated(t, p) < 1<<20
}

func TestOpenLayout(t *testing.T) {
	root := filepath.Join(t.TempDir(), "nested", "store")
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(s.Root) {
		t.Fatalf("Root %q is not absolute", s.Root)
	}
	for _, d := range []string{"volumes", "snapshots", "tmp"} {
		st, err := os.Stat(filepath.Join(root, d))
		if err != nil || !st.IsDir() {
			t.Fatalf("%s: %v", d, err)
		}
	}
	// Opening again is fine and keeps content.
	if err := os.WriteFile(filepath.Join(root, "volumes", "x.img"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(root); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "volumes", "x.img")); string(b) != "x" {
		t.Fatal("reopening lost data")
	}
	// Paths.
	if got, want := s.VolumePath("vol-1"), filepath.Join(s.Root, "volumes", "vol-1.img"); got != want {
		t.Errorf("VolumePath = %s, want %s", got, want)
	}
	if got, want := s.SnapshotPath("snap-1"), filepath.Join(s.Root, "snapshots", "snap-1.img"); got != want {
		t.Errorf("SnapshotPath = %s, want %s", got, want)
	}
	if got, want := s.TempPath(s.SnapshotPath("snap-1")), filepath.Join(s.Root, "tmp", "snap-1.img.partial"); got != want {
		t.Errorf("TempPath = %s, want %s", got, want)
	}
	// A file where the root should be: Open fails.
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := Open(file); err == nil {
		t.Fatal("Open over a regular file succeeded")
	}
}

func TestCreateSparse(t *testing.T) {
	s := openT(t)
	p := s.VolumePath("vol-sparse")
	if err := s.CreateSparse(p, 1<<30); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != 1<<30 {
		t.Fatalf("size %d, want 1 GiB", st.Size())
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	if supportsHoles(t, s.Root) {
		if a := allocated(t, p); a > 64<<10 {
			t.Fatalf("a fresh 1 GiB volume allocates %d bytes; creation must not write data", a)
		}
	}
	if !s.Exists(p) || s.Exists(p+".nope") {
		t.Fatal("Exists is wrong")
	}
	// Existing file: refused, and its data untouched.
	f, _ := os.OpenFile(p, os.O_RDWR, 0)
	f.WriteAt([]byte("precious"), 4096)
	f.Close()
	err = s.CreateSparse(p, 4096)
	if err == nil || !errors.Is(err, fs.ErrExist) {
		t.Fatalf("CreateSparse over an existing file: %v, want an ErrExist", err)
	}
	st, _ = os.Stat(p)
	buf := make([]byte, 8)
	f, _ = os.Open(p)
	f.ReadAt(buf, 4096)
	f.Close()
	if st.Size() != 1<<30 || string(buf) != "precious" {
		t.Fatalf("a refused create changed the file: size %d data %q", st.Size(), buf)
	}
	// Missing directory: error, nothing left behind.
	if err := s.CreateSparse(filepath.Join(s.Root, "nope", "x.img"), 512); err == nil {
		t.Fatal("create in a missing directory succeeded")
	}
	// A negative size fails and removes the file it opened.
	bad := s.VolumePath("vol-neg")
	if err := s.CreateSparse(bad, -1); err == nil {
		t.Fatal("negative size accepted")
	}
	if s.Exists(bad) {
		t.Fatal("failed create left its file behind")
	}
}

func TestResize(t *testing.T) {
	s := openT(t)
	p := s.VolumePath("vol-r")
	if err := s.CreateSparse(p, 1<<20); err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(p, os.O_RDWR, 0)
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("tail"), 1<<20-4)
	f.Close()
	before := allocated(t, p)
	if err := s.Resize(p, 1<<30); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if st.Size() != 1<<30 {
		t.Fatalf("size %d after resize", st.Size())
	}
	if supportsHoles(t, s.Root) {
		if a := allocated(t, p); a > before+64<<10 {
			t.Fatalf("growing allocated %d bytes (was %d); extend must not write data", a, before)
		}
	}
	b := make([]byte, 2<<20)
	end := make([]byte, 1<<20)
	f, _ = os.Open(p)
	f.ReadAt(b, 0)
	f.ReadAt(end, 1<<30-1<<20)
	f.Close()
	if string(b[:4]) != "head" || string(b[1<<20-4:1<<20]) != "tail" || !allZero(b[1<<20:]) || !allZero(end) {
		t.Fatal("resize changed data or the new range is not zero")
	}
	// Same size: a no-op (retried extend).
	if err := s.Resize(p, 1<<30); err != nil {
		t.Fatalf("resize to the current size: %v", err)
	}
	// Shrinking is refused and changes nothing.
	err := s.Resize(p, 1<<20)
	if err == nil || !strings.Contains(err.Error(), "shrink") {
		t.Fatalf("shrink: %v, want a refusal", err)
	}
	if st, _ := os.Stat(p); st.Size() != 1<<30 {
		t.Fatalf("refused shrink changed the size to %d", st.Size())
	}
	if err := s.Resize(s.VolumePath("vol-missing"), 4096); err == nil {
		t.Fatal("resize of a missing file succeeded")
	}
	if s.Exists(s.VolumePath("vol-missing")) {
		t.Fatal("resize created a missing file")
	}
}

func TestRemoveExistsCheckCapacity(t *testing.T) {
	s := openT(t)
	p := s.SnapshotPath("snap-x")
	os.WriteFile(p, []byte("x"), 0o600)
	if err := s.Remove(p); err != nil {
		t.Fatal(err)
	}
	if s.Exists(p) {
		t.Fatal("file still exists")
	}
	if err := s.Remove(p); err != nil {
		t.Fatalf("removing a missing file (a retried delete): %v", err)
	}
	if err := s.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.Root, "tmp", ".health")); !os.IsNotExist(err) {
		t.Fatal("Check left its probe file")
	}
	c, err := s.Capacity()
	if err != nil {
		t.Fatal(err)
	}
	if c.TotalBytes <= 0 || c.FreeBytes < 0 || c.FreeBytes > c.TotalBytes {
		t.Fatalf("capacity %+v", c)
	}
	gone := &Store{Root: filepath.Join(t.TempDir(), "gone")}
	if err := gone.Check(); err == nil {
		t.Fatal("Check of a missing root succeeded")
	}
	if _, err := gone.Capacity(); err == nil {
		t.Fatal("Capacity of a missing root succeeded")
	}
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// extent is data written at an offset of a test file.
type extent struct {
	off int64
	n   int
}

// makeFile creates a sparse file of size bytes with random data at extents.
func makeFile(t *testing.T, path string, size int64, exts []extent) []byte {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	rng := rand.New(rand.NewPCG(uint64(size), 7))
	for _, e := range exts {
		b := make([]byte, e.n)
		for i := range b {
			b[i] = byte(rng.UintN(255) + 1) // never zero: holes and data differ
		}
		if _, err := f.WriteAt(b, e.off); err != nil {
			t.Fatal(err)
		}
		copy(want[e.off:], b)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return want
}

// isHole reports whether off in path lies in a hole (SEEK_DATA skips it).
func isHole(t *testing.T, path string, off int64) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return true
	}
	if err != nil {
		t.Skipf("SEEK_DATA unsupported: %v", err)
	}
	return d > off
}

func TestCopyKeepsHoles(t *testing.T) {
	s := openT(t)
	const size = 64 << 20
	exts := []extent{
		{0, 4096},
		{10 << 20, 1 << 20},
		{33<<20 + 123, 777}, // unaligned
		{40 << 20, 9 << 20}, // spans several copy chunks
		{size - 4096, 4096}, // ends in data
	}
	src := s.VolumePath("vol-src")
	want := makeFile(t, src, size, exts)
	dst := s.SnapshotPath("snap-dst")

	type call struct{ done, total int64 }
	var calls []call
	err := s.Copy(context.Background(), src, dst, CopyOptions{Progress: func(done, total int64) {
		calls = append(calls, call{done, total})
	}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != size || !bytes.Equal(got, want) {
		t.Fatal("copy differs from the source")
	}
	if st, _ := os.Stat(dst); st.Mode().Perm() != 0o600 {
		t.Errorf("copy mode %v, want 0600", st.Mode().Perm())
	}
	if supportsHoles(t, s.Root) {
		sa, da := allocated(t, src), allocated(t, dst)
		if da > sa+256<<10 {
			t.Fatalf("copy allocates %d bytes, source %d: holes were filled", da, sa)
		}
		for _, off := range []int64{1 << 20, 20 << 20, 35 << 20, 60 << 20} {
			if !isHole(t, dst, off) {
				t.Errorf("offset %d is a hole in the source but data in the copy", off)
			}
		}
	}
	// Progress: non-decreasing, never beyond total, ends at total.
	if len(calls) == 0 {
		t.Fatal("no progress reported")
	}
	for i, c := range calls {
		if c.total != size || c.done < 0 || c.done > c.total || (i > 0 && c.done < calls[i-1].done) {
			t.Fatalf("progress call %d = %+v (previous %+v)", i, c, calls[max(i-1, 0)])
		}
	}
	if last := calls[len(calls)-1]; last.done != size {
		t.Fatalf("last progress %+v, want done == total", last)
	}
	// Nothing left in tmp.
	if left, _ := os.ReadDir(filepath.Join(s.Root, "tmp")); len(left) != 0 {
		t.Fatalf("tmp holds %v after a copy", left)
	}
}

func TestCopyEdgeFiles(t *testing.T) {
	s := openT(t)
	for _, c := range []struct {
		name string
		size int64
		exts []extent
	}{
		{"empty", 0, nil},
		{"all-hole", 8 << 20, nil},
		{"tiny", 1, []extent{{0, 1}}},
		{"dense-odd", 5<<20 + 1, []extent{{0, 5<<20 + 1}}},
	} {
		src := s.VolumePath("vol-" + c.name)
		want := makeFile(t, src, c.size, c.exts)
		dst := s.SnapshotPath("snap-" + c.name)
		var last [2]int64
		if err := s.Copy(context.Background(), src, dst, CopyOptions{Progress: func(d, tot int64) { last = [2]int64{d, tot} }}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, _ := os.ReadFile(dst)
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: copy differs (len %d, want %d)", c.name, len(got), len(want))
		}
		if last != [2]int64{c.size, c.size} {
			t.Fatalf("%s: last progress %v", c.name, last)
		}
	}
}

func TestCopyErrors(t *testing.T) {
	s := openT(t)
	if err := s.Copy(context.Background(), s.VolumePath("vol-missing"), s.SnapshotPath("snap-m"), CopyOptions{}); err == nil {
		t.Fatal("copy of a missing source succeeded")
	}
	if s.Exists(s.SnapshotPath("snap-m")) {
		t.Fatal("failed copy made its destination")
	}
	// A partial file from an interrupted attempt does not block a retry.
	src := s.VolumePath("vol-p")
	want := makeFile(t, src, 1<<20, []extent{{4096, 8192}})
	dst := s.SnapshotPath("snap-p")
	if err := os.WriteFile(s.TempPath(dst), bytes.Repeat([]byte{9}, 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Copy(context.Background(), src, dst, CopyOptions{}); err != nil {
		t.Fatalf("copy over a stale partial file: %v", err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
		t.Fatal("copy over a stale partial file differs from the source")
	}
	// Destination directory missing: error, and the temp file is gone.
	if err := s.Copy(context.Background(), src, filepath.Join(s.Root, "nope", "x.img"), CopyOptions{}); err == nil {
		t.Fatal("copy into a missing directory succeeded")
	}
	if left, _ := os.ReadDir(filepath.Join(s.Root, "tmp")); len(left) != 0 {
		t.Fatalf("tmp holds %v after a failed copy", left)
	}
}

func TestCopyThrottle(t *testing.T) {
	s := openT(t)
	src := s.VolumePath("vol-t")
	want := makeFile(t, src, 8<<20, []extent{{1 << 20, 2 << 20}})
	dst := s.SnapshotPath("snap-t")
	start := time.Now()
	if err := s.Copy(context.Background(), src, dst, CopyOptions{BytesPerSecond: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	// 2 MiB of data at 4 MiB/s: at least ~0.5 s (holes cost nothing).
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("throttled copy of 2 MiB at 4 MiB/s took %v", d)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
		t.Fatal("throttled copy differs")
	}
}

func TestCopyCanceled(t *testing.T) {
	s := openT(t)
	src := s.VolumePath("vol-c")
	makeFile(t, src, 16<<20, []extent{{0, 12 << 20}})

	// Canceled before starting.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dst := s.SnapshotPath("snap-c0")
	err := s.Copy(ctx, src, dst, CopyOptions{BytesPerSecond: 1 << 20})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("copy with a canceled context: %v", err)
	}
	if s.Exists(dst) || s.Exists(s.TempPath(dst)) {
		t.Fatal("canceled copy left a file")
	}

	// Canceled in the middle of a throttled copy (12 MiB at 1 MiB/s): it
	// stops promptly, with no final file and no temp file.
	ctx, cancel = context.WithCancel(context.Background())
	dst = s.SnapshotPath("snap-c1")
	progressed := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- s.Copy(ctx, src, dst, CopyOptions{BytesPerSecond: 1 << 20, Progress: func(d, tot int64) {
			select {
			case progressed <- struct{}{}:
			default:
			}
		}})
	}()
	select {
	case <-progressed:
	case <-time.After(5 * time.Second):
		t.Fatal("no progress")
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled copy returned %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("copy did not stop within 3 s of cancel")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("copy took %v to notice the cancel", d)
	}
	if s.Exists(dst) {
		t.Fatal("canceled copy produced its final file")
	}
	if s.Exists(s.TempPath(dst)) {
		t.Fatal("canceled copy left its temp file")
	}
}
