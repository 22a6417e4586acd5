package cow

import (
	"iter"
	"sync/atomic"
)

// ownerPageShift: a page of the owner table holds 4096 entries, 16 KiB,
// covering 256 MiB of volume at the default 64 KiB chunk.
const ownerPageShift = 12

// Page sizes open gives the owner table and the unsynced set: the
// constants, but tiny in tests, so that the layer's tests cross page
// boundaries and absent pages everywhere (at the real sizes most of their
// volumes fit in one page).
var (
	ownerShift    uint = ownerPageShift
	unsyncedShift uint = chunkSetPageShift
)

// ownerPage is one page of entries: an array, so that a lookup goes from
// the slot's pointer straight to the entry.
type ownerPage [1 << ownerPageShift]atomic.Uint32

// ownerTable is the owner table: per chunk, the depth of the image of the
// chain that holds it, 0 when no image does (package doc).
//
// It is paged because a flat table costs 4 bytes a chunk from the moment
// the volume is opened — 64 MiB per TiB of size at 64 KiB chunks, 512 MiB
// for an empty 8 TiB volume, and resident, since the heap hands out memory
// it has zeroed — while most of a large volume is usually held by no
// image. A page is allocated when an entry in it is first set to a
// non-zero value, so the table costs memory for the chunks the chain
// holds, plus a pointer per page of size.
//
// Invariants:
//   - An absent page reads as all zeroes; storing 0 into one allocates
//     nothing.
//   - A page, once allocated, is never replaced or freed while the table
//     is in use: a slot's pointer goes from nil to a page once (a compare
//     and swap: of two goroutines allocating the same page, the loser
//     drops its own and uses the winner's), so no store is ever made into
//     a page that is not the table's.
//   - Entries at or beyond Len are zero, even in the last page's tail:
//     Store and CompareAndSwap refuse (panic on) such chunks as the flat
//     slice did, so grow only has to add slots.
//   - Load, Store and CompareAndSwap are lock-free and safe concurrently
//     with each other. The slot slice itself changes only in grow, whose
//     caller holds chainMu exclusively; every other caller holds chainMu
//     shared (or has the layer to itself, in open).
type ownerTable struct {
	shift uint  // log2 of a page's entries, at most ownerPageShift
	mask  int64 // 1<<shift - 1: a chunk's index in its page
	n     int64 // entries (chunks)
	pages []atomic.Pointer[ownerPage]
}

// newOwnerTable returns a table of n entries, all zero, in pages of
// 1<<shift entries: ownerPageShift, but smaller in tests, which use only
// the first entries of each ownerPage.
func newOwnerTable(n int64, shift uint) ownerTable {
	if shift > ownerPageShift {
		panic("cow: owner table pages hold at most 1<<ownerPageShift entries")
	}
	t := ownerTable{shift: shift, mask: 1<<shift - 1}
	t.grow(n)
	return t
}

// Len is the number of entries.
func (t *ownerTable) Len() int64 { return t.n }

func (t *ownerTable) check(c int64) {
	if uint64(c) >= uint64(t.n) {
		panic("cow: owner table index out of range")
	}
}

// Load returns chunk c's owner. It is the I/O path's lookup: one load of
// the page's pointer, one of the entry. (A chunk at or beyond Len but in
// the last page reads 0 rather than panicking.)
func (t *ownerTable) Load(c int64) uint32 {
	p := t.pages[t.page(c)].Load()
	if p == nil {
		return 0
	}
	return p[c&t.mask].Load()
}

// page is the index of chunk c's page.
func (t *ownerTable) page(c int64) int64 { return c >> (t.shift & 63) }

// entry returns chunk c's entry, allocating its page if it is absent.
func (t *ownerTable) entry(c int64) *atomic.Uint32 {
	t.check(c)
	slot := &t.pages[t.page(c)]
	p := slot.Load()
	if p == nil {
		p = new(ownerPage)
		if !slot.CompareAndSwap(nil, p) {
			p = slot.Load() // another goroutine's, which won
		}
	}
	return &p[c&t.mask]
}

// Store sets chunk c's owner to o.
func (t *ownerTable) Store(c int64, o uint32) {
	if o == 0 {
		t.check(c)
		if p := t.pages[t.page(c)].Load(); p != nil {
			p[c&t.mask].Store(0)
		}
		return
	}
	t.entry(c).Store(o)
}

// CompareAndSwap sets chunk c's owner to new if it is old, and reports
// whether it did.
func (t *ownerTable) CompareAndSwap(c int64, old, new uint32) bool {
	if new == 0 || old != 0 {
		// Nothing to allocate: an absent page holds 0, which is new's
		// value already or not old.
		t.check(c)
		p := t.pages[t.page(c)].Load()
		if p == nil {
			return old == 0
		}
		return p[c&t.mask].CompareAndSwap(old, new)
	}
	return t.entry(c).CompareAndSwap(old, new)
}

// grow extends the table to n entries, new ones zero. It keeps the pages
// (no entry is copied); its caller holds chainMu exclusively, as it
// replaces the slot slice.
func (t *ownerTable) grow(n int64) {
	if n < t.n {
		panic("cow: owner table cannot shrink")
	}
	np := (n + t.mask) >> t.shift
	if np > int64(len(t.pages)) {
		pages := make([]atomic.Pointer[ownerPage], np)
		for i := range t.pages {
			pages[i].Store(t.pages[i].Load())
		}
		t.pages = pages
	}
	t.n = n
}

// pageOf returns the page holding chunk c, nil if absent, and the chunk
// just past it.
func (t *ownerTable) pageOf(c int64) (*ownerPage, int64) {
	return t.pages[t.page(c)].Load(), (c | t.mask) + 1
}

// nextHeld returns the first chunk in [c, to) whose owner is not 0, or to
// (at most Len) if there is none, skipping absent pages.
func (t *ownerTable) nextHeld(c, to int64) int64 {
	to = min(to, t.n)
	for c < to {
		p, end := t.pageOf(c)
		end = min(end, to)
		if p != nil {
			for ; c < end; c++ {
				if p[c&t.mask].Load() != 0 {
					return c
				}
			}
		}
		c = end
	}
	return to
}

// nextUnheld returns the first chunk in [c, to) whose owner is 0, or to
// (at most Len) if there is none.
func (t *ownerTable) nextUnheld(c, to int64) int64 {
	to = min(to, t.n)
	for c < to {
		p, end := t.pageOf(c)
		if p == nil {
			return c
		}
		for end = min(end, to); c < end; c++ {
			if p[c&t.mask].Load() == 0 {
				return c
			}
		}
	}
	return to
}

// held yields, in order, every chunk in [from, to) whose owner is not 0,
// with that owner, skipping absent pages. Entries may change meanwhile
// (the body may store into the table): each is loaded once, when the walk
// reaches it.
func (t *ownerTable) held(from, to int64) iter.Seq2[int64, uint32] {
	return func(yield func(int64, uint32) bool) {
		to := min(to, t.n)
		for c := from; c < to; {
			p, end := t.pageOf(c)
			end = min(end, to)
			if p != nil {
				for ; c < end; c++ {
					if o := p[c&t.mask].Load(); o != 0 && !yield(c, o) {
						return
					}
				}
			}
			c = end
		}
	}
}

// unheld yields, in order, the runs [start, end) of chunks in [from, to)
// whose owner is 0, each as long as it goes: end is to (at most Len) or a
// held chunk. The body may claim chunks of the run it was given; the walk
// goes on from end.
func (t *ownerTable) unheld(from, to int64) iter.Seq2[int64, int64] {
	return func(yield func(int64, int64) bool) {
		to := min(to, t.n)
		for c := t.nextUnheld(from, to); c < to; {
			e := t.nextHeld(c+1, to)
			if !yield(c, e) {
				return
			}
			c = t.nextUnheld(e, to)
		}
	}
}
