package block

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFileZeroesByWritingStopAtTheFence: on a file system without
// FALLOC_FL_ZERO_RANGE (NFS, tmpfs), a WriteZeroes that keeps its range
// allocated writes buffers of zeroes, up to a whole NBD request's 4 GiB —
// many seconds' worth. It asked its fence once, at the start, and wrote
// to the end of its range however long after the lease it began under
// had run out (and another node had taken the volume over). It asks
// again before every buffer, as a copy does before every piece.
func TestFileZeroesByWritingStopAtTheFence(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "basalt-zeroes-")
	if err != nil {
		t.Skipf("no tmpfs at /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	const size = 16 << 20
	path := dir + "/data.img"
	data := bytes.Repeat([]byte{0x5a}, size)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := OpenFile(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := unix.Fallocate(d.fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); !errors.Is(err, unix.EOPNOTSUPP) {
		t.Skipf("this file system zeroes ranges itself (%v): WriteZeroes writes no buffers here", err)
	}
	f := &limitFence{}
	f.left.Store(2) // the zeroing's own entry, then one buffer
	d.SetFence(f)
	if err := d.WriteZeroes(0, size, ZeroFlags{NoHole: true}); !errors.Is(err, ErrFenced) {
		t.Fatalf("zeroes written through a fence that closed during them: %v, want ErrFenced", err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	zeroed := 0
	for _, b := range got {
		if b == 0 {
			zeroed++
		}
	}
	if zeroed > 2<<20 {
		t.Fatalf("%d bytes zeroed after the fence closed; at most two buffers (%d) may be", zeroed, 2<<20)
	}
}
