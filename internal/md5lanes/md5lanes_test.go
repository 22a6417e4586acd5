package md5lanes

import (
	"bytes"
	"crypto/md5"
	"fmt"
	"hash"
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

// writeSplit writes p to h in pieces cut at random points.
func writeSplit(r *rand.Rand, h hash.Hash, p []byte) {
	for len(p) > 0 {
		k := min(len(p), 1+r.IntN(3*minBatch))
		if r.IntN(4) == 0 {
			k = min(len(p), 1+r.IntN(1<<20))
		}
		h.Write(p[:k])
		p = p[k:]
	}
}

// TestKernel: eight lanes in any mix of active and idle, for 0 to 40
// blocks, leave each active lane's state where block leaves it.
func TestKernel(t *testing.T) {
	if !haveKernel {
		t.Skip("this CPU has no AVX-512F/VL: New is crypto/md5")
	}
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
			data[i] = random(r, n*BlockSize+1) // +1: a lane of 0 blocks has a pointer too
			ptr[i], stride[i] = &data[i][0], BlockSize
			for b := range n {
				block(&want[i], data[i][b*BlockSize:])
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

// TestDigest: any length, written in any pieces, digests as crypto/md5;
// Sum does not disturb the hash, and Reset starts over.
func TestDigest(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	lengths := []int{0, 1, 55, 56, 63, 64, 65, 119, 120, 128, minBatch - 1, minBatch, minBatch + 1, 4095, 65536, 1<<20 + 7}
	for range 30 {
		lengths = append(lengths, r.IntN(3<<20))
	}
	h := New()
	for _, n := range lengths {
		p := random(r, n)
		want := md5.Sum(p)
		h.Reset()
		half := n / 2
		writeSplit(r, h, p[:half])
		mid := md5.Sum(p[:half])
		if got := h.Sum(nil); !bytes.Equal(got, mid[:]) {
			t.Fatalf("%d bytes: Sum of the first half %x, want %x", n, got, mid)
		}
		writeSplit(r, h, p[half:])
		if got := h.Sum([]byte("x")); !bytes.Equal(got[1:], want[:]) || got[0] != 'x' {
			t.Fatalf("%d bytes: %x, want x%x", n, got, want)
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
			h := New()
			for range 6 {
				p := random(r, r.IntN(2<<20))
				h.Reset()
				writeSplit(r, h, p)
				if want := md5.Sum(p); !bytes.Equal(h.Sum(nil), want[:]) {
					errs <- fmt.Errorf("stream %d: %d bytes: digest %x, want %x", g, len(p), h.Sum(nil), want)
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
	f.Add(bytes.Repeat([]byte{7}, 3*minBatch+5), []byte{1, 200, 3})
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, p, cuts []byte) {
		h := New()
		rest := p
		for _, c := range cuts {
			k := min(len(rest), int(c)*16)
			h.Write(rest[:k])
			rest = rest[k:]
		}
		h.Write(rest)
		if want := md5.Sum(p); !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("digest %x, want %x", h.Sum(nil), want)
		}
	})
}

// BenchmarkParallel hashes 1 MiB objects from 8 goroutines, in 64 KiB
// writes as an upload arrives: md5lanes against crypto/md5.
func BenchmarkParallel(b *testing.B) {
	p := random(rand.New(rand.NewPCG(6, 7)), 1<<20)
	for _, impl := range []struct {
		name string
		new  func() hash.Hash
	}{{"crypto-md5", md5.New}, {"md5lanes", New}} {
		b.Run(impl.name, func(b *testing.B) {
			b.SetBytes(int64(len(p)))
			b.SetParallelism(4) // with -cpu 2: 8 goroutines
			b.RunParallel(func(pb *testing.PB) {
				h := impl.new()
				for pb.Next() {
					h.Reset()
					for off := 0; off < len(p); off += 64 << 10 {
						h.Write(p[off : off+64<<10])
					}
					h.Sum(nil)
				}
			})
		})
	}
}
