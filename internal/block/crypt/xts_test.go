package crypt

import (
	"bytes"
	"crypto/aes"
	"math/rand/v2"
	"testing"

	"golang.org/x/crypto/xts"
)

// impls are the implementations a CPU may run: the best it has, then
// each slower one in turn, so that all of them are held to x/crypto/xts
// on a CPU that has the best.
var impls = []string{"best", "narrow", "generic"}

// The reference: golang.org/x/crypto/xts with the same key; ours in
// implementation impl.
func xtsPair(t testing.TB, key []byte, impl string) (*xtsCipher, *xts.Cipher) {
	t.Helper()
	ours, err := newXTS(key)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case impl == "narrow" && ours.kernel != nil:
		ours.kernel.wide = false
	case impl == "generic":
		ours.kernel = nil
	}
	ref, err := xts.NewCipher(aes.NewCipher, key)
	if err != nil {
		t.Fatal(err)
	}
	return ours, ref
}

func checkXTS(t testing.TB, ours *xtsCipher, ref *xts.Cipher, plain []byte, sector uint64) {
	want := make([]byte, len(plain))
	ref.Encrypt(want, plain, sector)
	got := make([]byte, len(plain))
	ours.Encrypt(got, plain, sector)
	if !bytes.Equal(got, want) {
		t.Fatalf("sector %d, %d bytes: ciphertext differs from x/crypto/xts", sector, len(plain))
	}
	inPlace := bytes.Clone(plain)
	ours.Encrypt(inPlace, inPlace, sector)
	if !bytes.Equal(inPlace, want) {
		t.Fatalf("sector %d: in-place encryption differs", sector)
	}
	ours.Decrypt(got, want, sector)
	if !bytes.Equal(got, plain) {
		t.Fatalf("sector %d: decryption does not return the plaintext", sector)
	}
	ours.Decrypt(inPlace, inPlace, sector)
	if !bytes.Equal(inPlace, plain) {
		t.Fatalf("sector %d: in-place decryption does not return the plaintext", sector)
	}
}

func TestXTSMatchesXCrypto(t *testing.T) {
	switch k := newKernel(make([]byte, 32)); {
	case k == nil:
		t.Log("no assembly kernel on this CPU: testing the generic implementation only")
	case !k.wide:
		t.Log("no VAES kernel on this CPU: testing the AES-NI and generic ones")
	}
	for _, impl := range impls {
		testXTSMatchesXCrypto(t, impl)
	}
	if _, err := newXTS(make([]byte, 32)); err == nil {
		t.Fatal("a 32-byte key was accepted")
	}
}

func testXTSMatchesXCrypto(t *testing.T, impl string) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		key := make([]byte, 64)
		for i := range key {
			key[i] = byte(rng.Uint32())
		}
		ours, ref := xtsPair(t, key, impl)
		// Sector numbers with high bits set and sectors long enough for the
		// tweak's doubling to carry out of both words many times; lengths
		// that are and are not whole batches of the kernels' eight and
		// sixteen blocks.
		for _, n := range []int{16, 32, 128, 144, 240, 256, 272, 384, 512, 784, 4080, SectorSize} {
			plain := make([]byte, n)
			for i := range plain {
				plain[i] = byte(rng.Uint32())
			}
			checkXTS(t, ours, ref, plain, rng.Uint64())
			checkXTS(t, ours, ref, plain, uint64(rng.IntN(1<<20)))
		}
	}
}

func FuzzXTS(f *testing.F) {
	f.Add(make([]byte, 64), make([]byte, 32), uint64(0))
	f.Add(bytes.Repeat([]byte{0xff}, 64), bytes.Repeat([]byte{0x80}, 4096), ^uint64(0))
	f.Fuzz(func(t *testing.T, key, plain []byte, sector uint64) {
		if len(key) < 64 || len(plain) < 16 {
			return
		}
		for _, impl := range impls {
			ours, ref := xtsPair(t, key[:64], impl)
			checkXTS(t, ours, ref, plain[:len(plain)/16*16], sector)
		}
	})
}

func BenchmarkXTS(b *testing.B) {
	key := bytes.Repeat([]byte{7}, 64)
	_, ref := xtsPair(b, key, "generic")
	buf := make([]byte, SectorSize)
	b.Run("x-crypto", func(b *testing.B) {
		b.SetBytes(SectorSize)
		for i := range b.N {
			ref.Encrypt(buf, buf, uint64(i))
		}
	})
	for _, impl := range impls {
		ours, _ := xtsPair(b, key, impl)
		b.Run(impl, func(b *testing.B) {
			b.SetBytes(SectorSize)
			for i := range b.N {
				ours.Encrypt(buf, buf, uint64(i))
			}
		})
	}
}

// TestXTSRefusesPartialOverlap: a dst that starts inside src would be
// overwritten before it is read; like x/crypto/xts, the cipher panics
// instead of returning wrong ciphertext.
func TestXTSRefusesPartialOverlap(t *testing.T) {
	c, err := newXTS(bytes.Repeat([]byte{3}, 64))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, SectorSize+128)
	for _, shift := range []int{16, 128} {
		for name, f := range map[string]func(dst, src []byte, sector uint64){"encrypt": c.Encrypt, "decrypt": c.Decrypt} {
			func() {
				defer func() {
					if recover() == nil {
						t.Errorf("%s with dst %d bytes into src did not panic", name, shift)
					}
				}()
				f(buf[shift:shift+SectorSize], buf[:SectorSize], 1)
			}()
		}
	}
	c.Encrypt(buf[:SectorSize], buf[:SectorSize], 1) // in place is fine
	c.Encrypt(buf[SectorSize:], buf[:128], 1)        // disjoint is fine
}
