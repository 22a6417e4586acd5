// Package crypt is the `crypt` layer: encryption at rest for the one child
// below it. The volume service puts it at the top of the `encrypted`
// volume type (over `cow`, so snapshots and clones of the child carry the
// header and stay readable with the same key).
//
// Cipher: AES-256-XTS (xts.go: byte-identical to golang.org/x/crypto/xts,
// tested; many blocks at a time with AES-NI or VAES where the CPU has
// them, 10–15× faster than a block at a time) over 4096-byte sectors; the
// tweak is the sector's number within the data area (little-endian 64-bit,
// dm-crypt's "plain64"), so sector n of a clone decrypts exactly like
// sector n of its origin. Each volume has its own random 64-byte data key,
// created on Env.Create and stored only wrapped by Env.Keys (the cluster's
// key service); a clone (Env.Create with Env.Base) keeps its origin's key
// and header, which its child carries. No plaintext key or plaintext data
// ever reaches the child.
// XTS is confidentiality only: it does not detect tampering with data
// sectors (a `checksum` layer above does, if wanted).
//
// Params: {} (none yet; unknown fields are rejected).
//
// On-disk layout of the child (docs/formats.md):
//
//	[0, 8 KiB)      header: a package superblock with two 4 KiB slots
//	[8 KiB, 4 MiB)  reserved, zero
//	[4 MiB, ...)    data area: logical sector n at 4 MiB + n×4096,
//	                the logical size rounded up to whole sectors
//
// The header payload (see header) holds the format version, cipher name,
// sector size, data offset, logical size, the wrapped data key and an
// HMAC-SHA256 over all of them under a key derived (HKDF) from the data
// key: a wrong cluster key or an edited header fails the build with
// ErrKeyCheck (or Keys.Unwrap's own error) instead of serving garbage.
//
// Zero convention: a sector whose ciphertext is all zeroes reads as
// plaintext zeroes, so a fresh sparse child reads as zeroes and whole-sector
// Trim and WriteZeroes pass to the child as holes. It holds for each
// 512-byte part of a sector (real ciphertext has one all zero with
// probability 2^-4096), so that a crash tearing a write into a hole, at a
// disk's sectors, leaves each part reading as before or as written — never
// garbage (see decrypt). Consequence, as with dm-crypt with
// discards: which sectors are zero/unallocated is visible on disk.
// Extents pass through, shifted by the data offset and rounded to sectors
// (a sector is reported zero or a hole only if all of it is).
//
// Invariants:
//   - Every byte written to the data area is XTS ciphertext of the
//     plaintext written, or zero (a hole/zeroed sector reads as zeroes).
//     Writes are encrypted into pooled buffers, never in the caller's.
//   - A write covering part of a sector re-encrypts the whole sector
//     (read-modify-write) while holding that sector range in rangeLock, so
//     concurrent partial writes to one sector never lose each other; a
//     read of part of a sector holds it shared, so it never decrypts a
//     sector another part of which a write is rewriting.
//   - Trim touches whole sectors only (a partial sector trimmed by the
//     child would decrypt to garbage); WriteZeroes zeroes partial edge
//     sectors by read-modify-write. This assumes the child trims/zeroes
//     with a granularity that divides 4096 or is a 4096-aligned multiple
//     of it, which holds for every basalt layer.
//   - Crash safety: the header is written only on create and resize,
//     through package superblock (new generation into the other slot,
//     then flush), so a crash or torn header write leaves the previous
//     header readable. Resize grows the child (durably) before the header
//     records the new size, so the header never claims sectors the child
//     lacks. Data writes map 1:1 to child writes; FUA and Flush pass
//     through, so durability is the child's.
//   - A child whose header area is all zero (or damaged in both slots)
//     fails to open with ErrNoHeader unless Env.Create is set.
package crypt

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/superblock"
)

func init() {
	block.Register(block.Type{
		Name: "crypt", Doc: "AES-256-XTS encryption at rest, per-volume key wrapped by the cluster key",
		Params:      Params{},
		MinChildren: 1, MaxChildren: 1, New: New, ChildSize: childSize,
	})
}

// Params are the crypt layer's parameters (none yet).
type Params struct{}

// childSize: the header area plus the size rounded up to whole sectors.
func childSize(raw json.RawMessage, size int64, _ int) (int64, error) {
	var p Params
	if err := block.DecodeParams(raw, &p); err != nil {
		return 0, err
	}
	if size <= 0 {
		return 0, fmt.Errorf("size %d must be positive", size)
	}
	return DataOffset + roundUp(size), nil
}

func roundUp(n int64) int64 { return (n + SectorSize - 1) / SectorSize * SectorSize }

// chunkSectors bounds one pooled buffer (1 MiB), hence one child I/O of
// a write or of a read that is not whole sectors; a whole-sector read
// goes to the child in one piece, straight into the caller's buffer.
const chunkSectors = 256

var bufPool = sync.Pool{New: func() any {
	b := make([]byte, chunkSectors*SectorSize)
	return &b
}}

var zeroSector [SectorSize]byte

// Layer is a crypt layer.
type Layer struct {
	child    block.Layer
	params   json.RawMessage
	caps     block.Capabilities
	cipher   *xtsCipher
	checkKey []byte // header MAC key, to rewrite the header on resize
	wrapped  []byte
	sb       *superblock.Block
	size     atomic.Int64
	locks    rangeLock
	resizeMu sync.Mutex
	closed   atomic.Bool
}

// New builds a crypt layer: on env.Create it makes a data key, wraps it
// with env.Keys and writes the header; otherwise — and for a clone
// (env.Create with env.Base), growing the header's size to env.Size — it
// reads the header, unwraps the key and checks it against the header's MAC.
func New(env block.Env, raw json.RawMessage, children []block.Layer) (block.Layer, error) {
	var p Params
	if err := block.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if len(children) != 1 {
		return nil, fmt.Errorf("crypt takes one child, not %d", len(children))
	}
	if env.Keys == nil {
		return nil, ErrNoKeys
	}
	child := children[0]
	l := &Layer{child: child, params: raw, caps: child.Capabilities()}
	l.caps.ReadOnly = l.caps.ReadOnly || env.ReadOnly
	var err error
	switch {
	case env.Create && env.Base == "":
		err = l.create(env)
	case env.Create:
		// A clone: the child (a cow top on the snapshot's image) already
		// holds the origin's header, and its data is encrypted with the
		// origin's key. Keep both; a new key would read it as garbage.
		err = l.open(env)
		if err == nil && env.Size > l.size.Load() {
			err = l.Resize(env.Size) // a clone larger than its snapshot
		}
	default:
		err = l.open(env)
	}
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Layer) create(env block.Env) error {
	if l.caps.ReadOnly {
		return errors.New("cannot create an encrypted volume on a read-only child")
	}
	if env.Size <= 0 {
		return fmt.Errorf("size %d must be positive", env.Size)
	}
	if need := DataOffset + roundUp(env.Size); l.child.Size() < need {
		return fmt.Errorf("child holds %d bytes, a %d-byte encrypted volume needs %d", l.child.Size(), env.Size, need)
	}
	key := make([]byte, KeySize)
	defer clear(key)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("data key: %w", err)
	}
	wrapped, err := env.Keys.Wrap(key)
	if err != nil {
		return fmt.Errorf("wrap data key: %w", err)
	}
	// A wrapper that returned the key (or either AES key) in the clear
	// would put it on disk next to the data: refuse.
	if bytes.Contains(wrapped, key[:KeySize/2]) || bytes.Contains(wrapped, key[KeySize/2:]) {
		return errors.New("wrap data key: the key wrapper returned the key in the clear")
	}
	if err := l.setKey(key); err != nil {
		return err
	}
	l.wrapped = append([]byte(nil), wrapped...)
	// Zero both slots first: a fresh child reads zero anyway, but a reused
	// one might hold an older header with a higher generation, which
	// superblock would prefer over ours.
	hf := headerFile{dev: l.child}
	if _, err := hf.WriteAt(make([]byte, headerArea), 0); err != nil {
		return err
	}
	payload := header{size: env.Size, wrapped: l.wrapped}.encode(l.checkKey)
	sb, err := superblock.CreateFile(hf, HeaderSlot, payload)
	if err != nil {
		return fmt.Errorf("write crypt header: %w", err)
	}
	l.sb = sb
	l.size.Store(env.Size)
	return nil
}

func (l *Layer) open(env block.Env) error {
	if l.child.Size() < DataOffset+SectorSize {
		return fmt.Errorf("child of %d bytes is too small to hold a crypt header and data: %w", l.child.Size(), ErrNoHeader)
	}
	sb, payload, err := superblock.OpenFile(headerFile{dev: l.child})
	if err != nil {
		if errors.Is(err, superblock.ErrCorrupt) {
			return ErrNoHeader
		}
		return fmt.Errorf("read crypt header: %w", err)
	}
	h, err := decodeHeader(payload)
	if err != nil {
		return err
	}
	key, err := env.Keys.Unwrap(h.wrapped)
	if err != nil {
		return fmt.Errorf("unwrap data key (wrong cluster key, or a damaged header?): %w", err)
	}
	defer clear(key)
	if len(key) != KeySize {
		return fmt.Errorf("unwrapped data key has %d bytes, want %d: %w", len(key), KeySize, ErrKeyCheck)
	}
	if err := l.setKey(key); err != nil {
		return err
	}
	if err := verify(payload, l.checkKey); err != nil {
		return err
	}
	if need := DataOffset + roundUp(h.size); l.child.Size() < need {
		return fmt.Errorf("child holds %d bytes but the header's size %d needs %d", l.child.Size(), h.size, need)
	}
	l.wrapped, l.sb = h.wrapped, sb
	l.size.Store(h.size)
	return nil
}

// setKey builds the cipher and the header MAC key from the data key.
func (l *Layer) setKey(key []byte) error {
	c, err := newXTS(key)
	if err != nil {
		return fmt.Errorf("data cipher: %w", err)
	}
	ck, err := checkKeyFor(key)
	if err != nil {
		return fmt.Errorf("header check key: %w", err)
	}
	l.cipher, l.checkKey = c, ck
	return nil
}

// sectors returns the first and last sector [off, off+n) touches (n > 0).
func sectors(off, n int64) (first, last int64) {
	return off / SectorSize, (off + n - 1) / SectorSize
}

// span is the part of sector sec inside [off, off+n): offsets within the
// sector [lo, hi) and the offset in the request where it starts.
func span(sec, off, n int64) (lo, hi, at int64) {
	start := sec * SectorSize
	a, b := max(off, start), min(off+n, start+SectorSize)
	return a - start, b - start, a - off
}

// zeroPart is the unit of the zero convention: a disk's sector, which a
// torn write lands whole or not at all.
const zeroPart = 512

// decrypt turns ciphertext sector ct into plaintext in dst (which may be
// ct itself). Every 512-byte part whose ciphertext is all zero reads as
// zeroes: all of them in a hole, some where a crash tore a write into a
// hole — which re-encrypts the whole sector, even to change one byte of
// it. Had the convention been the whole sector's, the zero parts of such
// a sector would decrypt to garbage, losing bytes next to the write that
// were durably zero; XTS enciphers each 16-byte block on its own, so the
// parts that landed decrypt as written.
func (l *Layer) decrypt(dst, ct []byte, sec int64) {
	var zero uint // bit i: part i of ct is all zero
	for i := range SectorSize / zeroPart {
		part := ct[i*zeroPart : (i+1)*zeroPart]
		// The first 8 bytes settle it for real ciphertext (zero with
		// probability 2^-64): this runs for every sector read.
		if binary.LittleEndian.Uint64(part) == 0 && bytes.Equal(part, zeroSector[:zeroPart]) {
			zero |= 1 << i
		}
	}
	if zero == 1<<(SectorSize/zeroPart)-1 {
		clear(dst[:SectorSize])
		return
	}
	l.cipher.Decrypt(dst[:SectorSize], ct, uint64(sec))
	for i := 0; zero != 0; i, zero = i+1, zero>>1 {
		if zero&1 != 0 {
			clear(dst[i*zeroPart : (i+1)*zeroPart])
		}
	}
}

func (l *Layer) check(write bool) error {
	if l.closed.Load() {
		return block.ErrClosed
	}
	if write && l.caps.ReadOnly {
		return block.ErrReadOnly
	}
	return nil
}

// checkRange is check for a request of [off, off+n), which must lie
// inside the device: past a size that is not a whole number of sectors
// the child holds the rest of the last sector, which is not the device's
// to read or write.
func (l *Layer) checkRange(write bool, off, n int64) error {
	if err := l.check(write); err != nil {
		return err
	}
	if err := block.CheckRange(off, n, l.Size()); err != nil {
		return fmt.Errorf("crypt: %w", err)
	}
	return nil
}

// Size implements block.Device.
func (l *Layer) Size() int64 { return l.size.Load() }

// Capabilities implements block.Device: the child's (every operation maps
// onto the same operation of the child), read-only if the env says so.
func (l *Layer) Capabilities() block.Capabilities { return l.caps }

// Children implements block.Parent.
func (l *Layer) Children() []block.Layer { return []block.Layer{l.child} }

// ReadAt implements block.Device. A request of whole sectors reads the
// ciphertext into p and decrypts it there; any other reads the covering
// sectors' ciphertext into a pooled buffer, decrypts whole sectors
// straight into p and partial edge sectors in place before copying their
// part, holding the sectors shared in rangeLock: a write to the rest of
// a partial edge sector does not overlap the read but rewrites all of
// the sector, which the child could return half written (see rangeLock).
func (l *Layer) ReadAt(p []byte, off int64) error {
	if err := l.checkRange(false, off, int64(len(p))); err != nil {
		return err
	}
	n := int64(len(p))
	if n == 0 {
		return nil
	}
	if off%SectorSize == 0 && n%SectorSize == 0 {
		if err := l.child.ReadAt(p, DataOffset+off); err != nil {
			return fmt.Errorf("crypt read sectors %d+%d: %w", off/SectorSize, n/SectorSize, err)
		}
		l.decryptInPlace(p, off)
		return nil
	}
	first, last := sectors(off, n)
	lk := l.locks.rlock(first, last)
	defer l.locks.unlock(lk)
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for s := first; s <= last; s += chunkSectors {
		k := min(chunkSectors, last-s+1)
		ct := buf[:k*SectorSize]
		if err := l.child.ReadAt(ct, DataOffset+s*SectorSize); err != nil {
			return fmt.Errorf("crypt read sectors %d+%d: %w", s, k, err)
		}
		// Partial edge sectors (at most two per request) in place, then
		// whole sectors straight into p, in parallel for large requests.
		for _, i := range l.partial(s, k, off, n) {
			sec := s + i
			c := ct[i*SectorSize : (i+1)*SectorSize]
			lo, hi, at := span(sec, off, n)
			l.decrypt(c, c, sec)
			copy(p[at:], c[lo:hi])
		}
		parallel(k, func(i int64) {
			sec := s + i
			if lo, hi, at := span(sec, off, n); lo == 0 && hi == SectorSize {
				l.decrypt(p[at:at+SectorSize], ct[i*SectorSize:(i+1)*SectorSize], sec)
			}
		})
	}
	return nil
}

// genericTryMax: without an assembly kernel (XTS at about 0.6 GB/s per
// core), TryReadAt takes reads up to this size; decrypting 2 MiB would
// hold the caller (the NBD server's reader) for milliseconds.
const genericTryMax = 16 << 10

// TryReadAt implements block.NoWaitReader for whole-sector reads: the
// ciphertext read from the child at once into p, then decrypted in place
// (spread over the CPUs from 64 KiB, as ReadAt does). With an assembly
// kernel it takes any size: a 1 MiB read decrypts in about 120 µs on one
// core here, and answering it in the NBD reader measured faster than
// handing it to another goroutine (bench/RESULTS.md 2026-11-26).
func (l *Layer) TryReadAt(p []byte, off int64) bool {
	n := int64(len(p))
	if n == 0 || off%SectorSize != 0 || n%SectorSize != 0 || l.checkRange(false, off, n) != nil {
		return false
	}
	if l.cipher.kernel == nil && n > genericTryMax {
		return false
	}
	if !block.TryReadAt(l.child, p, DataOffset+off) {
		return false
	}
	l.decryptInPlace(p, off)
	return true
}

// decryptInPlace decrypts p, the ciphertext of whole sectors from data
// offset off, in place.
func (l *Layer) decryptInPlace(p []byte, off int64) {
	parallel(int64(len(p))/SectorSize, func(i int64) {
		sec := p[i*SectorSize : (i+1)*SectorSize]
		l.decrypt(sec, sec, off/SectorSize+i)
	})
}

// WriteAt implements block.Device: encrypt into a pooled buffer, one child
// write per chunk of up to 1 MiB; partial edge sectors are read, decrypted,
// patched and re-encrypted under the sector lock.
func (l *Layer) WriteAt(p []byte, off int64, fua bool) error {
	if err := l.checkRange(true, off, int64(len(p))); err != nil {
		return err
	}
	if fua && !l.caps.FUA {
		return block.ErrNotSupported
	}
	n := int64(len(p))
	if n == 0 {
		return nil
	}
	first, last := sectors(off, n)
	lk := l.locks.lock(first, last)
	defer l.locks.unlock(lk)
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for s := first; s <= last; s += chunkSectors {
		k := min(chunkSectors, last-s+1)
		out := buf[:k*SectorSize]
		for _, i := range l.partial(s, k, off, n) {
			sec := s + i
			o := out[i*SectorSize : (i+1)*SectorSize]
			lo, hi, at := span(sec, off, n)
			if err := l.readPlain(o, sec); err != nil {
				return err
			}
			copy(o[lo:hi], p[at:])
			l.cipher.Encrypt(o, o, uint64(sec))
		}
		parallel(k, func(i int64) {
			sec := s + i
			if lo, hi, at := span(sec, off, n); lo == 0 && hi == SectorSize {
				l.cipher.Encrypt(out[i*SectorSize:(i+1)*SectorSize], p[at:at+SectorSize], uint64(sec))
			}
		})
		if err := l.child.WriteAt(out, DataOffset+s*SectorSize, fua); err != nil {
			return fmt.Errorf("crypt write sectors %d+%d: %w", s, k, err)
		}
	}
	return nil
}

// partial lists the sectors among s..s+k-1 (as offsets from s) that
// [off, off+n) covers only partly: the request's first and last sector
// at most.
func (l *Layer) partial(s, k, off, n int64) []int64 {
	var out []int64
	first, last := sectors(off, n)
	for _, sec := range []int64{first, last} {
		if sec < s || sec >= s+k || len(out) > 0 && out[0] == sec-s {
			continue
		}
		if lo, hi, _ := span(sec, off, n); lo != 0 || hi != SectorSize {
			out = append(out, sec-s)
		}
	}
	return out
}

// parallelMin is the number of sectors (64 KiB) from which a request's
// encryption is spread over the CPUs, so that a single large request is
// not bound by one core; below it the goroutines cost more than they
// save.
const parallelMin = 16

// parallel runs fn(0..k-1), split into contiguous runs over up to
// GOMAXPROCS goroutines when k is large enough.
func parallel(k int64, fn func(i int64)) {
	workers := min(int64(runtime.GOMAXPROCS(0)), k/(parallelMin/2))
	if k < parallelMin || workers < 2 {
		for i := int64(0); i < k; i++ {
			fn(i)
		}
		return
	}
	var wg sync.WaitGroup
	per := (k + workers - 1) / workers
	for a := int64(0); a < k; a += per {
		b := min(a+per, k)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := a; i < b; i++ {
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// readPlain reads sector sec's plaintext into o (SectorSize bytes).
func (l *Layer) readPlain(o []byte, sec int64) error {
	if err := l.child.ReadAt(o, DataOffset+sec*SectorSize); err != nil {
		return fmt.Errorf("crypt read sector %d for a partial write: %w", sec, err)
	}
	l.decrypt(o, o, sec)
	return nil
}

// zeroPart zeroes [lo, hi) of sector sec by read-modify-write.
func (l *Layer) zeroPart(sec, lo, hi int64, fua bool) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	o := (*bp)[:SectorSize]
	if err := l.readPlain(o, sec); err != nil {
		return err
	}
	clear(o[lo:hi])
	l.cipher.Encrypt(o, o, uint64(sec))
	if err := l.child.WriteAt(o, DataOffset+sec*SectorSize, fua); err != nil {
		return fmt.Errorf("crypt zero sector %d: %w", sec, err)
	}
	return nil
}

// WriteZeroes implements block.Device: whole sectors become zero
// ciphertext in the child (holes unless NoHole), which reads as plaintext
// zeroes; partial edge sectors are re-encrypted with their part zeroed.
// The child goes first so a Fast request it refuses fails before anything
// changed.
func (l *Layer) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if err := l.checkRange(true, off, n); err != nil {
		return err
	}
	if !l.caps.WriteZeroes || f.Fast && !l.caps.FastZero || f.FUA && !l.caps.FUA {
		return block.ErrNotSupported
	}
	if n <= 0 {
		return nil
	}
	first, last := sectors(off, n)
	lk := l.locks.lock(first, last)
	defer l.locks.unlock(lk)
	full0, full1 := (off+SectorSize-1)/SectorSize, (off+n)/SectorSize // whole sectors [full0, full1)
	if full0 < full1 {
		if err := l.child.WriteZeroes(DataOffset+full0*SectorSize, (full1-full0)*SectorSize, f); err != nil {
			return fmt.Errorf("crypt zero sectors %d+%d: %w", full0, full1-full0, err)
		}
	}
	if lo, hi, _ := span(first, off, n); lo != 0 || hi != SectorSize {
		if err := l.zeroPart(first, lo, hi, f.FUA); err != nil {
			return err
		}
	}
	if last != first {
		if lo, hi, _ := span(last, off, n); lo != 0 || hi != SectorSize {
			if err := l.zeroPart(last, lo, hi, f.FUA); err != nil {
				return err
			}
		}
	}
	return nil
}

// Trim implements block.Device: whole sectors inside the range pass to the
// child; partial edge sectors are left alone (trim is advisory, and a
// partly trimmed sector would decrypt to garbage).
func (l *Layer) Trim(off, n int64, fua bool) error {
	if err := l.checkRange(true, off, n); err != nil {
		return err
	}
	if !l.caps.Trim || fua && !l.caps.FUA {
		return block.ErrNotSupported
	}
	full0, full1 := (off+SectorSize-1)/SectorSize, (off+n)/SectorSize
	if full0 >= full1 {
		return nil
	}
	lk := l.locks.lock(full0, full1-1)
	defer l.locks.unlock(lk)
	if err := l.child.Trim(DataOffset+full0*SectorSize, (full1-full0)*SectorSize, fua); err != nil {
		return fmt.Errorf("crypt trim sectors %d+%d: %w", full0, full1-full0, err)
	}
	return nil
}

// Flush implements block.Device: the child's flush makes every completed
// write durable (crypt keeps no data of its own in memory).
func (l *Layer) Flush() error {
	if err := l.check(false); err != nil {
		return err
	}
	if !l.caps.Flush {
		return block.ErrNotSupported
	}
	return l.child.Flush()
}

// Extents implements block.Device: the child's extents of the covering
// sectors, shifted by the data offset. A zero or hole extent is trusted
// only for the sectors it covers entirely — a sector with some zero bytes
// of ciphertext is still data — so partial ones are reported as data
// (always a safe answer).
func (l *Layer) Extents(off, n int64) ([]block.Extent, error) {
	if err := l.checkRange(false, off, n); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil // nothing to describe (block.Device)
	}
	if !l.caps.Extents {
		return []block.Extent{{Length: n}}, nil
	}
	first, last := sectors(off, n)
	base := first * SectorSize // logical offset of the first covering sector
	ex, err := l.child.Extents(DataOffset+base, (last-first+1)*SectorSize)
	if err != nil {
		return nil, fmt.Errorf("crypt extents: %w", err)
	}
	var merged []block.Extent
	for _, e := range ex {
		if e.Length > 0 {
			merged = block.AppendExtent(merged, e)
		}
	}
	var out []block.Extent
	// emit appends [a, b) (logical offsets) with e's flags, clipped to the
	// request.
	emit := func(a, b int64, e block.Extent) {
		a, b = max(a, off), min(b, off+n)
		if a < b {
			out = block.AppendExtent(out, block.Extent{Length: b - a, Hole: e.Hole, Zero: e.Zero})
		}
	}
	pos := base
	for _, e := range merged {
		end := pos + e.Length
		if !e.Hole && !e.Zero {
			emit(pos, end, e)
		} else {
			in0, in1 := roundUp(pos), end/SectorSize*SectorSize
			if in0 >= in1 {
				emit(pos, end, block.Extent{})
			} else {
				emit(pos, in0, block.Extent{})
				emit(in0, in1, e)
				emit(in1, end, block.Extent{})
			}
		}
		pos = end
	}
	if pos%SectorSize != 0 {
		// The child answered short, mid-sector: the rest of that sector is
		// unknown, so call it data.
		emit(pos, roundUp(pos), block.Extent{})
	}
	if len(out) == 0 {
		return []block.Extent{{Length: n}}, nil
	}
	return out, nil
}

// Resize implements block.Resizer: grow the child to hold the new size,
// then record the size in the header (a superblock update: crash-safe).
func (l *Layer) Resize(n int64) error {
	if err := l.check(true); err != nil {
		return err
	}
	l.resizeMu.Lock()
	defer l.resizeMu.Unlock()
	cur := l.size.Load()
	if n < cur {
		return fmt.Errorf("crypt resize: cannot shrink from %d to %d bytes", cur, n)
	}
	if n == cur {
		return nil
	}
	if n > block.MaxSize {
		// The header could not record it (open refuses such a size as
		// implausible), and the child size it needs may wrap negative.
		return fmt.Errorf("crypt resize: %d bytes exceed the largest device size, %d", n, int64(block.MaxSize))
	}
	if need := DataOffset + roundUp(n); l.child.Size() < need {
		r, ok := l.child.(block.Resizer)
		if !ok {
			return fmt.Errorf("crypt resize: child (%s) cannot grow", l.child.Describe().Type)
		}
		if err := r.Resize(need); err != nil {
			return fmt.Errorf("crypt resize child: %w", err)
		}
	}
	if err := l.sb.Write(header{size: n, wrapped: l.wrapped}.encode(l.checkKey)); err != nil {
		return fmt.Errorf("crypt resize: %w", err)
	}
	l.size.Store(n)
	return nil
}

// Close implements block.Device.
func (l *Layer) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	return l.child.Close()
}

// Describe implements block.Layer.
func (l *Layer) Describe() block.Node {
	kids := block.Describe([]block.Layer{l.child})
	return block.Node{Type: "crypt", Params: l.params, State: block.Worst(kids), Children: kids}
}
