package md5lanes

import (
	"encoding/binary"
	"math"
	"math/bits"
)

// block hashes one 64-byte block into s, one step at a time (RFC 1321):
// partial blocks, padding, short runs, and the reference the kernel is
// tested against.
func block(s *[4]uint32, p []byte) {
	var m [16]uint32
	for i := range m {
		m[i] = binary.LittleEndian.Uint32(p[4*i:])
	}
	a, b, c, d := s[0], s[1], s[2], s[3]
	for i := range 64 {
		var f uint32
		var g int
		switch i / 16 {
		case 0:
			f, g = b&c|^b&d, i
		case 1:
			f, g = d&b|^d&c, (5*i+1)%16
		case 2:
			f, g = b^c^d, (3*i+5)%16
		default:
			f, g = c^(b|^d), (7*i)%16
		}
		f += a + sines[i] + m[g]
		a, d, c = d, c, b
		b += bits.RotateLeft32(f, int(shifts[i/16][i%4]))
	}
	s[0] += a
	s[1] += b
	s[2] += c
	s[3] += d
}

// shifts are each round's rotations, step by step.
var shifts = [4][4]uint8{{7, 12, 17, 22}, {5, 9, 14, 20}, {4, 11, 16, 23}, {6, 10, 15, 21}}

// sines[i] is floor(|sin(i+1)| * 2^32).
var sines = func() (k [64]uint32) {
	for i := range k {
		k[i] = uint32(math.Floor(math.Abs(math.Sin(float64(i+1))) * (1 << 32)))
	}
	return k
}()
