package crypt

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"fmt"
)

// xtsCipher is AES-XTS (IEEE 1619) over the standard library's AES: the
// same transform as golang.org/x/crypto/xts, which the tests hold it to
// byte for byte (TestXTSMatchesXCrypto, FuzzXTS). x/crypto/xts works a
// byte at a time (XOR and the tweak's doubling in GF(2^128)); here both are
// two 64-bit words, which makes the mode 2.5× faster on this layer's 4 KiB
// sectors (bench: 145 → 370 MB/s per core); AES itself stays the standard
// library's (AES-NI where the CPU has it).
type xtsCipher struct {
	k1, k2 cipher.Block // data key, tweak key
}

// newXTS takes a 64-byte key: AES-256 data key, then AES-256 tweak key.
func newXTS(key []byte) (*xtsCipher, error) {
	if len(key) != 64 {
		return nil, fmt.Errorf("xts: key is %d bytes, want 64", len(key))
	}
	k1, err := aes.NewCipher(key[:32])
	if err != nil {
		return nil, err
	}
	k2, err := aes.NewCipher(key[32:])
	if err != nil {
		return nil, err
	}
	return &xtsCipher{k1: k1, k2: k2}, nil
}

// Encrypt encrypts sector number sector from src into dst (len(src) a
// multiple of 16; dst and src the same slice or disjoint).
func (c *xtsCipher) Encrypt(dst, src []byte, sector uint64) {
	c.crypt(dst, src, sector, c.k1.Encrypt)
}

// Decrypt is Encrypt's inverse.
func (c *xtsCipher) Decrypt(dst, src []byte, sector uint64) {
	c.crypt(dst, src, sector, c.k1.Decrypt)
}

func (c *xtsCipher) crypt(dst, src []byte, sector uint64, block func(dst, src []byte)) {
	if len(src)%16 != 0 || len(dst) < len(src) {
		panic("xts: sector is not a whole number of 16-byte blocks")
	}
	// The tweak: the sector number, little-endian, encrypted with k2.
	var t [16]byte
	binary.LittleEndian.PutUint64(t[:8], sector)
	c.k2.Encrypt(t[:], t[:])
	lo, hi := binary.LittleEndian.Uint64(t[:8]), binary.LittleEndian.Uint64(t[8:])
	var b [16]byte
	for i := 0; i < len(src); i += 16 {
		s, d := src[i:i+16:i+16], dst[i:i+16:i+16]
		binary.LittleEndian.PutUint64(b[:8], binary.LittleEndian.Uint64(s[:8])^lo)
		binary.LittleEndian.PutUint64(b[8:], binary.LittleEndian.Uint64(s[8:])^hi)
		block(b[:], b[:])
		binary.LittleEndian.PutUint64(d[:8], binary.LittleEndian.Uint64(b[:8])^lo)
		binary.LittleEndian.PutUint64(d[8:], binary.LittleEndian.Uint64(b[8:])^hi)
		// Next tweak: multiply by x modulo x^128 + x^7 + x^2 + x + 1.
		carry := hi >> 63
		hi = hi<<1 | lo>>63
		lo = lo<<1 ^ 0x87&-carry
	}
}
