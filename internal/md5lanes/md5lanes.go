// Package md5lanes computes the MD5 digests of many streams at once: the
// S3 gateway's ETags, one per object being uploaded.
//
// MD5 cannot be sped up within one stream — every step waits for the one
// before it — so one core hashes a single stream at well under 1 GB/s,
// and on the S3 PUT path it is the largest cost there is (bench/RESULTS.md:
// a third of the gateway's CPU under concurrent 1 MiB PUTs). What one
// core can do is run the steps of eight independent streams side by side
// in vector registers, at nearly the cost of one (blocks_amd64.s).
//
// So every Hasher hands its full 64-byte blocks to one batcher. Whoever
// finds the batcher free runs it — there is no hashing goroutine, no
// timer, no waiting for company: a stream hashed alone costs about what
// crypto/md5 costs it, and streams whose blocks arrive while another
// stream's are being hashed join the next round, up to eight at a time.
//
// Invariants:
//   - A Write returns only after every byte it was given is in the
//     Hasher's state or its partial-block buffer: the caller may reuse p.
//   - A job queued on the batcher is hashed by the goroutine that holds
//     the batcher (combine) or by one that takes it later: every goroutine
//     that queues a job, or that releases the batcher, tries to take the
//     batcher after doing so, and the holder hashes until the queue is
//     empty (see batcher.run).
//   - A Hasher's state is touched only by its own goroutine, or by the
//     batcher's holder while that goroutine waits for its job.
//
// Where the CPU lacks the kernel's instructions (AVX-512F and AVX-512VL),
// New returns crypto/md5's hash; digests are the same either way.
package md5lanes

import (
	"crypto/md5"
	"encoding/binary"
	"hash"
	"sync"
)

// Size and BlockSize are MD5's.
const (
	Size      = md5.Size
	BlockSize = md5.BlockSize
)

// minBatch: runs of full blocks shorter than this are hashed by the
// writer itself (block): queueing them would cost more than it saves.
const minBatch = 8 * BlockSize

// sliceBlocks: a round of the batcher hashes at most this many blocks per
// lane, so that a stream arriving meanwhile waits at most that long for a
// free lane.
const sliceBlocks = 256

var initState = [4]uint32{0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476}

// Hasher is an MD5 hash.Hash whose bulk goes through the batcher.
type Hasher struct {
	s    [4]uint32
	buf  [BlockSize]byte
	nbuf int
	len  uint64
	job  job
}

// New returns an MD5 hash; the Hasher where the CPU can run the kernel.
func New() hash.Hash {
	if !haveKernel {
		return md5.New()
	}
	h := &Hasher{}
	h.job = job{h: h, done: make(chan struct{}, 1)}
	h.Reset()
	return h
}

func (h *Hasher) Reset() {
	h.s, h.nbuf, h.len = initState, 0, 0
}

func (h *Hasher) Size() int      { return Size }
func (h *Hasher) BlockSize() int { return BlockSize }

func (h *Hasher) Write(p []byte) (int, error) {
	n := len(p)
	h.len += uint64(n)
	if h.nbuf > 0 {
		k := copy(h.buf[h.nbuf:], p)
		h.nbuf += k
		p = p[k:]
		if h.nbuf < BlockSize {
			return n, nil
		}
		block(&h.s, h.buf[:])
		h.nbuf = 0
	}
	if full := len(p) &^ (BlockSize - 1); full >= minBatch {
		h.job.data = p[:full]
		std.run(&h.job)
		p = p[full:]
	}
	for len(p) >= BlockSize {
		block(&h.s, p[:BlockSize])
		p = p[BlockSize:]
	}
	h.nbuf = copy(h.buf[:], p)
	return n, nil
}

// Sum appends the digest of what was written so far; the Hasher goes on.
func (h *Hasher) Sum(b []byte) []byte {
	s := h.s
	// Padding: 0x80, zeros up to 56 bytes into a block, the bit length.
	var tail [2 * BlockSize]byte
	n := copy(tail[:], h.buf[:h.nbuf])
	tail[n] = 0x80
	end := BlockSize
	if n >= BlockSize-8 {
		end = 2 * BlockSize
	}
	binary.LittleEndian.PutUint64(tail[end-8:], h.len<<3)
	for off := 0; off < end; off += BlockSize {
		block(&s, tail[off:off+BlockSize])
	}
	for _, v := range s {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

// job is a Hasher's run of full blocks waiting for the batcher.
type job struct {
	h    *Hasher
	data []byte        // blocks not hashed yet (a multiple of BlockSize)
	done chan struct{} // receives once data is hashed
}

// batcher hashes queued jobs eight lanes at a time.
type batcher struct {
	mu    sync.Mutex // held by the goroutine hashing (combine)
	qmu   sync.Mutex // guards queue
	queue []*job
}

var std batcher

// run queues j and returns once it is hashed, by this goroutine or
// another. Every goroutine that queues a job, or releases mu, tries mu
// afterwards, and the holder empties the queue before releasing it: so a
// queued job always has a goroutine that will hash it.
func (b *batcher) run(j *job) {
	b.qmu.Lock()
	b.queue = append(b.queue, j)
	b.qmu.Unlock()
	for b.mu.TryLock() {
		b.combine()
		b.mu.Unlock()
		if !b.pending() {
			break
		}
	}
	<-j.done
}

func (b *batcher) pending() bool {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	return len(b.queue) > 0
}

// idle is what a lane without a job reads (stride 0).
var idle [BlockSize]byte

// combine hashes until no job is running or queued: it fills free lanes
// from the queue, runs every lane for as many blocks as the shortest has
// (at most sliceBlocks), and signals each job it finishes.
func (b *batcher) combine() {
	var (
		lane   [8]*job
		state  [4][8]uint32
		ptr    [8]*byte
		stride [8]uint64
	)
	for {
		b.qmu.Lock()
		for i := range lane {
			if lane[i] == nil && len(b.queue) > 0 {
				lane[i] = b.queue[0]
				b.queue[0] = nil
				b.queue = b.queue[1:]
			}
		}
		if len(b.queue) == 0 {
			b.queue = b.queue[:0:0] // let the emptied array go
		}
		b.qmu.Unlock()
		n := sliceBlocks
		for i, j := range lane {
			if j == nil {
				ptr[i], stride[i] = &idle[0], 0
				continue
			}
			n = min(n, len(j.data)/BlockSize)
			ptr[i], stride[i] = &j.data[0], BlockSize
			for w := range 4 {
				state[w][i] = j.h.s[w]
			}
		}
		if stride == [8]uint64{} {
			return
		}
		blocks8(&state, &ptr, &stride, n)
		for i, j := range lane {
			if j == nil {
				continue
			}
			for w := range 4 {
				j.h.s[w] = state[w][i]
			}
			if j.data = j.data[n*BlockSize:]; len(j.data) == 0 {
				lane[i] = nil
				j.done <- struct{}{}
			}
		}
	}
}
