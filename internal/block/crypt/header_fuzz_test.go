package crypt

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/superblock"
)

// realHeader is the header payload a real create wrote: a crypt layer over
// a file, built with keys, read back from the child's superblock.
func realHeader(tb testing.TB, keys block.Keys, size int64) []byte {
	tb.Helper()
	dir := tb.TempDir()
	l := build(tb, block.Env{Dir: dir, Size: size, Create: true, Keys: keys})
	if err := l.Close(); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "a.img"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	_, p, err := superblock.OpenFile(f)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// FuzzDecodeHeader proves that decodeHeader is a strict parser: whatever
// it accepts has a plausible size and is the canonical encoding of the
// header it returns — encode gives back the input byte for byte up to the
// MAC, and decoding that gives the same header — and the header does not
// alias the input. It also proves that the MAC verify checks covers
// exactly those bytes: the re-encoding verifies under its check key, the
// input does only if its MAC is that one, and flipping any one byte of
// the re-encoding fails. The other way round, every plausible size with
// any wrapped key that fits the length field encodes to a payload that
// decodes back to them.
func FuzzDecodeHeader(f *testing.F) {
	keys := newKeys(f)
	for _, size := range []int64{1 << 20, 5000} {
		p := realHeader(f, keys, size)
		if h, err := decodeHeader(p); err != nil || h.size != size {
			f.Fatalf("real header for size %d: %+v, %v", size, h, err)
		}
		f.Add(p, uint16(0), size)
		f.Add(p[:len(p)-1], uint16(3), size)                  // MAC cut short
		f.Add(append(bytes.Clone(p), 0), uint16(40), size)    // a byte after the MAC
		f.Add(p[:8+4+4+8+8+1+5], uint16(len(p)-1), int64(-1)) // cut inside the cipher name
	}
	valid := header{size: 1 << 30, wrapped: []byte("wrapped key")}.encode(make([]byte, 32))
	f.Add(valid, uint16(9), int64(1)<<62)
	for _, edit := range []func(p []byte){
		func(p []byte) { p[0] = 'X' },                                  // kind
		func(p []byte) { p[11] = 2 },                                   // version
		func(p []byte) { p[15] = 0 },                                   // sector size
		func(p []byte) { binary.BigEndian.PutUint64(p[24:], 0) },       // size 0
		func(p []byte) { binary.BigEndian.PutUint64(p[24:], 1<<62+1) }, // size too large
		func(p []byte) { p[32]-- },                                     // cipher name length
		func(p []byte) { p[33+len(CipherName)+1]++ },                   // wrapped length
		func(p []byte) { binary.BigEndian.PutUint16(p[33+len(CipherName):], 0xffff) },
	} {
		p := bytes.Clone(valid)
		edit(p)
		f.Add(p, uint16(1), int64(0))
	}
	f.Add([]byte{}, uint16(0), int64(0))

	// A fixed data key: the MAC key is derived from it exactly as open does.
	checkKey, err := checkKeyFor(bytes.Repeat([]byte{0x5a}, KeySize))
	if err != nil {
		f.Fatal(err)
	}
	const fixedLen = 8 + 4 + 4 + 8 + 8 + 1 + len(CipherName) + 2
	f.Fuzz(func(t *testing.T, in []byte, flip uint16, size int64) {
		p := bytes.Clone(in) // cleared below; the engine's input must not be
		h, err := decodeHeader(p)
		if err == nil {
			if h.size <= 0 || h.size > 1<<62 {
				t.Fatalf("accepted size %d", h.size)
			}
			if len(p) != fixedLen+len(h.wrapped)+macSize {
				t.Fatalf("accepted %d bytes holding a %d-byte wrapped key", len(p), len(h.wrapped))
			}
			enc := h.encode(checkKey)
			if !bytes.Equal(enc[:len(enc)-macSize], p[:len(p)-macSize]) {
				t.Fatalf("re-encoding differs before the MAC:\n got % x\nwant % x", enc[:len(enc)-macSize], p[:len(p)-macSize])
			}
			h2, err := decodeHeader(enc)
			if err != nil {
				t.Fatalf("decoding the re-encoding: %v", err)
			}
			if h2.size != h.size || !bytes.Equal(h2.wrapped, h.wrapped) {
				t.Fatalf("re-decoded %+v, want %+v", h2, h)
			}
			if err := verify(enc, checkKey); err != nil {
				t.Fatalf("the re-encoding does not verify: %v", err)
			}
			if got, want := verify(p, checkKey) == nil, bytes.Equal(p, enc); got != want {
				t.Fatalf("input verifies: %v, but its MAC is the right one: %v", got, want)
			}
			bad := bytes.Clone(enc)
			bad[int(flip)%len(bad)] ^= 1 << (flip % 8)
			if verify(bad, checkKey) == nil {
				t.Fatalf("flipping byte %d of a %d-byte header still verifies", int(flip)%len(bad), len(bad))
			}
			wrapped := bytes.Clone(h.wrapped)
			clear(p)
			if !bytes.Equal(h.wrapped, wrapped) {
				t.Fatal("the decoded wrapped key aliases the input")
			}
		}

		// The other way: encode, then decode.
		if size <= 0 || size > 1<<62 || len(in) > 0xffff {
			return
		}
		w := bytes.Clone(in)
		enc := header{size: size, wrapped: w}.encode(checkKey)
		h3, err := decodeHeader(enc)
		if err != nil {
			t.Fatalf("decoding the encoding of size %d, %d-byte key: %v", size, len(w), err)
		}
		if h3.size != size || !bytes.Equal(h3.wrapped, w) {
			t.Fatalf("round trip gives size %d, key % x; want %d, % x", h3.size, h3.wrapped, size, w)
		}
		if err := verify(enc, checkKey); err != nil {
			t.Fatalf("an encoding does not verify: %v", err)
		}
	})
}
