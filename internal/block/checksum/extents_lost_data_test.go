package checksum

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/block"
)

// TestExtentsReportLostDataAsData: blocks whose data was lost below the
// layer — here punched out of the file behind its back — read as zeroes
// from the child, which calls them a zero hole. Their entries say they
// held data: a read of them fails verification, and block status must
// call them data, or a client that skips reading what it calls zero
// (qemu-img convert, nbdcopy) copies zeroes where there was data, with
// no error. Blocks written as zeroes, and never written, stay zero.
func TestExtentsReportLostDataAsData(t *testing.T) {
	dir := t.TempDir()
	size := int64(GroupData + 64<<10)
	l := create(t, dir, size)
	defer l.Close()
	must(t, l.WriteAt(random(9, 16*BlockSize), 0, false))
	must(t, l.WriteAt(random(10, 4*BlockSize), GroupData, false))
	must(t, l.WriteZeroes(8*BlockSize, 2*BlockSize, block.ZeroFlags{})) // zero on purpose
	must(t, l.Flush())

	// Blocks 3..4 and group 1's block 1 lose their data below.
	f, err := os.OpenFile(filepath.Join(dir, "a.img"), os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	for _, r := range [][2]int64{{3 * BlockSize, 2 * BlockSize}, {GroupData + BlockSize, BlockSize}} {
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, dataOff(r[0]), r[1]); err != nil {
			t.Skipf("the file system cannot punch holes: %v", err)
		}
	}

	// What each block of [0, 20 blocks) and of group 1's first 8 must be.
	zero := func(b int64) bool { return b == 8 || b == 9 || b >= 16 && b < TableEntries || b >= TableEntries+4 }
	for _, r := range [][2]int64{{0, 20 * BlockSize}, {GroupData - 2*BlockSize, 10 * BlockSize}} {
		ex, err := l.Extents(r[0], r[1])
		must(t, err)
		at := r[0]
		for _, e := range ex {
			for b := at / BlockSize; b*BlockSize < at+e.Length; b++ {
				if e.Zero != zero(b) {
					t.Errorf("block %d: extent %+v at %d calls it zero=%v", b, e, at, e.Zero)
				}
				if e.Hole && !zero(b) {
					t.Errorf("block %d: extent %+v at %d calls it a hole", b, e, at)
				}
			}
			at += e.Length
		}
		if at != r[0]+r[1] {
			t.Fatalf("extents of %d+%d end at %d", r[0], r[1], at)
		}
	}
	// And reading the lost blocks fails, as the extents now say it must.
	p := make([]byte, BlockSize)
	for _, off := range []int64{3 * BlockSize, 4 * BlockSize, GroupData + BlockSize} {
		if err := l.ReadAt(p, off); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("read of lost block at %d: %v, want ErrCorrupt", off, err)
		}
	}
}
