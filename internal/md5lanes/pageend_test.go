//go:build linux

package md5lanes

import (
	"bytes"
	"crypto/md5"
	"math/rand/v2"
	"syscall"
	"testing"
)

// guarded returns a buffer of size bytes between two inaccessible pages:
// reading one byte before its start or past its end faults.
func guarded(t *testing.T, size int) []byte {
	t.Helper()
	page := syscall.Getpagesize()
	data := (size + page - 1) / page * page
	m, err := syscall.Mmap(-1, 0, data+2*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	t.Cleanup(func() { syscall.Munmap(m) })
	if err := syscall.Mprotect(m[:page], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mprotect(m[page+data:], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	// The data ends at the second guard page; short ones start after the
	// first guard page's end only when size is a whole number of pages.
	return m[page+data-size : page+data : page+data]
}

// TestKernelPageEnd: each kernel reads n blocks of each lane and nothing
// past them: lanes whose blocks end right before an inaccessible page.
func TestKernelPageEnd(t *testing.T) {
	for name, blocks8 := range kernels() {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(30, 31))
			const most = 40
			bufs := make([][]byte, 8)
			for i := range bufs {
				bufs[i] = guarded(t, most*blockSize)
				copy(bufs[i], random(r, len(bufs[i])))
			}
			for n := 0; n <= most; n++ {
				var state [4][8]uint32
				var ptr [8]*byte
				var stride [8]uint64
				var want [8][4]uint32
				for i := range 8 {
					d := bufs[i][len(bufs[i])-n*blockSize:]
					for w := range 4 {
						want[i][w] = r.Uint32()
						state[w][i] = want[i][w]
					}
					for b := range n {
						block(&want[i], d[b*blockSize:])
					}
					if n == 0 {
						// A lane of no blocks: its pointer is the start of
						// the guard page, never to be read.
						d = bufs[i][len(bufs[i])-1:]
					}
					ptr[i], stride[i] = &d[0], blockSize
				}
				blocks8(&state, &ptr, &stride, n)
				for i := range 8 {
					for w := range 4 {
						if state[w][i] != want[i][w] {
							t.Fatalf("%d blocks: lane %d word %d is %#x, want %#x", n, i, w, state[w][i], want[i][w])
						}
					}
				}
			}
		})
	}
}

// TestStreamPageEnd: streams whose buffers end right before, or start
// right after, an inaccessible page, of every length up to a few blocks
// and some longer ones, added whole or in two pieces, several at once so
// that they share the kernel: nothing reads outside them, and the
// digests are crypto/md5's.
func TestStreamPageEnd(t *testing.T) {
	r := rand.New(rand.NewPCG(32, 33))
	page := syscall.Getpagesize()
	end := guarded(t, 4*page)   // the data ends at a guard page
	start := guarded(t, 4*page) // a whole number of pages: starts after one
	copy(end, random(r, len(end)))
	copy(start, random(r, len(start)))
	lengths := []int{page, page + 1, 2*page - 1, 4 * page}
	for n := 0; n <= 5*blockSize; n++ {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		ps := [][]byte{end[len(end)-n:], start[:n], end[len(end)-n:], start[:n]}
		ss := make([]*Stream, len(ps))
		for i, p := range ps {
			ss[i] = NewStream()
			if i < 2 {
				ss[i].Add(p)
				continue
			}
			cut := r.IntN(n + 1)
			ss[i].Add(p[:cut])
			ss[i].Add(p[cut:])
		}
		for i, s := range ss {
			want := md5.Sum(ps[i])
			if got := s.Sum(nil); !bytes.Equal(got, want[:]) {
				t.Fatalf("%d bytes, stream %d: %x, want %x", n, i, got, want)
			}
		}
	}
}
