package crypt

import (
	"bytes"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/basalt-storage/basalt/internal/block"
)

// On-disk constants of format version 1.
const (
	// SectorSize is the encryption unit: one XTS data unit.
	SectorSize = 4096
	// HeaderSlot is the size of one header copy; the two copies fill
	// [0, 2*HeaderSlot) of the child.
	HeaderSlot = 4096
	// headerArea is the part of the child the header adapter may touch.
	headerArea = 2 * HeaderSlot
	// DataOffset is where the data area starts in the child. The gap
	// [8 KiB, 4 MiB) is reserved (zero, never written: sparse) so a later
	// format can grow its header without moving data; 4 MiB keeps
	// requests aligned to 1 MiB (Lustre stripes, GPFS blocks, huge pages)
	// aligned in the child.
	DataOffset = 4 << 20

	formatVersion = 1
	kindTag       = "BSLTCRYP"
	// CipherName names the data cipher: AES-256 in XTS mode (64-byte key),
	// tweak = little-endian 64-bit sector number in the data area (what
	// dm-crypt calls aes-xts-plain64).
	CipherName = "aes-256-xts-plain64"
	// KeySize is the size of the data key (two AES-256 keys).
	KeySize = 64

	macSize = sha256.Size
	// checkInfo labels the HKDF derivation of the header MAC key from the
	// data key, so the MAC key is independent of the cipher keys.
	checkInfo = "basalt crypt v1 header check"
)

// Errors a build can fail with, for callers that want to tell them apart.
var (
	// ErrNoKeys: env.Keys is nil, so no data key can be wrapped or unwrapped.
	ErrNoKeys = errors.New("no cluster key wrapper (env.Keys is nil): an encrypted volume needs the cluster's key service")
	// ErrNoHeader: neither header copy at the start of the child is valid.
	ErrNoHeader = errors.New("no valid crypt header at the start of the child (not an encrypted volume, creation never completed, or both header copies damaged)")
	// ErrKeyCheck: the unwrapped key does not authenticate the header.
	ErrKeyCheck = errors.New("key check failed: the cluster key differs from the one this volume was created with, or the header was tampered with")
)

// header is the decoded payload of the superblock at the start of the
// child. Layout (big-endian):
//
//	kind "BSLTCRYP" (8) | version u32 | sector size u32 | data offset u64 |
//	size u64 | cipher length u8 | cipher | wrapped length u16 | wrapped key |
//	mac (32)
//
// mac = HMAC-SHA256(HKDF-SHA256(data key, info checkInfo), every byte
// before it). Only the holder of the data key can produce a header that
// verifies, so a wrong cluster key (whose Unwrap yields another key) or an
// edited header (size, cipher, wrapped key) fails the build instead of
// serving garbage.
type header struct {
	size    int64  // logical size presented to the layer above
	wrapped []byte // the data key as env.Keys wrapped it
}

// encode returns the payload for h, authenticated with checkKey.
func (h header) encode(checkKey []byte) []byte {
	var b bytes.Buffer
	b.WriteString(kindTag)
	binary.Write(&b, binary.BigEndian, uint32(formatVersion))
	binary.Write(&b, binary.BigEndian, uint32(SectorSize))
	binary.Write(&b, binary.BigEndian, uint64(DataOffset))
	binary.Write(&b, binary.BigEndian, uint64(h.size))
	b.WriteByte(byte(len(CipherName)))
	b.WriteString(CipherName)
	binary.Write(&b, binary.BigEndian, uint16(len(h.wrapped)))
	b.Write(h.wrapped)
	m := hmac.New(sha256.New, checkKey)
	m.Write(b.Bytes())
	return m.Sum(b.Bytes())
}

// decodeHeader parses a payload strictly; the MAC is checked later by
// verify, once the data key is unwrapped.
func decodeHeader(p []byte) (header, error) {
	var h header
	r := bytes.NewReader(p)
	var fixed struct {
		Kind    [8]byte
		Version uint32
		Sector  uint32
		DataOff uint64
		Size    uint64
	}
	if err := binary.Read(r, binary.BigEndian, &fixed); err != nil {
		return h, fmt.Errorf("crypt header: %w", err)
	}
	if string(fixed.Kind[:]) != kindTag {
		return h, fmt.Errorf("crypt header: kind %q is not %q (another layer's superblock?)", fixed.Kind[:], kindTag)
	}
	if fixed.Version != formatVersion {
		return h, fmt.Errorf("crypt header: format version %d is not supported (this build reads %d)", fixed.Version, formatVersion)
	}
	if fixed.Sector != SectorSize || fixed.DataOff != DataOffset {
		return h, fmt.Errorf("crypt header: sector size %d / data offset %d unsupported (want %d / %d)",
			fixed.Sector, fixed.DataOff, SectorSize, DataOffset)
	}
	if fixed.Size == 0 || fixed.Size > 1<<62 {
		return h, fmt.Errorf("crypt header: implausible size %d", fixed.Size)
	}
	n, err := r.ReadByte()
	if err != nil {
		return h, fmt.Errorf("crypt header: %w", err)
	}
	name := make([]byte, n)
	if _, err := io.ReadFull(r, name); err != nil {
		return h, fmt.Errorf("crypt header: cipher name: %w", err)
	}
	if string(name) != CipherName {
		return h, fmt.Errorf("crypt header: cipher %q is not supported (want %q)", name, CipherName)
	}
	var wl uint16
	if err := binary.Read(r, binary.BigEndian, &wl); err != nil {
		return h, fmt.Errorf("crypt header: %w", err)
	}
	if int(wl)+macSize != r.Len() {
		return h, fmt.Errorf("crypt header: wrapped key of %d bytes and a %d-byte MAC do not fill the remaining %d bytes", wl, macSize, r.Len())
	}
	h.size = int64(fixed.Size)
	h.wrapped = append([]byte(nil), p[len(p)-r.Len():len(p)-macSize]...)
	return h, nil
}

// checkKeyFor derives the header MAC key from the data key.
func checkKeyFor(dataKey []byte) ([]byte, error) {
	return hkdf.Key(sha256.New, dataKey, nil, checkInfo, 32)
}

// verify checks the MAC at the end of payload p under checkKey.
func verify(p, checkKey []byte) error {
	if len(p) < macSize {
		return ErrKeyCheck
	}
	m := hmac.New(sha256.New, checkKey)
	m.Write(p[:len(p)-macSize])
	if !hmac.Equal(m.Sum(nil), p[len(p)-macSize:]) {
		return ErrKeyCheck
	}
	return nil
}

// headerFile makes the first headerArea bytes of the child a
// superblock.File, so the header lives in band and travels with every
// snapshot or clone of the child. It refuses anything outside that window:
// superblock.OpenFile probes further offsets for a second copy when the
// first is torn, and those probes must not read (or ever write) the data
// area.
type headerFile struct {
	dev block.Device
}

var errOutsideHeader = errors.New("crypt header: access outside the header area")

func (f headerFile) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > headerArea {
		return 0, errOutsideHeader
	}
	if err := f.dev.ReadAt(p, off); err != nil {
		return 0, fmt.Errorf("crypt header: read: %w", err)
	}
	return len(p), nil
}

// WriteAt writes with FUA when the child can do FUA but not Flush, so Sync
// has nothing left to do; otherwise Sync flushes.
func (f headerFile) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > headerArea {
		return 0, errOutsideHeader
	}
	c := f.dev.Capabilities()
	if err := f.dev.WriteAt(p, off, !c.Flush && c.FUA); err != nil {
		return 0, fmt.Errorf("crypt header: write: %w", err)
	}
	return len(p), nil
}

func (f headerFile) Sync() error {
	c := f.dev.Capabilities()
	switch {
	case c.Flush:
		if err := f.dev.Flush(); err != nil {
			return fmt.Errorf("crypt header: flush: %w", err)
		}
	case !c.FUA:
		return errors.New("crypt header: the child supports neither flush nor FUA, so the header cannot be made durable")
	}
	return nil
}

// Close does nothing: the layer closes the child itself.
func (f headerFile) Close() error { return nil }
