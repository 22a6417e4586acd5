package nbd

import (
	"math/bits"
	"sync"
)

// Payload buffers come from per-size-class pools (powers of two from 4 KiB
// to MaxPayload) so that steady I/O allocates nothing.
const (
	minClassShift = 12
	maxClassShift = 25 // MaxPayload
	numClasses    = maxClassShift - minClassShift + 1
)

var pools [numClasses]sync.Pool

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// getBuf returns a buffer of length n (n <= MaxPayload).
func getBuf(n int) []byte {
	c := classOf(n)
	if p, ok := pools[c].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return make([]byte, n, 1<<(c+minClassShift))
}

// putBuf returns a buffer obtained from getBuf.
func putBuf(b []byte) {
	if b == nil || cap(b) < 1<<minClassShift {
		return
	}
	c := classOf(cap(b))
	if c >= numClasses || cap(b) != 1<<(c+minClassShift) {
		return
	}
	b = b[:cap(b)]
	pools[c].Put(&b)
}

// budget bounds a connection's in-flight requests and payload bytes.
type budget struct {
	mu              sync.Mutex
	cond            sync.Cond
	count, maxCount int
	bytes, maxBytes int64
}

func newBudget(maxCount int, maxBytes int64) *budget {
	b := &budget{maxCount: maxCount, maxBytes: maxBytes}
	b.cond.L = &b.mu
	return b
}

// acquire waits for room for one request of n payload bytes. A request
// larger than the whole byte budget is admitted alone.
func (b *budget) acquire(n int64) {
	b.mu.Lock()
	for b.full(n) {
		b.cond.Wait()
	}
	b.count++
	b.bytes += n
	b.mu.Unlock()
}

// full reports whether one more request of n bytes must wait; the caller
// holds mu.
func (b *budget) full(n int64) bool {
	return b.count >= b.maxCount || (b.count > 0 && b.bytes+n > b.maxBytes)
}

// tryAcquire is acquire without waiting: false if it would have to.
func (b *budget) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.full(n) {
		return false
	}
	b.count++
	b.bytes += n
	return true
}

func (b *budget) release(n int64) {
	b.mu.Lock()
	b.count--
	b.bytes -= n
	b.mu.Unlock()
	b.cond.Broadcast()
}
