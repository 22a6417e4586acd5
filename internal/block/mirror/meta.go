package mirror

import (
	"errors"
	"fmt"
	"io"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/bitmap"
	"github.com/basalt-storage/basalt/internal/block/superblock"
)

// Metadata file layout (see the package comment):
//
//	[0, 8192)   superblock: two 4096-byte slots (package superblock)
//	[8192, …)   bitmap page pairs, interleaved: page p of bitmap j (0 the
//	            write-intent map, 1+i leg i's stale map) is the pair at
//	            8192 + (p×K + j)×8192, K = 1 + number of legs.
//
// Interleaving lets every bitmap grow (Resize) without moving another.
const (
	sbSlot     = superblock.MinSlotSize
	bitmapBase = 2 * sbSlot
	pagePair   = 2 * bitmap.SlotSize
	formatV1   = 1
)

// Leg states as persisted in the superblock.
const (
	legOK         = "ok"
	legFailed     = "failed"
	legRebuilding = "rebuilding"
)

// sbState is the superblock payload (JSON).
type sbState struct {
	Version int      `json:"version"`
	Region  int64    `json:"region"` // bytes per bitmap bit
	Size    int64    `json:"size"`   // the mirror's size in bytes
	Legs    []string `json:"legs"`   // per leg: ok, failed or rebuilding
}

// maxSize bounds a recorded size (as crypt's header does): far beyond any
// real volume, and small enough that sizes and offsets cannot overflow.
const maxSize = 1 << 62

func decodeState(p []byte) (sbState, error) {
	var s sbState
	if err := block.DecodeStrict(p, &s); err != nil {
		return s, fmt.Errorf("superblock payload: %w", err)
	}
	if s.Version != formatV1 {
		return s, fmt.Errorf("superblock format version %d, this build reads %d", s.Version, formatV1)
	}
	if s.Region < 4096 || s.Region&(s.Region-1) != 0 || s.Size <= 0 || s.Size > maxSize {
		return s, fmt.Errorf("superblock: implausible region %d or size %d", s.Region, s.Size)
	}
	for i, st := range s.Legs {
		if st != legOK && st != legFailed && st != legRebuilding {
			return s, fmt.Errorf("superblock: leg %d has unknown state %q", i, st)
		}
	}
	return s, nil
}

// sbSection is the superblock's window [0, bitmapBase) of the metadata
// file; it must not let the superblock read or write the bitmaps.
type sbSection struct{ f block.MetaFile }

func (s sbSection) ReadAt(p []byte, off int64) (int, error) {
	if off >= bitmapBase {
		return 0, io.EOF
	}
	if off+int64(len(p)) > bitmapBase {
		n, err := s.f.ReadAt(p[:bitmapBase-off], off)
		if err == nil {
			err = io.EOF
		}
		return n, err
	}
	return s.f.ReadAt(p, off)
}

func (s sbSection) WriteAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > bitmapBase {
		return 0, errors.New("mirror: superblock write beyond its area")
	}
	return s.f.WriteAt(p, off)
}

func (s sbSection) Sync() error  { return s.f.Sync() }
func (s sbSection) Close() error { return nil } // the layer closes the file once

// interleaved is bitmap j of k in the metadata file: its page pair p lives
// at bitmapBase + (p×k + j)×pagePair.
type interleaved struct {
	f    block.MetaFile
	j, k int64
}

func (s interleaved) phys(off int64) (at, room int64) {
	p, w := off/pagePair, off%pagePair
	return bitmapBase + (p*s.k+s.j)*pagePair + w, pagePair - w
}

func (s interleaved) ReadAt(p []byte, off int64) (int, error) {
	total := 0
	for len(p) > 0 {
		at, room := s.phys(off)
		m := min(int64(len(p)), room)
		n, err := s.f.ReadAt(p[:m], at)
		total += n
		if err != nil {
			return total, err
		}
		p, off = p[m:], off+m
	}
	return total, nil
}

func (s interleaved) WriteAt(p []byte, off int64) (int, error) {
	total := 0
	for len(p) > 0 {
		at, room := s.phys(off)
		m := min(int64(len(p)), room)
		n, err := s.f.WriteAt(p[:m], at)
		total += n
		if err != nil {
			return total, err
		}
		p, off = p[m:], off+m
	}
	return total, nil
}

func (s interleaved) Sync() error  { return s.f.Sync() }
func (s interleaved) Close() error { return nil }

// isEmpty reports whether the metadata file holds nothing (a new file).
func isEmpty(f block.MetaFile) (bool, error) {
	buf := make([]byte, bitmapBase)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	for _, b := range buf[:n] {
		if b != 0 {
			return false, nil
		}
	}
	return true, nil
}
