package block

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// CopyIn through user space from a source that ends before size, on a
// file system that cannot tell its data from its holes (forFileData then
// hands over the whole range): what lies beyond the source's end reads
// as zeroes and is not written. The unread tail of the buffer used to
// keep the previous read's bytes, which were written there as data.
func TestCopyInPastTheSourceEndWritesNothing(t *testing.T) {
	const src = "/proc/version" // seq_file: pread works, SEEK_DATA is EINVAL
	f, err := os.Open(src)
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	if _, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_DATA); err == nil {
		t.Skipf("%s answers SEEK_DATA here", src)
	}
	text, err := os.ReadFile(src)
	if err != nil || len(text) == 0 {
		t.Skipf("%s: %d bytes, %v", src, len(text), err)
	}
	const size = 3 << 20 // three reads of 1 MiB; the source ends in the first
	path := filepath.Join(t.TempDir(), "dev.img")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	d, err := OpenFile(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rep, err := CopyIn(plain{d}, f, size, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	copy(want, text)
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Fatalf("device differs from the source at byte %d (source is %d bytes); report %+v", i, len(text), rep)
	}
	if rep.DataBytes != 1<<20 {
		t.Fatalf("report %+v: only the first MiB holds data", rep)
	}
}
