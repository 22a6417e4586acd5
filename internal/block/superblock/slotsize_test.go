package superblock

import (
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
)

// TestHugeSlotSizeIsCorrupt: a header claiming a slot of gigabytes is
// corrupt, read without allocating the payload it claims (a torn or
// overwritten cow.sb once had up to 4 GiB allocated per open).
func TestHugeSlotSizeIsCorrupt(t *testing.T) {
	data := make([]byte, 2*MinSlotSize)
	copy(data, magic)
	binary.BigEndian.PutUint64(data[8:], 7)
	binary.BigEndian.PutUint32(data[16:], 1<<31)      // slot size
	binary.BigEndian.PutUint32(data[20:], 1<<31-4096) // payload length
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := OpenFile(&memFile{data: data})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open: %v, want ErrCorrupt", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("reading the header allocated %d MiB", grew>>20)
	}
	if _, err := CreateFile(&memFile{}, MaxSlotSize+1, nil); err == nil {
		t.Fatal("a slot beyond MaxSlotSize created")
	}
}
