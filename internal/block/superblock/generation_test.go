package superblock

import (
	"encoding/binary"
	"hash/crc32"
	"math"
	"testing"
)

// A copy whose generation is the last one (only a forged or corrupted file
// holds it: 2^64 updates never happen) must not make Write wrap to
// generation 0, which loses to it on every later read: Write would return
// success for a payload Open never reads back.
func TestWriteDoesNotWrapTheGeneration(t *testing.T) {
	m := &memFile{}
	b := &Block{f: m, slotSize: 4096}
	if err := b.Write([]byte("old")); err != nil { // generation 1, slot 1
		t.Fatal(err)
	}
	// Make slot 1's generation the last one, its checksum kept valid.
	s := m.data[4096:]
	binary.BigEndian.PutUint64(s[8:], math.MaxUint64)
	n := binary.BigEndian.Uint32(s[20:])
	c := crc32.Update(0, castagnoli, s[8:24])
	c = crc32.Update(c, castagnoli, s[headerSize:headerSize+int(n)])
	binary.BigEndian.PutUint32(s[24:], c)

	b, got, err := OpenFile(m)
	if err != nil || string(got) != "old" {
		t.Fatalf("open: %q, %v", got, err)
	}
	if err := b.Write([]byte("new")); err != nil {
		return // refused: nothing claimed durable
	}
	if _, got, err := OpenFile(m); err != nil || string(got) != "new" {
		t.Fatalf("Write succeeded, but Open reads %q (%v)", got, err)
	}
}
