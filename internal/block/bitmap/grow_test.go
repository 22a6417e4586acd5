package bitmap

import "testing"

// A bitmap opened smaller than its file (Open: "Bits beyond n ... are
// dropped") and then grown must not let the file's old slots of the pages
// it grows into win over what the next Sync writes: Grow's new bits are
// clear, and a bit set and synced after Grow reads back after a reopen.
func TestGrowOverOldPagesThenSync(t *testing.T) {
	m := &memFile{}
	n := int64(2 * BitsPerPage)
	b, err := OpenFile(m, n)
	if err != nil {
		t.Fatal(err)
	}
	// Page 1 synced twice: generation 1 in slot 1, generation 2 in slot 0.
	b.Set(BitsPerPage + 5)
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	b.Set(BitsPerPage + 6)
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	b.Close()

	// Opened with one page: page 1's bits are dropped.
	b, err = OpenFile(m, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Grow(n); err != nil {
		t.Fatal(err)
	}
	if b.Get(BitsPerPage+5) || b.Get(BitsPerPage+6) {
		t.Fatal("Grow's new bits are not clear")
	}
	b.Set(BitsPerPage + 7)
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	b.Close()

	r, err := OpenFile(m, n)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Get(BitsPerPage + 7) {
		t.Error("a bit set after Grow and synced reads clear after reopen")
	}
	if r.Get(BitsPerPage+5) || r.Get(BitsPerPage+6) {
		t.Error("bits dropped before Grow (clear after it, and synced so) read set after reopen")
	}
}
