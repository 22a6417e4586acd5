package crypt

import (
	"github.com/klauspost/cpuid/v2"
	"golang.org/x/sys/cpu"
)

// The AES-NI kernel (xts_amd64.s). Each call runs len(src)/16 blocks of
// one sector from the tweak at *tweak, leaving there the tweak of the
// block after the last; dst and src are the same slice or disjoint.

//go:noescape
func xtsEncryptAsm(rk *roundKeys, dst, src []byte, tweak *[16]byte)

//go:noescape
func xtsDecryptAsm(rk *roundKeys, dst, src []byte, tweak *[16]byte)

// The VAES kernel: sixteen blocks at a time in 256-bit registers (AMD
// Zen 3 and later, Intel Ice Lake and later): 9 GB/s per core on the Zen 4
// of bench/RESULTS.md against 5.9 for the AES-NI kernel. len(src) must be
// a multiple of 256.

//go:noescape
func xtsEncryptVAES(rk *roundKeys, dst, src []byte, tweak *[16]byte)

//go:noescape
func xtsDecryptVAES(rk *roundKeys, dst, src []byte, tweak *[16]byte)

var (
	haveAESNI = cpu.X86.HasAES && cpu.X86.HasSSE2
	// The VAES kernel also multiplies with 256-bit VPCLMULQDQ. x/sys/cpu
	// reports those two only along with AVX-512, which the kernel does not
	// need (AMD Zen 3 and Intel Alder Lake have them without it); cpuid
	// reports them as such, and AVX2 only where the OS saves the YMM
	// registers.
	haveVAES = haveAESNI && cpuid.CPU.Supports(cpuid.AVX2, cpuid.VAES, cpuid.VPCLMULQDQ)
)

// newKernel returns the AES-NI kernel for a 32-byte data key, or nil
// where the CPU has no AES-NI.
func newKernel(key []byte) *kernel {
	if !haveAESNI {
		return nil
	}
	k := &kernel{wide: haveVAES}
	k.enc, k.dec = expandKey256(key)
	return k
}

func (k *kernel) encrypt(dst, src []byte, tweak *[16]byte) {
	if n := len(src) &^ 255; k.wide && n > 0 {
		xtsEncryptVAES(&k.enc, dst[:n], src[:n], tweak)
		dst, src = dst[n:], src[n:]
	}
	if len(src) > 0 {
		xtsEncryptAsm(&k.enc, dst, src, tweak)
	}
}

func (k *kernel) decrypt(dst, src []byte, tweak *[16]byte) {
	if n := len(src) &^ 255; k.wide && n > 0 {
		xtsDecryptVAES(&k.dec, dst[:n], src[:n], tweak)
		dst, src = dst[n:], src[n:]
	}
	if len(src) > 0 {
		xtsDecryptAsm(&k.dec, dst, src, tweak)
	}
}
