//go:build amd64 && !purego

package md5lanes

import "golang.org/x/sys/cpu"

//go:generate go run gen.go

// blocks8AVX512 and blocks8AVX2 run n blocks of each of eight lanes: lane
// i's state is element i of s[0..3] (a, b, c, d), its blocks start at
// p[i] and follow each other stride[i] bytes apart (64, or 0 for a lane
// not in use, which then reads one block n times and its state is to be
// ignored).
//
// blocks8AVX512 needs AVX-512F and AVX-512VL (its rotate and three-input
// logic on 256-bit registers, and registers Y16-Y31); blocks8AVX2, AVX2.
//
//go:noescape
func blocks8AVX512(s *[4][8]uint32, p *[8]*byte, stride *[8]uint64, n int)

//go:noescape
func blocks8AVX2(s *[4][8]uint32, p *[8]*byte, stride *[8]uint64, n int)

var (
	haveAVX512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL
	haveKernel = haveAVX512 || cpu.X86.HasAVX2
)

// blocks8 runs the best kernel this CPU has.
func blocks8(s *[4][8]uint32, p *[8]*byte, stride *[8]uint64, n int) {
	if haveAVX512 {
		blocks8AVX512(s, p, stride, n)
	} else {
		blocks8AVX2(s, p, stride, n)
	}
}

// kernels are the kernels this CPU can run, by name, for the tests.
func kernels() map[string]func(s *[4][8]uint32, p *[8]*byte, stride *[8]uint64, n int) {
	k := map[string]func(s *[4][8]uint32, p *[8]*byte, stride *[8]uint64, n int){}
	if haveAVX512 {
		k["avx512"] = blocks8AVX512
	}
	if cpu.X86.HasAVX2 {
		k["avx2"] = blocks8AVX2
	}
	return k
}
