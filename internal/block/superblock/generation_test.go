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

// A newest copy found in the slot its generation's parity does not name
// (a misdirected write put it there, or a tool copied the file slot by
// slot) is still the copy Read returns, so an update must not overwrite
// it: were the update torn, Read would fall back to a copy two or more
// generations old — neither the payload being written nor the previous.
func TestWriteSparesAMisplacedCopy(t *testing.T) {
	slot := func(m *memFile, i int) []byte {
		if len(m.data) < 8192 {
			m.data = append(m.data, make([]byte, 8192-len(m.data))...)
		}
		return m.data[i*4096 : (i+1)*4096]
	}
	m := &memFile{}
	b := &Block{f: m, slotSize: 4096}
	for _, p := range []string{"one", "two", "three"} { // generations 1, 2, 3
		if err := b.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	// Generation 3 moves into slot 0, over generation 2; slot 1 holds
	// generation 1 again.
	first := &memFile{}
	if err := (&Block{f: first, slotSize: 4096}).Write([]byte("one")); err != nil {
		t.Fatal(err)
	}
	copy(slot(m, 0), slot(m, 1))
	copy(slot(m, 1), slot(first, 1))

	b, got, err := OpenFile(m)
	if err != nil || string(got) != "three" || b.Generation() != 3 {
		t.Fatalf("open: %q gen %d, %v", got, b.Generation(), err)
	}
	// The next update is torn after its header: that slot is invalid.
	m.tear, m.tearing = func(i int) bool { return i < headerSize }, true
	b.Write([]byte("four"))
	if _, got, err := OpenFile(&memFile{data: m.data}); err != nil || string(got) != "three" {
		t.Fatalf("after a torn update: %q, %v; want the previous payload %q", got, err, "three")
	}
}
