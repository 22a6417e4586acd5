// Package bitmap is a persistent bitmap whose updates survive crashes and
// torn writes: the block layers keep their per-region state in it (cow's
// allocation map, mirror's and parity's write-intent maps, checksum's
// in-flux map).
//
// Format (docs/formats.md): the file is a sequence of pages; logical page p
// has two physical slots of SlotSize bytes at 2p×SlotSize and
// (2p+1)×SlotSize ("shadow updates", like package superblock):
//
//	slot: magic "BSLTBM01" (8) | generation u64 | page index u32 | crc32c u32 | bits (SlotSize-24)
//
// all big-endian; the crc covers generation, page index and bits;
// generation g (from 1) is written to slot g mod 2 and valid only there.
// A page reads from its valid slot with the higher generation; a page with
// no valid slot reads as all zeroes (it was never synced, or its only
// write was torn — then its previous content was the zero page). A slot
// the file ends inside is read as if zero-padded.
//
// Updates are in memory until Sync, which writes every page changed since
// the last Sync into its older slot and fdatasyncs. Invariant: after Sync
// returns, Open sees the synced bits; after a crash during Sync, each page
// independently reads as either its old or its new content. Users therefore
// keep every bit meaningful on its own (no invariant spans two bits on
// different pages).
//
// A Bitmap is safe for concurrent use; Sync calls are serialised and may
// run concurrently with Set and Clear (a bit changed during a Sync is
// written by this Sync or the next).
package bitmap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"math/bits"
	"os"
	"sync"
)

const (
	magic = "BSLTBM01"
	// SlotSize is the size of one page slot.
	SlotSize   = 4096
	headerSize = 8 + 8 + 4 + 4
	// BitsPerPage is how many bits one page holds.
	BitsPerPage = (SlotSize - headerSize) * 8
	wordsPerPg  = (SlotSize - headerSize) / 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// File is what a bitmap is stored in (tests inject faults here).
type File interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
	Close() error
}

// Bitmap is an open persistent bitmap.
type Bitmap struct {
	syncMu sync.Mutex // serialises Sync
	mu     sync.Mutex // guards the fields below
	f      File
	n      int64    // bits
	words  []uint64 // the bits, page after page
	gens   []uint64 // generation of each page's newest slot
	dirty  []bool   // page changed since the last Sync
	closed bool
}

// Open opens the bitmap at path with n bits, creating the file if it does
// not exist. A file holding fewer pages than n needs reads the missing
// pages as zero (Grow is just a larger n).
func Open(path string, n int64) (*Bitmap, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("bitmap: %w", err)
	}
	b, err := OpenFile(f, n)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("bitmap %s: %w", path, err)
	}
	return b, nil
}

// OpenFile is Open over an already open file.
func OpenFile(f File, n int64) (*Bitmap, error) {
	if n < 0 {
		return nil, errors.New("negative size")
	}
	pages := pagesFor(n)
	b := &Bitmap{f: f, n: n, words: make([]uint64, pages*wordsPerPg), gens: make([]uint64, pages), dirty: make([]bool, pages)}
	slot := make([]byte, SlotSize)
	for p := range pages {
		for s := range 2 {
			gen, ok, err := b.readSlot(slot, p, s)
			if err != nil {
				return nil, err
			}
			if ok && gen > b.gens[p] {
				b.gens[p] = gen
				page := b.words[p*wordsPerPg : (p+1)*wordsPerPg]
				for i := range page {
					page[i] = binary.BigEndian.Uint64(slot[headerSize+8*i:])
				}
			}
		}
	}
	// Bits beyond n (a bitmap opened smaller than before) are dropped.
	b.clearTail()
	return b, nil
}

func pagesFor(n int64) int { return int((n + BitsPerPage - 1) / BitsPerPage) }

// readSlot reads and validates slot s of page p. A file ending inside
// (or before) the slot is read as if zero-padded: that is what it holds
// once a later write extends the file, so a slot cut short must not be
// invalid now and valid — and perhaps newer than what a Sync wrote
// meanwhile — after. Generation g is valid only in slot g mod 2, where
// Sync puts it. An error is a failed read, not an invalid slot.
func (b *Bitmap) readSlot(buf []byte, p, s int) (gen uint64, ok bool, err error) {
	off := int64(2*p+s) * SlotSize
	n, err := b.f.ReadAt(buf, off)
	if n < len(buf) {
		if !errors.Is(err, io.EOF) {
			return 0, false, fmt.Errorf("bitmap: read page %d slot %d: %w", p, s, err)
		}
		clear(buf[n:])
	}
	if string(buf[:8]) != magic || binary.BigEndian.Uint32(buf[16:]) != uint32(p) {
		return 0, false, nil
	}
	sum := binary.BigEndian.Uint32(buf[20:])
	c := crc32.Update(0, castagnoli, buf[8:20])
	c = crc32.Update(c, castagnoli, buf[headerSize:])
	if c != sum {
		return 0, false, nil
	}
	gen = binary.BigEndian.Uint64(buf[8:])
	return gen, gen%2 == uint64(s), nil
}

func (b *Bitmap) clearTail() {
	for i := b.n; i < int64(len(b.words))*64; i++ {
		if b.words[i/64]&(1<<(i%64)) != 0 {
			b.words[i/64] &^= 1 << (i % 64)
			b.dirty[i/BitsPerPage] = true
		}
	}
}

// Len is the number of bits.
func (b *Bitmap) Len() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// Get reports bit i.
func (b *Bitmap) Get(i int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.get(i)
}

func (b *Bitmap) get(i int64) bool { return b.words[i/64]&(1<<(i%64)) != 0 }

// Set sets bit i and reports whether it changed.
func (b *Bitmap) Set(i int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.get(i) {
		return false
	}
	b.words[i/64] |= 1 << (i % 64)
	b.dirty[i/BitsPerPage] = true
	return true
}

// Clear clears bit i and reports whether it changed.
func (b *Bitmap) Clear(i int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.get(i) {
		return false
	}
	b.words[i/64] &^= 1 << (i % 64)
	b.dirty[i/BitsPerPage] = true
	return true
}

// SetRange sets bits [from, to).
func (b *Bitmap) SetRange(from, to int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := from; i < to; i++ {
		if !b.get(i) {
			b.words[i/64] |= 1 << (i % 64)
			b.dirty[i/BitsPerPage] = true
		}
	}
}

// NextSet returns the first set bit at or after i, or -1.
func (b *Bitmap) NextSet(i int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i < b.n {
		w := b.words[i/64] >> (i % 64)
		if w != 0 {
			j := i + int64(bits.TrailingZeros64(w))
			if j < b.n {
				return j
			}
			return -1
		}
		i = (i/64 + 1) * 64
	}
	return -1
}

// Count is the number of set bits.
func (b *Bitmap) Count() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var c int64
	for _, w := range b.words {
		c += int64(bits.OnesCount64(w))
	}
	return c
}

// Grow extends the bitmap to n bits (new bits are clear); shrinking is
// not supported.
func (b *Bitmap) Grow(n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n < b.n {
		return fmt.Errorf("bitmap: cannot shrink from %d to %d bits", b.n, n)
	}
	// The file may hold the new pages already: a bitmap opened smaller
	// than it was drops what lies beyond (OpenFile). Their bits stay
	// dropped, but the next Sync must write each such page over its old
	// slots with a newer generation; from generation 0 it would lose to
	// them, and a reopen would read the old bits instead of what it
	// synced.
	slot := make([]byte, SlotSize)
	var gens []uint64
	for p := len(b.gens); p < pagesFor(n); p++ {
		var gen uint64
		for s := range 2 {
			g, ok, err := b.readSlot(slot, p, s)
			if err != nil {
				return err
			}
			if ok {
				gen = max(gen, g)
			}
		}
		gens = append(gens, gen)
	}
	for _, gen := range gens {
		b.words = append(b.words, make([]uint64, wordsPerPg)...)
		b.gens = append(b.gens, gen)
		b.dirty = append(b.dirty, gen > 0)
	}
	b.n = n
	return nil
}

// Sync makes every change made before it durable.
func (b *Bitmap) Sync() error {
	b.syncMu.Lock()
	defer b.syncMu.Unlock()
	type write struct {
		p   int
		gen uint64
		buf []byte
	}
	var writes []write
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return errors.New("bitmap: closed")
	}
	for p, d := range b.dirty {
		if d && b.gens[p] == math.MaxUint64 {
			// Only a forged file gets here (2^64 syncs of one page):
			// generation 0 would read as never written.
			b.mu.Unlock()
			return fmt.Errorf("bitmap: page %d: generation exhausted", p)
		}
	}
	for p, d := range b.dirty {
		if !d {
			continue
		}
		b.dirty[p] = false
		gen := b.gens[p] + 1
		buf := make([]byte, SlotSize)
		copy(buf, magic)
		binary.BigEndian.PutUint64(buf[8:], gen)
		binary.BigEndian.PutUint32(buf[16:], uint32(p))
		for i, w := range b.words[p*wordsPerPg : (p+1)*wordsPerPg] {
			binary.BigEndian.PutUint64(buf[headerSize+8*i:], w)
		}
		c := crc32.Update(0, castagnoli, buf[8:20])
		c = crc32.Update(c, castagnoli, buf[headerSize:])
		binary.BigEndian.PutUint32(buf[20:], c)
		writes = append(writes, write{p, gen, buf})
	}
	b.mu.Unlock()
	if len(writes) == 0 {
		return nil
	}
	fail := func(err error) error {
		b.mu.Lock()
		for _, w := range writes {
			b.dirty[w.p] = true // written again by the next Sync
		}
		b.mu.Unlock()
		return fmt.Errorf("bitmap: %w", err)
	}
	for _, w := range writes {
		// Generation g lives in slot g mod 2: the older slot.
		if _, err := b.f.WriteAt(w.buf, int64(2*w.p+int(w.gen%2))*SlotSize); err != nil {
			return fail(err)
		}
	}
	if err := b.f.Sync(); err != nil {
		return fail(err)
	}
	b.mu.Lock()
	for _, w := range writes {
		b.gens[w.p] = w.gen
	}
	b.mu.Unlock()
	return nil
}

// Close closes the file without syncing.
func (b *Bitmap) Close() error {
	b.syncMu.Lock()
	defer b.syncMu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	return b.f.Close()
}
