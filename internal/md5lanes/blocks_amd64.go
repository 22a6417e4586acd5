//go:build amd64 && !purego

package md5lanes

import "golang.org/x/sys/cpu"

//go:generate go run gen.go

// blocks8 runs n blocks of each of eight lanes: lane i's state is element
// i of s[0..3] (a, b, c, d), its blocks start at p[i] and follow each
// other stride[i] bytes apart (64, or 0 for a lane not in use, which
// then reads one block n times and its state is to be ignored).
//
//go:noescape
func blocks8(s *[4][8]uint32, p *[8]*byte, stride *[8]uint64, n int)

// haveKernel: blocks8 needs AVX-512F and AVX-512VL (its rotate and
// three-input logic on 256-bit registers, and registers Y16-Y31).
var haveKernel = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL
