// Package superblock stores a layer's metadata crash-safely: two copies
// ("shadow updates", after the Violin seed) with a generation and a
// checksum each. An update overwrites the older copy only, so a crash or
// torn write at any point leaves the newer intact copy readable.
//
// File layout (docs/formats.md): two slots of SlotSize bytes each.
//
//	slot:  magic "BSLTSB01" (8) | generation u64 | slot size u32 | length u32 | crc32c u32 | payload
//
// all big-endian; crc32c covers generation, slot size, length and payload.
// Reading takes the valid slot with the highest generation; a slot is valid
// when its magic, sizes and checksum are right. Writing puts generation g+1
// into the slot that does not hold generation g — slot (g+1) mod 2 in a file
// only this package wrote — and fdatasyncs before returning.
//
// Invariant: after Write returns, Read returns the written payload; after a
// crash during Write, Read returns either that payload or the previous one.
// Write never overwrites the copy Read would return: it chooses its slot by
// where that copy is, not by the generation's parity, so a copy found in the
// other slot (a misdirected write, a file copied slot by slot) is not the
// one an update tears.
package superblock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"sync"
)

const (
	magic      = "BSLTSB01"
	headerSize = 8 + 8 + 4 + 4 + 4
	// MinSlotSize is the smallest slot (one page).
	MinSlotSize = 4096
	// MaxSlotSize is the largest: OpenFile looks for slot 1 this far
	// when slot 0 is torn, and a header claiming more is corrupt (read
	// as it claims, it would have a payload of up to 4 GiB allocated).
	MaxSlotSize = 1024 * MinSlotSize
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt means neither copy is valid.
var ErrCorrupt = errors.New("superblock: no valid copy")

// File is an open superblock.
type File interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
	Close() error
}

// Block is a two-copy metadata store in one file.
type Block struct {
	mu       sync.Mutex
	f        File
	slotSize int
	gen      uint64
	// cur is the slot holding generation gen, the copy Read returns;
	// Write overwrites the other one. 0 before the first Write.
	cur int
}

// Create makes a new superblock file at path holding payload, with slots
// of slotSize bytes (rounded up to MinSlotSize; payloads must fit in
// slotSize - 28 bytes). It fails if path exists.
func Create(path string, slotSize int, payload []byte) (*Block, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("superblock: %w", err)
	}
	b, err := CreateFile(f, slotSize, payload)
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return b, nil
}

// CreateFile is Create over an already open, empty file.
func CreateFile(f File, slotSize int, payload []byte) (*Block, error) {
	slotSize = max(MinSlotSize, (slotSize+MinSlotSize-1)/MinSlotSize*MinSlotSize)
	if slotSize > MaxSlotSize {
		return nil, fmt.Errorf("superblock: slot of %d bytes, more than %d", slotSize, MaxSlotSize)
	}
	b := &Block{f: f, slotSize: slotSize}
	// Generation 1 in slot 1, and slot 0 left invalid: a crash now leaves
	// either no valid copy (creation never completed) or this one.
	if err := b.Write(payload); err != nil {
		return nil, err
	}
	return b, nil
}

// Open reads an existing superblock file and returns it with its payload.
func Open(path string) (*Block, []byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("superblock: %w", err)
	}
	b, p, err := OpenFile(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("superblock %s: %w", path, err)
	}
	return b, p, nil
}

// OpenFile is Open over an already open file (tests inject faults here).
func OpenFile(f File) (*Block, []byte, error) {
	var best []byte
	var bestGen uint64
	slotSize, cur := 0, 0
	// The slot size is in each header; read slot 0's header at 0, and try
	// slot 1 at the size slot 0 claims, or at any page multiple if slot 0
	// is torn (slots are at most MaxSlotSize).
	s0, size0, gen0, ok0 := readSlot(f, 0, 0)
	if ok0 {
		best, bestGen, slotSize = s0, gen0, size0
	}
	candidates := []int{}
	if ok0 {
		candidates = append(candidates, size0)
	} else {
		for n := 1; n*MinSlotSize <= MaxSlotSize; n++ {
			candidates = append(candidates, n*MinSlotSize)
		}
	}
	for _, off := range candidates {
		s1, size1, gen1, ok1 := readSlot(f, int64(off), off)
		if ok1 {
			if !ok0 || gen1 > bestGen {
				best, bestGen, slotSize, cur = s1, gen1, size1, 1
			}
			break
		}
	}
	if slotSize == 0 {
		return nil, nil, ErrCorrupt
	}
	return &Block{f: f, slotSize: slotSize, gen: bestGen, cur: cur}, best, nil
}

// readSlot reads and validates the slot at off; want is the slot size the
// caller expects (0: any).
func readSlot(f File, off int64, want int) (payload []byte, slotSize int, gen uint64, ok bool) {
	var h [headerSize]byte
	if _, err := f.ReadAt(h[:], off); err != nil {
		return nil, 0, 0, false
	}
	if string(h[:8]) != magic {
		return nil, 0, 0, false
	}
	gen = binary.BigEndian.Uint64(h[8:])
	slotSize = int(binary.BigEndian.Uint32(h[16:]))
	n := int(binary.BigEndian.Uint32(h[20:]))
	sum := binary.BigEndian.Uint32(h[24:])
	if slotSize < MinSlotSize || slotSize > MaxSlotSize || slotSize%MinSlotSize != 0 || (want != 0 && slotSize != want) ||
		n > slotSize-headerSize || (off != 0 && off != int64(slotSize)) {
		return nil, 0, 0, false
	}
	payload = make([]byte, n)
	if _, err := f.ReadAt(payload, off+headerSize); err != nil && !(errors.Is(err, io.EOF) && n == 0) {
		return nil, 0, 0, false
	}
	c := crc32.Update(0, castagnoli, h[8:24])
	c = crc32.Update(c, castagnoli, payload)
	if c != sum {
		return nil, 0, 0, false
	}
	return payload, slotSize, gen, true
}

// Generation is the generation of the current copy.
func (b *Block) Generation() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gen
}

// Capacity is the largest payload Write accepts.
func (b *Block) Capacity() int { return b.slotSize - headerSize }

// Write replaces the payload durably.
func (b *Block) Write(payload []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(payload) > b.slotSize-headerSize {
		return fmt.Errorf("superblock: payload of %d bytes exceeds the slot's %d", len(payload), b.slotSize-headerSize)
	}
	if b.gen == math.MaxUint64 {
		// Only a forged or corrupted copy gets here (2^64 updates):
		// generation 0 would lose to it at every read, so the payload
		// written would never be read back.
		return errors.New("superblock: generation exhausted")
	}
	gen := b.gen + 1
	buf := make([]byte, headerSize+len(payload))
	copy(buf, magic)
	binary.BigEndian.PutUint64(buf[8:], gen)
	binary.BigEndian.PutUint32(buf[16:], uint32(b.slotSize))
	binary.BigEndian.PutUint32(buf[20:], uint32(len(payload)))
	copy(buf[headerSize:], payload)
	c := crc32.Update(0, castagnoli, buf[8:24])
	c = crc32.Update(c, castagnoli, payload)
	binary.BigEndian.PutUint32(buf[24:], c)
	slot := 1 - b.cur
	if _, err := b.f.WriteAt(buf, int64(slot)*int64(b.slotSize)); err != nil {
		return fmt.Errorf("superblock: write: %w", err)
	}
	if err := b.f.Sync(); err != nil {
		return fmt.Errorf("superblock: sync: %w", err)
	}
	b.gen, b.cur = gen, slot
	return nil
}

// Close closes the file.
func (b *Block) Close() error { return b.f.Close() }
