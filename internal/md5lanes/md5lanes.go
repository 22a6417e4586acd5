// Package md5lanes computes the MD5 digests of many streams at once, in
// the background: the S3 gateway's ETags, one per object being uploaded.
//
// MD5 cannot be sped up within one stream — every step waits for the one
// before it — so one core hashes a single stream at under 1 GB/s, and on
// the S3 PUT path it was the largest cost there is (bench/RESULTS.md: a
// third of the gateway's CPU under concurrent 1 MiB PUTs). What one core
// can do is run the steps of eight independent streams side by side in
// vector registers, at about the cost of one (blocks_amd64.s).
//
// So a Stream does not hash what it is given: Add queues the buffer and
// returns, and one goroutine (the hasher) hashes the queued buffers of up
// to eight streams per round, each stream in its own lane, while the
// streams' owners go on receiving. An upload's MD5 then costs it neither
// the CPU of a whole stream nor the wait: by the time the last byte has
// arrived most of it is hashed. A round with one stream alone is hashed
// by crypto/md5's single-stream code instead: one lane of eight is slower
// than that (0.59 against 0.8 GB/s on a Zen 4 core with the AVX-512
// kernel).
//
// Invariants:
//   - A stream's buffers are hashed in the order they were added, and a
//     stream is in at most one lane, or in the ready queue, at a time.
//   - The hasher reads a buffer until it is hashed and no longer; Wait
//     tells the owner when it may reuse one. Buffers are counted by the
//     jobs that read them (Mark), not by calls to Add: an Add of less
//     than a block queues no job (its bytes are copied), so counting
//     Adds would release an older buffer still unread.
//   - A Stream's state s is touched by the hasher while the stream has
//     jobs, by its owner only once they are all done (Sum).
//
// There are two kernels (gen.go): one for AVX-512VL, and one for CPUs
// with AVX2 only, which spells out in two or three instructions each
// rotate and boolean function AVX-512 does in one. Where the CPU has
// neither, a Stream hashes in Add with crypto/md5; digests are the same
// every way.
package md5lanes

import (
	"crypto/md5"
	"encoding"
	"encoding/binary"
	"hash"
	"runtime"
	"sync"
	"unsafe"
)

// blockSize is MD5's.
const blockSize = md5.BlockSize

// sliceBlocks: a round hashes at most this many blocks per lane, so that
// a stream arriving meanwhile waits at most that long for a free lane.
const sliceBlocks = 256

// loneBlocks: the same for a round with one lane, hashed by crypto/md5
// (scalar): 64 KiB, about 80 µs; each round's fixed costs would take a
// sixth of a lone stream's time at 256.
const loneBlocks = 1024

var initState = [4]uint32{0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476}

// Stream is one MD5 digest computed in the background. Its methods are
// for one goroutine, the owner.
type Stream struct {
	s     [4]uint32
	tail  [blockSize]byte // the bytes after the last full block added
	ntail int
	len   uint64
	std   hash.Hash // crypto/md5 where there is no kernel (nil otherwise)

	sig chan struct{} // a job of this stream was hashed

	added uint64 // jobs queued that read an owner's buffer (owner only)

	// Under hs.mu:
	jobs   []job  // not hashed yet, oldest first
	read   uint64 // jobs done that read an owner's buffer
	queued bool   // in hs.ready or in a lane
}

// Mark stands for the buffers added to a stream up to some point.
type Mark uint64

// job is a run of full blocks waiting for the hasher.
type job struct {
	data  []byte
	owned bool // data is the stream's own copy, not an owner's buffer
}

// NewStream returns an empty stream.
func NewStream() *Stream {
	if !haveKernel {
		return &Stream{std: md5.New()}
	}
	hs.start.Do(func() { go hs.run() })
	return &Stream{s: initState, sig: make(chan struct{}, 1)}
}

// Add hashes p after everything added before it. It may return before p
// is read: p must not change until Wait says so (or Sum returns).
func (s *Stream) Add(p []byte) {
	if s.std != nil {
		s.std.Write(p)
		return
	}
	s.len += uint64(len(p))
	var jobs [2]job
	k := 0
	if s.ntail > 0 {
		c := copy(s.tail[s.ntail:], p)
		s.ntail += c
		p = p[c:]
		if s.ntail < blockSize {
			return
		}
		jobs[k] = job{data: append([]byte(nil), s.tail[:]...), owned: true}
		k++
		s.ntail = 0
	}
	full := len(p) &^ (blockSize - 1)
	if full > 0 {
		jobs[k] = job{data: p[:full]}
		k++
		s.added++
	}
	s.ntail = copy(s.tail[:], p[full:])
	if k > 0 {
		hs.add(s, jobs[:k])
	}
}

// Mark returns a mark for every buffer added so far.
func (s *Stream) Mark() Mark { return Mark(s.added) }

// Wait returns once the buffers added before Mark returned m are read:
// the owner may change them.
func (s *Stream) Wait(m Mark) {
	s.waitFor(func() bool { return s.read >= uint64(m) })
}

// waitFor returns once done, called under hs.mu, holds.
func (s *Stream) waitFor(done func() bool) {
	if s.std != nil {
		return
	}
	for {
		hs.mu.Lock()
		ok := done()
		hs.mu.Unlock()
		if ok {
			return
		}
		<-s.sig
	}
}

// Sum appends the digest of everything added, once it is hashed.
func (s *Stream) Sum(b []byte) []byte {
	if s.std != nil {
		return s.std.Sum(b)
	}
	s.waitFor(func() bool { return len(s.jobs) == 0 })
	st := s.s
	// Padding: 0x80, zeros up to 56 bytes into a block, the bit length.
	var pad [2 * blockSize]byte
	n := copy(pad[:], s.tail[:s.ntail])
	pad[n] = 0x80
	end := blockSize
	if n >= blockSize-8 {
		end = 2 * blockSize
	}
	binary.LittleEndian.PutUint64(pad[end-8:], s.len<<3)
	for off := 0; off < end; off += blockSize {
		block(&st, pad[off:off+blockSize])
	}
	for _, v := range st {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

// hasher runs the kernel over the ready streams, eight lanes a round.
type hasher struct {
	start sync.Once
	wake  chan struct{} // something was queued
	mu    sync.Mutex
	ready []*Stream // streams with jobs and no lane, oldest first
}

var hs = hasher{wake: make(chan struct{}, 1)}

func (h *hasher) add(s *Stream, jobs []job) {
	h.mu.Lock()
	s.jobs = append(s.jobs, jobs...)
	if !s.queued {
		s.queued = true
		h.ready = append(h.ready, s)
	}
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// idle is what a lane without a stream reads (stride 0).
var idle [blockSize]byte

func (h *hasher) run() {
	var (
		lane   [8]*Stream
		state  [4][8]uint32
		ptr    [8]*byte
		stride [8]uint64
	)
	for {
		h.mu.Lock()
		active := 0
		for i := range lane {
			if lane[i] == nil && len(h.ready) > 0 {
				lane[i] = h.ready[0]
				h.ready[0] = nil
				h.ready = h.ready[1:]
			}
			if lane[i] != nil {
				active++
			}
		}
		if len(h.ready) == 0 {
			h.ready = h.ready[:0:0] // let the emptied array go
		}
		n := sliceBlocks
		if active == 1 {
			n = loneBlocks
		}
		for i, s := range lane {
			if s == nil {
				ptr[i], stride[i] = &idle[0], 0
				continue
			}
			d := s.jobs[0].data
			n = min(n, len(d)/blockSize)
			ptr[i], stride[i] = &d[0], blockSize
		}
		h.mu.Unlock()
		if active == 0 {
			<-h.wake
			continue
		}
		for i, s := range lane {
			if s != nil {
				for w := range 4 {
					state[w][i] = s.s[w]
				}
			}
		}
		if active == 1 && lone.ok {
			// One lane alone: crypto/md5's assembly is faster than a
			// lane of the kernel (0.8 against 0.59 GB/s here).
			for i, s := range lane {
				if s != nil {
					st := [4]uint32{state[0][i], state[1][i], state[2][i], state[3][i]}
					lone.blocks(&st, unsafe.Slice(ptr[i], n*blockSize))
					state[0][i], state[1][i], state[2][i], state[3][i] = st[0], st[1], st[2], st[3]
				}
			}
		} else {
			blocks8(&state, &ptr, &stride, n)
		}
		h.mu.Lock()
		for i, s := range lane {
			if s == nil {
				continue
			}
			for w := range 4 {
				s.s[w] = state[w][i]
			}
			j := &s.jobs[0]
			if j.data = j.data[n*blockSize:]; len(j.data) > 0 {
				continue
			}
			if !j.owned {
				s.read++
			}
			select {
			case s.sig <- struct{}{}:
			default:
			}
			s.jobs[0] = job{}
			if s.jobs = s.jobs[1:]; len(s.jobs) == 0 {
				s.jobs = nil
				s.queued = false
				lane[i] = nil
			}
		}
		h.mu.Unlock()
		if active < len(lane) {
			// Let the streams' owners run before the next round, so
			// that what they add joins it instead of waiting for the
			// round after.
			runtime.Gosched()
		}
	}
}

// scalar runs crypto/md5 on whole blocks from a given state. The
// standard library has no block function, but its digest's binary state
// holds the four state words, the partial block and the length: set
// from ours, it hashes full blocks exactly as block does. The hasher's
// one instance (lone) is checked at start against block; if the state's
// format ever changes, ok is false and lone lanes use the kernel.
type scalar struct {
	h   hash.Hash
	buf []byte
	ok  bool
}

var lone = newScalar()

// md5State: crypto/md5's binary state format, version 1.
const md5State = "md5\x01"

func newScalar() *scalar {
	c := &scalar{h: md5.New()}
	var want, got [4]uint32 = initState, initState
	var p [2 * blockSize]byte
	for i := range p {
		p[i] = byte(i*131 + 7)
	}
	block(&want, p[:blockSize])
	block(&want, p[blockSize:])
	c.ok = c.blocks(&got, p[:]) && got == want
	return c
}

// blocks hashes p, whole blocks, into st; false if crypto/md5 did not
// take the state (st is then unchanged).
func (c *scalar) blocks(st *[4]uint32, p []byte) bool {
	b := append(c.buf[:0], md5State...)
	for _, v := range st {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	b = append(b, make([]byte, blockSize+8)...) // no partial block; length 0
	if err := c.h.(encoding.BinaryUnmarshaler).UnmarshalBinary(b); err != nil {
		return false
	}
	c.h.Write(p)
	b, err := c.h.(encoding.BinaryAppender).AppendBinary(b[:0])
	c.buf = b
	if err != nil || len(b) < len(md5State)+16 || string(b[:len(md5State)]) != md5State {
		return false
	}
	for i := range st {
		st[i] = binary.BigEndian.Uint32(b[len(md5State)+4*i:])
	}
	return true
}
