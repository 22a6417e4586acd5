package cow

import "sync/atomic"

// chunkSetPageShift: a page of a chunkSet holds 1<<15 bits in 512 words,
// 4 KiB, covering 2 GiB of volume at the default 64 KiB chunk.
const chunkSetPageShift = 15

// chunkSetPage is one page of a chunkSet's bits.
type chunkSetPage [1 << (chunkSetPageShift - 6)]atomic.Uint64

// chunkSet is a set of chunks, a bit each: the layer's unsynced chunks.
//
// It is paged as the owner table is (ownerTable), and for the same
// reason: a flat bitset costs 2 MiB per TiB of size from the moment the
// volume opens (16 MiB for an empty 8 TiB volume, as much as the top's
// whole allocation map), while the set only ever holds the chunks copied
// up since the last flush. A page is allocated when a bit in it is first
// set (and kept: the set costs at most what the flat bitset did, for the
// parts of the volume ever copied up); an absent page holds no chunk, and
// removing from one allocates nothing. Pages are never replaced or freed (a slot goes from nil to a
// page once, by compare and swap; a loser uses the winner's page), so
// add, remove and has are lock-free and safe concurrently; the slot slice
// changes only in grow, under chainMu held exclusively, as the owner
// table's.
type chunkSet struct {
	shift uint // log2 of a page's bits, 6 to chunkSetPageShift
	n     int64
	pages []atomic.Pointer[chunkSetPage]
}

// newChunkSet returns an empty set of chunks [0, n), in pages of 1<<shift
// bits: chunkSetPageShift, but smaller in tests, which use only the first
// words of each chunkSetPage.
func newChunkSet(n int64, shift uint) chunkSet {
	if shift < 6 || shift > chunkSetPageShift {
		panic("cow: chunk set pages hold 64 to 1<<chunkSetPageShift bits")
	}
	s := chunkSet{shift: shift}
	s.grow(n)
	return s
}

func (s *chunkSet) check(c int64) {
	if uint64(c) >= uint64(s.n) {
		panic("cow: chunk set index out of range")
	}
}

// word returns the page word holding chunk c's bit, nil if its page is
// absent (then allocated if alloc), and the bit.
func (s *chunkSet) word(c int64, alloc bool) (*atomic.Uint64, uint64) {
	s.check(c)
	slot := &s.pages[c>>(s.shift&63)]
	p := slot.Load()
	if p == nil {
		if !alloc {
			return nil, 0
		}
		p = new(chunkSetPage)
		if !slot.CompareAndSwap(nil, p) {
			p = slot.Load() // another goroutine's, which won
		}
	}
	i := c & (1<<s.shift - 1)
	return &p[i/64], 1 << (i % 64)
}

// add puts chunk c in the set.
func (s *chunkSet) add(c int64) {
	w, b := s.word(c, true)
	w.Or(b)
}

// remove takes chunk c out of the set.
func (s *chunkSet) remove(c int64) {
	if w, b := s.word(c, false); w != nil {
		w.And(^b)
	}
}

// has reports whether chunk c is in the set.
func (s *chunkSet) has(c int64) bool {
	w, b := s.word(c, false)
	return w != nil && w.Load()&b != 0
}

// grow extends the set to chunks [0, n), keeping its pages; the caller
// holds chainMu exclusively.
func (s *chunkSet) grow(n int64) {
	if n < s.n {
		panic("cow: chunk set cannot shrink")
	}
	np := (n + 1<<s.shift - 1) >> s.shift
	if np > int64(len(s.pages)) {
		pages := make([]atomic.Pointer[chunkSetPage], np)
		for i := range s.pages {
			pages[i].Store(s.pages[i].Load())
		}
		s.pages = pages
	}
	s.n = n
}
