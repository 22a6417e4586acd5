package crypt

import "sync"

// AES-256 key schedule (FIPS-197 §5.2) for the assembly XTS kernels,
// which need the round keys in memory; the standard library does not
// expose its own. Computed once per key, so it is written for clarity: the S-box
// is derived from its definition rather than tabled.

// aesRounds is AES-256's round count; a schedule holds aesRounds+1 keys.
const aesRounds = 14

// roundKeys is an expanded key: round key r in bytes [16r, 16r+16).
type roundKeys [(aesRounds + 1) * 16]byte

// gmul multiplies in GF(2^8) modulo x^8 + x^4 + x^3 + x + 1.
func gmul(a, b byte) byte {
	var p byte
	for ; b != 0; b >>= 1 {
		if b&1 != 0 {
			p ^= a
		}
		a = a<<1 ^ 0x1b*(a>>7)
	}
	return p
}

// sbox is the AES S-box: the multiplicative inverse (0 for 0), then the
// affine map b ^ rotl(b,1) ^ rotl(b,2) ^ rotl(b,3) ^ rotl(b,4) ^ 0x63.
var sbox = sync.OnceValue(func() (s [256]byte) {
	rotl := func(b byte, n uint) byte { return b<<n | b>>(8-n) }
	for a := range 256 {
		var inv byte
		for b := 1; a != 0 && b < 256; b++ {
			if gmul(byte(a), byte(b)) == 1 {
				inv = byte(b)
				break
			}
		}
		s[a] = inv ^ rotl(inv, 1) ^ rotl(inv, 2) ^ rotl(inv, 3) ^ rotl(inv, 4) ^ 0x63
	}
	return s
})

// expandKey256 returns the encryption schedule of a 32-byte key and the
// decryption schedule of the equivalent inverse cipher (FIPS-197 §5.3.5),
// the form AESDEC takes: the encryption keys in reverse order, the inner
// ones passed through InvMixColumns.
func expandKey256(key []byte) (enc, dec roundKeys) {
	s := sbox()
	// sub looks a key byte up in the S-box in constant time: reading
	// s[x] directly would leave which cache line holds x — part of the
	// key — to be measured by anyone sharing the CPU's caches.
	sub := func(x byte) byte {
		var v byte
		for i := range 256 {
			eq := uint(i ^ int(x))      // 0 only at i == x
			v |= s[i] & byte((eq-1)>>8) // mask 0xff only when eq == 0
		}
		return v
	}
	copy(enc[:32], key)
	rcon := byte(1)
	for i := 32; i < len(enc); i += 4 {
		t := [4]byte(enc[i-4 : i])
		switch i / 4 % 8 {
		case 0: // RotWord, SubWord, Rcon
			t = [4]byte{sub(t[1]) ^ rcon, sub(t[2]), sub(t[3]), sub(t[0])}
			rcon = gmul(rcon, 2)
		case 4: // SubWord
			t = [4]byte{sub(t[0]), sub(t[1]), sub(t[2]), sub(t[3])}
		}
		for j := range 4 {
			enc[i+j] = enc[i-32+j] ^ t[j]
		}
	}
	for r := 0; r <= aesRounds; r++ {
		k := enc[(aesRounds-r)*16:][:16]
		d := dec[r*16:][:16]
		if r == 0 || r == aesRounds {
			copy(d, k)
			continue
		}
		for c := 0; c < 16; c += 4 {
			a0, a1, a2, a3 := k[c], k[c+1], k[c+2], k[c+3]
			d[c] = gmul(a0, 14) ^ gmul(a1, 11) ^ gmul(a2, 13) ^ gmul(a3, 9)
			d[c+1] = gmul(a0, 9) ^ gmul(a1, 14) ^ gmul(a2, 11) ^ gmul(a3, 13)
			d[c+2] = gmul(a0, 13) ^ gmul(a1, 9) ^ gmul(a2, 14) ^ gmul(a3, 11)
			d[c+3] = gmul(a0, 11) ^ gmul(a1, 13) ^ gmul(a2, 9) ^ gmul(a3, 14)
		}
	}
	return enc, dec
}
