package bitmap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"slices"
	"testing"
)

// memFile is a bitmap File over a byte slice with os.File's ReadAt
// semantics: a read past the end returns what there is and io.EOF. With
// tearing set, the first write lands only its first land bytes and the
// file then fails every write and sync (the machine stopped mid-Sync).
type memFile struct {
	data    []byte
	tearing bool
	land    int
	crashed bool
}

var errCrashed = errors.New("memFile: crashed")

func (m *memFile) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("memFile: negative offset")
	}
	if off >= int64(len(m.data)) {
		return 0, io.EOF
	}
	n := copy(p, m.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memFile) WriteAt(p []byte, off int64) (int, error) {
	if m.crashed {
		return 0, errCrashed
	}
	if need := int(off) + len(p); need > len(m.data) {
		m.data = append(m.data, make([]byte, need-len(m.data))...)
	}
	if m.tearing {
		m.crashed = true
		copy(m.data[off:], p[:min(m.land, len(p))])
		return 0, errCrashed
	}
	copy(m.data[off:], p)
	return len(p), nil
}

func (m *memFile) Sync() error {
	if m.crashed {
		return errCrashed
	}
	return nil
}

func (m *memFile) Close() error { return nil }

// fixCRCs rewrites the checksum of every whole slot of data that carries
// the magic, so the fuzzer can reach generations, page indexes and bits
// that a random mutation would otherwise always invalidate.
func fixCRCs(data []byte) {
	for off := 0; off+SlotSize <= len(data); off += SlotSize {
		s := data[off : off+SlotSize]
		if string(s[:8]) != magic {
			continue
		}
		c := crc32.Update(0, castagnoli, s[8:20])
		c = crc32.Update(c, castagnoli, s[headerSize:])
		binary.BigEndian.PutUint32(s[20:], c)
	}
}

// wantPages is the format's reading of data for n bits, page by page: the
// candidates each page may read as. A page reads from its valid slot with
// the higher generation (a slot holding generation g is valid only if it
// is slot g mod 2); with no valid slot, or only generation-0 ones (which
// Sync never writes), as zero. Bits at or past n
// are cleared.
func wantPages(data []byte, n int64) [][][]uint64 {
	pages := pagesFor(n)
	out := make([][][]uint64, pages)
	for p := range pages {
		var best uint64
		var cands [][]uint64
		for s := range 2 {
			off := (2*p + s) * SlotSize
			if off+SlotSize > len(data) {
				continue
			}
			slot := data[off : off+SlotSize]
			if string(slot[:8]) != magic || binary.BigEndian.Uint32(slot[16:]) != uint32(p) {
				continue
			}
			c := crc32.Update(0, castagnoli, slot[8:20])
			c = crc32.Update(c, castagnoli, slot[headerSize:])
			if c != binary.BigEndian.Uint32(slot[20:]) {
				continue
			}
			gen := binary.BigEndian.Uint64(slot[8:])
			if gen%2 != uint64(s) {
				continue // Sync writes generation g to slot g mod 2 only
			}
			words := make([]uint64, wordsPerPg)
			for i := range words {
				words[i] = binary.BigEndian.Uint64(slot[headerSize+8*i:])
			}
			switch {
			case gen > best || cands == nil:
				best, cands = gen, [][]uint64{words}
			case gen == best:
				cands = append(cands, words)
			}
		}
		if best == 0 {
			cands = append(cands, make([]uint64, wordsPerPg))
		}
		for _, w := range cands {
			for i := max(n, int64(p)*BitsPerPage); i < int64(p+1)*BitsPerPage; i++ {
				w[(i-int64(p)*BitsPerPage)/64] &^= 1 << (i % 64)
			}
		}
		out[p] = cands
	}
	return out
}

// pristine reports whether every slot data holds (the last one
// zero-padded) is valid or all zeroes.
func pristine(data []byte) bool {
	if r := len(data) % SlotSize; r != 0 {
		data = append(slices.Clone(data), make([]byte, SlotSize-r)...)
	}
	for off := 0; off < len(data); off += SlotSize {
		slot := data[off : off+SlotSize]
		if !slices.ContainsFunc(slot, func(c byte) bool { return c != 0 }) {
			continue
		}
		c := crc32.Update(0, castagnoli, slot[8:20])
		c = crc32.Update(c, castagnoli, slot[headerSize:])
		gen := binary.BigEndian.Uint64(slot[8:])
		if string(slot[:8]) != magic || c != binary.BigEndian.Uint32(slot[20:]) ||
			int(binary.BigEndian.Uint32(slot[16:])) != off/SlotSize/2 || gen%2 != uint64(off/SlotSize%2) {
			return false
		}
	}
	return true
}

func page(b *Bitmap, p int) []uint64 { return b.words[p*wordsPerPg : (p+1)*wordsPerPg] }

// checkBitmap checks what OpenFile returned against the format: its length,
// every page against the slots in data, no bit at or past n, and Count
// against a NextSet walk.
func checkBitmap(b *Bitmap, data []byte, n int64) error {
	if b.Len() != n {
		return fmt.Errorf("Len %d, opened with %d", b.Len(), n)
	}
	// A slot cut short by the end of the file may read as invalid or as
	// zero-padded (what it holds once a later write extends the file).
	padded := data
	if r := len(data) % SlotSize; r != 0 {
		padded = append(slices.Clone(data), make([]byte, SlotSize-r)...)
	}
	want, wantPadded := wantPages(data, n), wantPages(padded, n)
	if len(b.gens) != len(want) || len(b.words) != len(want)*wordsPerPg {
		return fmt.Errorf("%d pages (%d words) for %d bits, want %d", len(b.gens), len(b.words), n, len(want))
	}
	for p := range want {
		is := func(w []uint64) bool { return slices.Equal(w, page(b, p)) }
		if !slices.ContainsFunc(want[p], is) && !slices.ContainsFunc(wantPadded[p], is) {
			return fmt.Errorf("page %d is not the content of its newest valid slot (nor zero when it has none)", p)
		}
	}
	for i := n; i < int64(len(b.words))*64; i++ {
		if b.words[i/64]&(1<<(i%64)) != 0 {
			return fmt.Errorf("bit %d set in a %d-bit map", i, n)
		}
	}
	walked, last := int64(0), int64(-1)
	for i := b.NextSet(0); i >= 0; i = b.NextSet(i + 1) {
		if i <= last || i >= n || !b.Get(i) {
			return fmt.Errorf("NextSet walked to %d after %d in a %d-bit map (bit set: %v)", i, last, n, i < n && b.Get(i))
		}
		walked, last = walked+1, i
	}
	if c := b.Count(); c != walked {
		return fmt.Errorf("Count %d, NextSet walks %d bits", c, walked)
	}
	return nil
}

// FuzzOpenFile proves that OpenFile reads any file bytes as the format
// says — each page the content of its newest valid slot, or zero — for any
// size up to three pages, never with a bit at or past the size and with
// Count agreeing with NextSet; that a bit set and synced is read back, with
// every other bit, by the next OpenFile (Sync's slot choice works from
// whatever OpenFile found); and that a Sync torn in its first write (tear
// bytes of it land) leaves every page reading as its old or its new
// content. With fix, every whole slot carrying the magic gets its crc
// recomputed first, so mutations of generations, page indexes and bits
// reach the code behind the crc check.
//
// Slots are 4 KiB, so interesting inputs are large and Go's minimizer
// would spend its default minute on each one: fuzz with a small
// -fuzzminimizetime, e.g.
//
//	go test ./internal/block/bitmap -run '^$' -fuzz '^FuzzOpenFile$' -fuzztime 30s -fuzzminimizetime 200x
func FuzzOpenFile(f *testing.F) {
	const maxBits = 3 * BitsPerPage
	// Real files: two syncs over three pages (both slots of pages 0 and 2
	// valid, generation 2 in slot 0; page 1 only in slot 1), one sync of a
	// 10-bit map, and an empty file.
	m := &memFile{}
	b, err := OpenFile(m, maxBits)
	if err != nil {
		f.Fatal(err)
	}
	for _, i := range []int64{0, 63, 64, BitsPerPage - 1, BitsPerPage + 5, 2 * BitsPerPage, maxBits - 1} {
		b.Set(i)
	}
	if err := b.Sync(); err != nil {
		f.Fatal(err)
	}
	b.Clear(0)
	b.SetRange(2*BitsPerPage+100, 2*BitsPerPage+300)
	if err := b.Sync(); err != nil {
		f.Fatal(err)
	}
	full := slices.Clone(m.data)
	small := &memFile{}
	sb, err := OpenFile(small, 10)
	if err != nil {
		f.Fatal(err)
	}
	sb.Set(9)
	sb.Set(3)
	if err := sb.Sync(); err != nil {
		f.Fatal(err)
	}

	f.Add(full, uint32(maxBits), false, uint32(12345), uint16(SlotSize/2))
	f.Add(full, uint32(2*BitsPerPage+150), false, uint32(7), uint16(SlotSize/2))  // opened smaller: tail dropped
	f.Add(full, uint32(BitsPerPage+1), false, uint32(1), uint16(SlotSize/2))      // page 1 then ends after one bit
	f.Add(small.data, uint32(10), false, uint32(0), uint16(SlotSize/2))           // set bit 0 of a 10-bit map
	f.Add(small.data, uint32(BitsPerPage), false, uint32(40), uint16(SlotSize/2)) // grown
	f.Add([]byte{}, uint32(0), false, uint32(0), uint16(SlotSize/2))
	f.Add([]byte{}, uint32(100), false, uint32(99), uint16(SlotSize/2))
	// Corrupt copies: the newest slot of page 2 torn in half (page 2 falls
	// back to its first sync), the file cut inside a slot, a flipped bit
	// in a crc-covered byte, and the same with the crc repaired (a valid
	// slot with content Sync never wrote).
	torn := slices.Clone(full)
	clear(torn[4*SlotSize+SlotSize/2 : 5*SlotSize])
	f.Add(torn, uint32(maxBits), false, uint32(2*BitsPerPage+200), uint16(SlotSize/2))
	f.Add(full[:3*SlotSize+100], uint32(maxBits), false, uint32(3), uint16(SlotSize/2))
	flipped := slices.Clone(full)
	flipped[headerSize+3] ^= 0x10
	f.Add(flipped, uint32(maxBits), false, uint32(5), uint16(SlotSize/2))
	f.Add(flipped, uint32(maxBits), true, uint32(5), uint16(SlotSize/2))
	// Valid slots Sync never writes: the last generation (a Sync must
	// not wrap to 0, which reads as never written), and an odd generation
	// in slot 0 (a Sync would overwrite the page's only copy).
	last := slices.Clone(full)
	binary.BigEndian.PutUint64(last[8:], math.MaxUint64)
	f.Add(last, uint32(maxBits), true, uint32(5), uint16(SlotSize/2))
	odd := slices.Clone(full)
	odd[15] = 3
	f.Add(odd, uint32(maxBits), true, uint32(5), uint16(20))

	f.Fuzz(func(t *testing.T, data []byte, nRaw uint32, fix bool, bitRaw uint32, tear uint16) {
		n := int64(nRaw % (maxBits + 1))
		// Only the first three pages' slots can matter.
		if len(data) > 6*SlotSize+1 {
			data = data[:6*SlotSize+1]
		}
		data = slices.Clone(data)
		if fix {
			fixCRCs(data)
		}
		orig := slices.Clone(data)

		m := &memFile{data: slices.Clone(data)}
		b, err := OpenFile(m, n)
		if err != nil {
			t.Fatalf("OpenFile of %d bytes, %d bits: %v", len(data), n, err)
		}
		if !slices.Equal(m.data, orig) {
			t.Fatal("OpenFile changed the file")
		}
		if err := checkBitmap(b, orig, n); err != nil {
			t.Fatalf("open: %v", err)
		}
		old := slices.Clone(b.words)

		// Round trip: set a bit (if there is one), sync, reopen.
		if n > 0 {
			b.Set(int64(bitRaw) % n)
		}
		if err := b.Sync(); err != nil {
			if slices.Contains(b.gens, math.MaxUint64) {
				return // a forged last generation: Sync refuses to wrap
			}
			t.Fatalf("sync: %v", err)
		}
		r, err := OpenFile(&memFile{data: slices.Clone(m.data)}, n)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		if err := checkBitmap(r, m.data, n); err != nil {
			t.Fatalf("reopen: %v", err)
		}
		for p := range b.gens {
			if !slices.Equal(page(r, p), page(b, p)) {
				t.Fatalf("page %d after Sync and reopen differs from what was synced (generation %d)", p, b.gens[p])
			}
		}
		if n > 0 && !r.Get(int64(bitRaw)%n) {
			t.Fatalf("bit %d set and synced, reads clear after reopen", int64(bitRaw)%n)
		}

		// The same update, torn in its first write: every page reads as
		// before or after it. Only for files a history of Syncs can leave
		// (each slot valid or never written): the crc makes a torn slot
		// invalid with odds of 2^-32 against, and forged bytes beat those
		// (an invalid slot whose crc matches the header a tear lands).
		if !pristine(orig) {
			return
		}
		tf := &memFile{data: slices.Clone(orig), tearing: true, land: int(tear % SlotSize)}
		tb, err := OpenFile(tf, n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			tb.Set(int64(bitRaw) % n)
		}
		if err := tb.Sync(); err == nil && tf.crashed {
			t.Fatal("a Sync whose write failed reported success")
		}
		tr, err := OpenFile(&memFile{data: tf.data}, n)
		if err != nil {
			t.Fatal(err)
		}
		for p := range tr.gens {
			oldPage := old[p*wordsPerPg : (p+1)*wordsPerPg]
			if got := page(tr, p); !slices.Equal(got, oldPage) && !slices.Equal(got, page(b, p)) {
				t.Fatalf("Sync torn in its first write: page %d reads as neither its old nor its new content", p)
			}
		}
	})
}
