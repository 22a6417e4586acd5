package parity

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/basalt-storage/basalt/internal/block"
)

// Metadata file layout (all in the one file named by params.meta):
//
//	[0, 8192)                         superblock: two 4096-byte slots (package superblock)
//	[8192, 8192 + 2·pairs·(4096+C))   journal: `pairs` pairs of slots, each slot a
//	                                  4096-byte header page followed by C payload bytes
//	[bitmapOff, …)                    bitmap (package bitmap), 3+n bits per stripe
const (
	sbSlot     = 4096
	journalOff = 2 * sbSlot
	jHeader    = 4096
	jMagic     = "BSLTPJ01"
	jFlagZero  = 1 // the entry's chunk is all zeroes; no payload is stored
)

// Leg states, one letter per leg in the superblock.
const (
	legOK         = 'o'
	legFailed     = 'f'
	legRebuilding = 'r'
)

// superPayload is the superblock's JSON payload. Every field but Size,
// Epoch and State is fixed at creation.
type superPayload struct {
	Version int    `json:"version"`
	Legs    int    `json:"legs"`
	Chunk   int64  `json:"chunk"`
	Size    int64  `json:"size"`  // bytes presented (exactly what Create or Resize asked for)
	Epoch   uint64 `json:"epoch"` // bumped whenever the set of valid legs changes
	State   string `json:"state"` // one of legOK/legFailed/legRebuilding per leg
	Pairs   int    `json:"journal_pairs"`
}

// maxSize bounds a recorded size (as mirror's and crypt's do): far beyond
// any volume, and small enough that no stripe arithmetic overflows.
const maxSize = 1 << 62

// maxPairs bounds the journal's pairs (so its region's size).
const maxPairs = 1 << 16

// maxGen bounds a journal entry's generation: scan ignores an entry
// beyond it and put refuses to write one.
const maxGen = 1 << 62

// decodeSuper decodes a superblock payload and checks what it can alone:
// format version 1, nothing but the known fields, nothing after the JSON
// object, at least 3 legs each ok, failed or rebuilding, a chunk that is a
// power of two of at least 4096 bytes, a size in (0, maxSize], 1 to
// maxPairs journal pairs. open checks the rest against the spec and the
// legs before it sizes anything from the payload.
func decodeSuper(raw []byte) (superPayload, error) {
	var p superPayload
	if err := block.DecodeStrict(raw, &p); err != nil {
		return p, fmt.Errorf("superblock payload: %w", err)
	}
	switch {
	case p.Version != 1:
		return p, fmt.Errorf("superblock version %d unknown", p.Version)
	case p.Legs < 3 || len(p.State) != p.Legs:
		return p, fmt.Errorf("superblock: %d legs with states %q", p.Legs, p.State)
	case p.Chunk < 4096 || p.Chunk&(p.Chunk-1) != 0 || p.Size <= 0 || p.Size > maxSize:
		return p, fmt.Errorf("superblock: implausible chunk %d or size %d", p.Chunk, p.Size)
	case p.Pairs < 1 || p.Pairs > maxPairs:
		return p, fmt.Errorf("superblock: %d journal pairs", p.Pairs)
	}
	for _, c := range []byte(p.State) {
		if c != legOK && c != legFailed && c != legRebuilding {
			return p, fmt.Errorf("superblock leg state %q unknown", p.State)
		}
	}
	return p, nil
}

func (p superPayload) marshal() []byte {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // a struct of plain fields always marshals
	}
	return b
}

// section is a window [off, off+limit) of the metadata file, so that the
// superblock, journal and bitmap each see a file of their own. Reads past
// the end of the underlying file, or past limit, return zeroes: the
// metadata file is sparse and its unwritten parts mean "nothing here".
type section struct {
	f     block.MetaFile
	off   int64
	limit int64 // < 0: unbounded
}

func (s *section) ReadAt(p []byte, off int64) (int, error) {
	clear(p)
	n := int64(len(p))
	if s.limit >= 0 {
		n = max(0, min(n, s.limit-off))
	}
	if n > 0 {
		m, err := s.f.ReadAt(p[:n], s.off+off)
		if err != nil && !errors.Is(err, io.EOF) {
			return m, err
		}
	}
	return len(p), nil
}

func (s *section) WriteAt(p []byte, off int64) (int, error) {
	if s.limit >= 0 && off+int64(len(p)) > s.limit {
		return 0, fmt.Errorf("metadata write %d+%d beyond its %d-byte region", off, len(p), s.limit)
	}
	return s.f.WriteAt(p, s.off+off)
}

func (s *section) Sync() error  { return s.f.Sync() }
func (s *section) Close() error { return nil } // the Layer closes the file once

// journal holds, for stripes written while a data leg is missing, the
// content that missing chunk has (or is about to have): the one piece of a
// degraded stripe that exists only as parity, and so the one a crash in
// the middle of the stripe's update would otherwise destroy.
//
// Slot format (header page, big-endian):
//
//	magic "BSLTPJ01" | epoch u64 | generation u64 | stripe u64 | leg u32 |
//	flags u32 | payload length u32 | crc32c u32 (over the 40 bytes after the
//	magic and the payload) | zero padding to 4096 | payload (C bytes unless flagZero)
//
// A stripe that needs entries owns a pair of slots and writes its entries
// alternately into them, so the previous entry stays intact while the next
// one is written (a torn entry fails its CRC and the older one stands).
// Entries count only if their epoch is the superblock's.
type journal struct {
	f     *section
	chunk int64
	pairs int
	slot  int64 // bytes per slot
	gen   uint64
	// on-disk entries found at open, current epoch only: stripe -> slots
	found map[int64][]jEntry
	// guarded by Layer.mu:
	owner map[int64]*pairUse
	free  []int
}

// pairUse is a stripe's claim on a journal pair.
type pairUse struct {
	pair int
	last int // slot (0/1) of the newest entry, -1 before the first
}

type jEntry struct {
	slot   int // absolute slot index
	epoch  uint64
	gen    uint64
	stripe int64
	leg    int
	flags  uint32
	plen   uint32
	crc    uint32
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func newJournal(f *section, chunk int64, pairs int) *journal {
	j := &journal{f: f, chunk: chunk, pairs: pairs, slot: jHeader + chunk, owner: map[int64]*pairUse{}}
	j.resetPairs()
	return j
}

func (j *journal) resetPairs() {
	clear(j.owner)
	j.free = j.free[:0]
	for i := j.pairs - 1; i >= 0; i-- {
		j.free = append(j.free, i)
	}
}

// scan reads every slot header and keeps the current epoch's entries (not
// yet CRC-checked: lookup does that with the payload). It also moves the
// generation counter past every generation on disk.
func (j *journal) scan(epoch uint64) error {
	j.found = map[int64][]jEntry{}
	h := make([]byte, 48)
	for i := range 2 * j.pairs {
		if _, err := j.f.ReadAt(h, int64(i)*j.slot); err != nil {
			return fmt.Errorf("journal slot %d: %w", i, err)
		}
		if string(h[:8]) != jMagic {
			continue
		}
		e := jEntry{slot: i, epoch: binary.BigEndian.Uint64(h[8:]), gen: binary.BigEndian.Uint64(h[16:]),
			stripe: int64(binary.BigEndian.Uint64(h[24:])), leg: int(binary.BigEndian.Uint32(h[32:])),
			flags: binary.BigEndian.Uint32(h[36:]), plen: binary.BigEndian.Uint32(h[40:]), crc: binary.BigEndian.Uint32(h[44:])}
		if e.gen > maxGen {
			// No journal writes 2^62 entries: not ours (and taking it
			// would make the next entries' generations wrap and lose).
			continue
		}
		j.gen = max(j.gen, e.gen)
		if e.epoch == epoch {
			j.found[e.stripe] = append(j.found[e.stripe], e)
		}
	}
	return nil
}

// lookup returns the newest valid entry of the current epoch for stripe s
// and leg m: the chunk's content (nil means all zeroes) and whether there
// was one.
func (j *journal) lookup(s int64, m int) ([]byte, bool, error) {
	cands := j.found[s]
	for len(cands) > 0 {
		best := 0
		for i, e := range cands {
			if e.gen > cands[best].gen {
				best = i
			}
		}
		e := cands[best]
		cands = append(cands[:best:best], cands[best+1:]...)
		if e.leg != m {
			continue
		}
		data, ok, err := j.read(e)
		if err != nil {
			return nil, false, err
		}
		if ok {
			return data, true, nil
		}
	}
	return nil, false, nil
}

func (j *journal) read(e jEntry) ([]byte, bool, error) {
	if e.flags&^jFlagZero != 0 || (e.flags&jFlagZero != 0) != (e.plen == 0) ||
		(e.plen != 0 && int64(e.plen) != j.chunk) {
		return nil, false, nil
	}
	buf := make([]byte, 48+int(e.plen))
	if _, err := j.f.ReadAt(buf[:48], int64(e.slot)*j.slot); err != nil {
		return nil, false, err
	}
	if e.plen > 0 {
		if _, err := j.f.ReadAt(buf[48:], int64(e.slot)*j.slot+jHeader); err != nil {
			return nil, false, err
		}
	}
	c := crc32.Update(0, castagnoli, buf[8:44])
	c = crc32.Update(c, castagnoli, buf[48:])
	if c != e.crc {
		return nil, false, nil
	}
	if e.plen == 0 {
		return nil, true, nil
	}
	return buf[48:], true, nil
}

// put writes an entry for stripe s (leg m, content data; nil or all
// zeroes is stored as a zero entry) into slot `which` of pair pu.pair and
// syncs. The caller holds the stripe's lock.
func (j *journal) put(pu *pairUse, gen, epoch uint64, s int64, m int, data []byte) error {
	if gen > maxGen {
		return fmt.Errorf("journal: generation %d exhausted", gen)
	}
	which := 0
	if pu.last == 0 {
		which = 1
	}
	zero := isZero(data)
	size := jHeader
	if !zero {
		size += len(data)
	}
	buf := make([]byte, size)
	copy(buf, jMagic)
	binary.BigEndian.PutUint64(buf[8:], epoch)
	binary.BigEndian.PutUint64(buf[16:], gen)
	binary.BigEndian.PutUint64(buf[24:], uint64(s))
	binary.BigEndian.PutUint32(buf[32:], uint32(m))
	if zero {
		binary.BigEndian.PutUint32(buf[36:], jFlagZero)
	} else {
		binary.BigEndian.PutUint32(buf[40:], uint32(len(data)))
		copy(buf[jHeader:], data)
	}
	c := crc32.Update(0, castagnoli, buf[8:44])
	if !zero {
		c = crc32.Update(c, castagnoli, buf[jHeader:])
	}
	binary.BigEndian.PutUint32(buf[44:], c)
	slot := 2*pu.pair + which
	if _, err := j.f.WriteAt(buf, int64(slot)*j.slot); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	pu.last = which
	return nil
}

func isZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.NativeEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
