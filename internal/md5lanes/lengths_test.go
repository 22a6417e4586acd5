package md5lanes

import (
	"bytes"
	"crypto/md5"
	"math/rand/v2"
	"testing"
)

// TestEveryLength: every length up to a little over 32 blocks, added at
// once and from every start offset within a word (unaligned buffers),
// digests as crypto/md5. One stream at a time: the lone lane's path.
func TestEveryLength(t *testing.T) {
	r := rand.New(rand.NewPCG(20, 21))
	base := random(r, 2100+8)
	for n := 0; n <= 2100; n++ {
		off := n % 8
		p := base[off : off+n]
		want := md5.Sum(p)
		s := NewStream()
		s.Add(p)
		if got := s.Sum(nil); !bytes.Equal(got, want[:]) {
			t.Fatalf("%d bytes at offset %d: %x, want %x", n, off, got, want)
		}
	}
}

// TestEverySplit: a stream written in two pieces, cut at every point, and
// in three, cut around every block boundary, digests as crypto/md5: the
// partial block carried from one Add to the next, in every position.
func TestEverySplit(t *testing.T) {
	r := rand.New(rand.NewPCG(22, 23))
	for _, n := range []int{0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 121, 127, 128, 129, 191, 192, 193, 300} {
		p := random(r, n)
		want := md5.Sum(p)
		for i := 0; i <= n; i++ {
			s := NewStream()
			s.Add(p[:i])
			s.Add(p[i:])
			if got := s.Sum(nil); !bytes.Equal(got, want[:]) {
				t.Fatalf("%d bytes cut at %d: %x, want %x", n, i, got, want)
			}
		}
	}
	p := random(r, 5*blockSize+9)
	want := md5.Sum(p)
	for b := blockSize; b < len(p); b += blockSize {
		for i := b - 2; i <= b+2; i++ {
			for j := i; j <= min(len(p), i+2*blockSize+1); j++ {
				s := NewStream()
				s.Add(p[:i])
				s.Add(p[i:j])
				s.Add(p[j:])
				if got := s.Sum(nil); !bytes.Equal(got, want[:]) {
					t.Fatalf("%d bytes cut at %d and %d: %x, want %x", len(p), i, j, got, want)
				}
			}
		}
	}
}

// TestLanesOfEveryLength: streams queued together, so that the hasher
// puts them side by side in the kernel's lanes — fewer than eight, eight,
// more than eight — each of another length and buffer alignment, and
// written in pieces that end at different points, digest as crypto/md5.
// Lanes whose jobs end in different rounds exercise the hasher's slicing
// of a round to its shortest lane and the idle lanes.
func TestLanesOfEveryLength(t *testing.T) {
	r := rand.New(rand.NewPCG(24, 25))
	base := random(r, 1<<16)
	for _, lanes := range []int{2, 3, 7, 8, 9, 16, 17} {
		for n := 0; n <= 2100; n += 1 + r.IntN(23) {
			ss := make([]*Stream, lanes)
			ps := make([][]byte, lanes)
			for i := range ss {
				ss[i] = NewStream()
				l := n + i*61 + r.IntN(3)*blockSize*7
				off := r.IntN(64)
				ps[i] = base[off : off+l]
			}
			// Interleave the streams' Adds, in pieces of one to several
			// blocks, so that jobs of all of them are queued at once.
			rest := append([][]byte(nil), ps...)
			for more := true; more; {
				more = false
				for i, s := range ss {
					if len(rest[i]) == 0 {
						continue
					}
					k := min(len(rest[i]), 1+r.IntN(5*blockSize))
					s.Add(rest[i][:k])
					rest[i] = rest[i][k:]
					more = more || len(rest[i]) > 0
				}
			}
			for i, s := range ss {
				want := md5.Sum(ps[i])
				if got := s.Sum(nil); !bytes.Equal(got, want[:]) {
					t.Fatalf("%d lanes, lane %d of %d bytes: %x, want %x", lanes, i, len(ps[i]), got, want)
				}
			}
		}
	}
}

// FuzzLanes: several streams, their bytes cut from one input at points
// the fuzzer chooses and added in interleaved pieces (so that they share
// the kernel's lanes), each digest as crypto/md5 does.
func FuzzLanes(f *testing.F) {
	f.Add(bytes.Repeat([]byte{7, 3}, 700), []byte{9, 200, 3, 64, 1}, uint8(5))
	f.Add([]byte{}, []byte{}, uint8(1))
	f.Add(bytes.Repeat([]byte{0xff}, 8*blockSize+3), []byte{4, 4, 4, 4, 4, 4, 4, 4, 4}, uint8(9))
	f.Fuzz(func(t *testing.T, p, cuts []byte, lanes uint8) {
		n := 1 + int(lanes)%12
		if len(p) > 16<<10 {
			p = p[:16<<10] // longer adds nothing but time per input
		}
		// Stream i hashes p[i*len(p)/n:], a suffix, so that all are of
		// different lengths and starting alignments.
		ss := make([]*Stream, n)
		rest := make([][]byte, n)
		for i := range ss {
			ss[i] = NewStream()
			rest[i] = p[i*len(p)/n:]
		}
		all := append([][]byte(nil), rest...)
		for c := 0; ; c++ {
			more := false
			for i, s := range ss {
				k := len(rest[i])
				if len(cuts) > 0 {
					k = min(k, int(cuts[(c+i)%len(cuts)])*8)
				}
				s.Add(rest[i][:k])
				rest[i] = rest[i][k:]
				more = more || len(rest[i]) > 0
			}
			if !more {
				break
			}
			if len(cuts) > 0 && c >= len(cuts)*4 {
				// Zero cuts would never end: add the rest at once.
				for i, s := range ss {
					s.Add(rest[i])
					rest[i] = nil
				}
			}
		}
		for i, s := range ss {
			if want := md5.Sum(all[i]); !bytes.Equal(s.Sum(nil), want[:]) {
				t.Fatalf("stream %d of %d (%d bytes): digest %x, want %x", i, n, len(all[i]), s.Sum(nil), want)
			}
		}
	})
}
