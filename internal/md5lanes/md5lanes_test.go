package md5lanes

import (
	"bytes"
	"crypto/md5"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

func random(r *rand.Rand, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

// addSplit adds p to s in pieces cut at random points, waiting at times
// for some or all of them to be hashed.
func addSplit(r *rand.Rand, s *Stream, p []byte) {
	for len(p) > 0 {
		k := min(len(p), 1+r.IntN(3*blockSize))
		if r.IntN(4) == 0 {
			k = min(len(p), 1+r.IntN(1<<20))
		}
		s.Add(p[:k])
		p = p[k:]
		if m, back := s.Mark(), Mark(r.IntN(3)); r.IntN(3) == 0 && m >= back {
			s.Wait(m - back) // all but (at most) the last few jobs
		}
	}
}

// TestKernel: each kernel this CPU can run, given eight lanes in any mix
// of active and idle, for 0 to 40 blocks, leaves each active lane's state
// where block leaves it.
func TestKernel(t *testing.T) {
	ks := kernels()
	if len(ks) == 0 {
		t.Skip("this CPU has no AVX2 or AVX-512: New is crypto/md5")
	}
	for name, blocks8 := range ks {
		t.Run(name, func(t *testing.T) { testKernel(t, blocks8) })
	}
}

func testKernel(t *testing.T, blocks8 func(s *[4][8]uint32, p *[8]*byte, stride *[8]uint64, n int)) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 500 {
		n := r.IntN(41)
		var state [4][8]uint32
		var ptr [8]*byte
		var stride [8]uint64
		var want [8][4]uint32
		data := make([][]byte, 8)
		for i := range 8 {
			for w := range 4 {
				want[i][w] = r.Uint32()
				state[w][i] = want[i][w]
			}
			if r.IntN(3) == 0 {
				ptr[i] = &idle[0]
				continue
			}
			data[i] = random(r, n*blockSize+1) // +1: a lane of 0 blocks has a pointer too
			ptr[i], stride[i] = &data[i][0], blockSize
			for b := range n {
				block(&want[i], data[i][b*blockSize:])
			}
		}
		blocks8(&state, &ptr, &stride, n)
		for i := range 8 {
			if stride[i] == 0 {
				continue
			}
			for w := range 4 {
				if state[w][i] != want[i][w] {
					t.Fatalf("round %d, %d blocks: lane %d word %d is %#x, want %#x", round, n, i, w, state[w][i], want[i][w])
				}
			}
		}
	}
}

// TestDigest: any length, added in any pieces, digests as crypto/md5;
// Sum does not disturb the stream.
func TestDigest(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	lengths := []int{0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 4095, 65536, 1<<20 + 7}
	for range 30 {
		lengths = append(lengths, r.IntN(3<<20))
	}
	for _, n := range lengths {
		p := random(r, n)
		want := md5.Sum(p)
		s := NewStream()
		half := n / 2
		addSplit(r, s, p[:half])
		mid := md5.Sum(p[:half])
		if got := s.Sum(nil); !bytes.Equal(got, mid[:]) {
			t.Fatalf("%d bytes: Sum of the first half %x, want %x", n, got, mid)
		}
		addSplit(r, s, p[half:])
		if got := s.Sum([]byte("x")); !bytes.Equal(got[1:], want[:]) || got[0] != 'x' {
			t.Fatalf("%d bytes: %x, want x%x", n, got, want)
		}
	}
}

// TestScalar: crypto/md5 set to a state hashes whole blocks as block
// does (the lone lane's path), from any state, for 0 to 40 blocks.
func TestScalar(t *testing.T) {
	if !lone.ok {
		t.Fatal("crypto/md5 did not take a state: a lone lane would run the kernel")
	}
	r := rand.New(rand.NewPCG(10, 11))
	for range 200 {
		st := [4]uint32{r.Uint32(), r.Uint32(), r.Uint32(), r.Uint32()}
		p := random(r, r.IntN(41)*blockSize)
		want := st
		for off := 0; off < len(p); off += blockSize {
			block(&want, p[off:off+blockSize])
		}
		if !lone.blocks(&st, p) || st != want {
			t.Fatalf("%d blocks: state %x, want %x", len(p)/blockSize, st, want)
		}
	}
}

// TestWaitReleasesBuffers: once Wait(m) returns, the buffers added
// before m was taken may be overwritten without changing the digest. Two
// buffers take turns, each filled by several Adds, some shorter than a
// block (such an Add queues no job: counting Adds instead of jobs let a
// buffer go while an older one was still being read).
func TestWaitReleasesBuffers(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	for range 100 {
		s := NewStream()
		bufs := [2][]byte{make([]byte, 64<<10), make([]byte, 64<<10)}
		var marks [2]Mark
		var all []byte
		for i := range 12 {
			b := bufs[i%2]
			s.Wait(marks[i%2]) // what was added from b two turns ago
			for filled := 0; filled < len(b) && r.IntN(4) > 0; {
				k := 1 + r.IntN(len(b)-filled)
				if r.IntN(2) == 0 {
					k = min(k, 1+r.IntN(blockSize))
				}
				piece := b[filled : filled+k]
				copy(piece, random(r, k))
				s.Add(piece)
				all = append(all, piece...)
				filled += k
			}
			marks[i%2] = s.Mark()
		}
		s.Wait(s.Mark())
		for i := range bufs {
			clear(bufs[i])
		}
		if want := md5.Sum(all); !bytes.Equal(s.Sum(nil), want[:]) {
			t.Fatalf("digest %x, want %x", s.Sum(nil), want)
		}
	}
}

// TestConcurrent: streams hashed at the same time, sharing the batcher's
// lanes, each get their own digest.
func TestConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 5))
			for range 6 {
				p := random(r, r.IntN(2<<20))
				s := NewStream()
				addSplit(r, s, p)
				if want := md5.Sum(p); !bytes.Equal(s.Sum(nil), want[:]) {
					errs <- fmt.Errorf("stream %d: %d bytes: digest %x, want %x", g, len(p), s.Sum(nil), want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// FuzzDigest: any bytes written in pieces of any sizes digest as
// crypto/md5 does.
func FuzzDigest(f *testing.F) {
	f.Add(bytes.Repeat([]byte{7}, 3000), []byte{1, 200, 3})
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, p, cuts []byte) {
		s := NewStream()
		rest := p
		for _, c := range cuts {
			k := min(len(rest), int(c)*16)
			s.Add(rest[:k])
			rest = rest[k:]
		}
		s.Add(rest)
		if want := md5.Sum(p); !bytes.Equal(s.Sum(nil), want[:]) {
			t.Fatalf("digest %x, want %x", s.Sum(nil), want)
		}
	})
}

// BenchmarkParallel hashes 1 MiB objects from 8 goroutines, in 64 KiB
// pieces as an upload arrives: md5lanes against crypto/md5.
func BenchmarkParallel(b *testing.B) {
	p := random(rand.New(rand.NewPCG(6, 7)), 1<<20)
	b.Run("crypto-md5", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		b.SetParallelism(4) // with -cpu 2: 8 goroutines
		b.RunParallel(func(pb *testing.PB) {
			h := md5.New()
			for pb.Next() {
				h.Reset()
				for off := 0; off < len(p); off += 64 << 10 {
					h.Write(p[off : off+64<<10])
				}
				h.Sum(nil)
			}
		})
	})
	b.Run("md5lanes", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s := NewStream()
				for off := 0; off < len(p); off += 64 << 10 {
					s.Add(p[off : off+64<<10])
				}
				s.Sum(nil)
			}
		})
	})
}

// BenchmarkSingle: one stream alone, as one large upload or export is.
func BenchmarkSingle(b *testing.B) {
	p := random(rand.New(rand.NewPCG(6, 7)), 1<<20)
	b.Run("crypto-md5", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		h := md5.New()
		for b.Loop() {
			h.Reset()
			h.Write(p)
			h.Sum(nil)
		}
	})
	b.Run("md5lanes", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			s := NewStream()
			for off := 0; off < len(p); off += 64 << 10 {
				s.Add(p[off : off+64<<10])
			}
			s.Sum(nil)
		}
	})
}

// BenchmarkKernel runs each kernel over eight full lanes of 64 KiB:
// bytes per second of all lanes together, on one core.
func BenchmarkKernel(b *testing.B) {
	const blocks = 1024
	data := random(rand.New(rand.NewPCG(8, 9)), 8*blocks*blockSize)
	for name, blocks8 := range kernels() {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			var state [4][8]uint32
			var ptr [8]*byte
			var stride [8]uint64
			for b.Loop() {
				for i := range 8 {
					ptr[i], stride[i] = &data[i*blocks*blockSize], blockSize
				}
				blocks8(&state, &ptr, &stride, blocks)
			}
		})
	}
}
