package nbd

import (
	"sync"
	"sync/atomic"
)

// The server-wide budget (Server.MaxInFlightBytesTotal) bounds the payload
// bytes in flight across all connections, as each connection's budget
// (pool.go) bounds its own: without it n connections could hold n times
// MaxInFlightBytes, and a host with a hundred VMs attached, or one client
// opening many connections, could push the node out of memory.
//
// What is charged: a request's payload length, from the moment the reader
// admits it (before it reads a write's payload off the socket, or a read
// is run) until its reply has been written (answer) or it failed on the
// way (the reader's error paths): write payloads read and not yet written
// to the device, read buffers not yet sent. Requests without payload
// (FLUSH, TRIM, WRITE_ZEROES, BLOCK_STATUS, a read refused as too big, a
// write refused so, whose payload is discarded as it arrives) are not
// charged. Spliced reads and writes (splice.go, splicewrite.go) are
// charged like copied ones, their whole length: their bytes sit in a
// pipe (pages of the page cache or of the socket's receive queue, held
// by the pipe: memory all the same, if not the Go heap's), plus a buffer
// for what the device does not take, and a device may refuse to splice
// at any time, when the bytes are copied after all. Charging them alike
// keeps the bound independent of which path a request takes.
//
// A request is charged to its connection's budget first, then to the
// server's; its charge is given back to the server first, then to the
// connection. The reader waits for room in the connection's budget, with
// nothing of the server's held (it waits only for its own connection's
// requests), then in the server's, holding only its own connection's.
// Waiting is back-pressure: the reader reads nothing more from the
// client meanwhile.
//
// Why it cannot deadlock: whatever holds budget is a request admitted in
// full, which ends — and gives its charge back — without taking any more
// budget: it needs the device, and its client to read its reply, never
// the reader or another request's budget. Only readers wait, one per
// connection, each holding no server budget. A request bigger than the
// whole server budget is charged the whole budget (its charge clamped to
// it): it waits until nothing else is charged, then runs alone.
//
// What it does not do: a client that sends a payload slowly, or reads
// its replies slowly (or not at all), holds its requests' charge as long
// as that takes, as it held their memory before; connections behind it
// then wait. The bound turns a node running out of memory into clients
// waiting; it bounds no client's share. (A client whose host is gone, or
// that reads nothing, is cut off by the kernel after Server.UserTimeout
// once its replies wait unacknowledged, releasing what it held.)
//
// Fairness: readers that must wait are queued first come, first served,
// and while any waits nobody takes budget without queueing, so a busy
// connection cannot starve the others: with n connections waiting, each
// is admitted before any is admitted twice. (The head of the queue
// waits for room for its request even when a smaller one behind it would
// fit: a stream of small requests must not starve a big one.)
//
// A reader waiting for the server's budget gives up when its connection
// is shut down (Server.Close, a Shutdown whose context ended, a revoked
// export): the budget it waits for may be held by requests stuck in a
// device. On Shutdown proper it goes on waiting: its request was read
// before Shutdown began, and the budget frees up as every connection
// drains.
//
// The hot path — room to spare, nobody waiting — is a compare-and-swap on
// one word to take budget and an atomic add to give it back.

// defaultMaxInFlightBytesTotal is Server.MaxInFlightBytesTotal's default:
// 256 MiB. Why not more: payload in flight is live Go heap, and a node's
// heap is held under a soft limit of a quarter of its RAM (internal/cli,
// gc.go), so a 1 GiB default would pin a 4 GiB node's heap at that limit
// (the collector then running without pause) before anything else was
// counted — and the pooled buffers holding the payload are rounded up to
// a power of two, so the memory behind a charge can reach twice it. Why
// it is enough: it is four connections' full budgets, and well above the
// bandwidth-delay product a node needs — it keeps a 3 GB/s stream going
// with 80 ms per request in the device; bytes queued beyond that add
// latency, not throughput.
const defaultMaxInFlightBytesTotal = 256 << 20

// maxServerBudget bounds the budget's size so that a charge plus the
// queued flag fits the state word.
const maxServerBudget = 1 << 60

// serverBudget is a weighted semaphore of bytes, FIFO for those that wait.
type serverBudget struct {
	size int64
	// state is the bytes charged, plus sbQueued while anyone waits: then
	// no charge fits, so tryAcquire fails and queues behind the waiters.
	// Only the holder of mu adds to it while sbQueued is set; anyone may
	// subtract (release).
	state atomic.Int64

	mu         sync.Mutex
	head, tail *sbWaiter
}

const sbQueued = 1 << 62

// sbWaiter is a reader queued for budget.
type sbWaiter struct {
	n       int64
	ready   chan struct{} // closed once granted
	granted bool          // under mu
	next    *sbWaiter
}

func newServerBudget(size int64) *serverBudget {
	return &serverBudget{size: min(max(size, 1), maxServerBudget)}
}

// charge is what a request of n payload bytes is charged: n, or the whole
// budget if that is less.
func (s *serverBudget) charge(n int64) int64 { return min(n, s.size) }

// tryAcquire charges n bytes if they fit and nobody waits; false if the
// caller must wait.
func (s *serverBudget) tryAcquire(n int64) bool {
	n = s.charge(n)
	for {
		v := s.state.Load()
		if v+n > s.size { // also when sbQueued is set
			return false
		}
		if s.state.CompareAndSwap(v, v+n) {
			return true
		}
	}
}

// acquire charges n bytes, waiting its turn for room. It returns false,
// having charged nothing, if cancel is closed first.
func (s *serverBudget) acquire(n int64, cancel <-chan struct{}) bool {
	if s.tryAcquire(n) {
		return true
	}
	w := &sbWaiter{n: s.charge(n), ready: make(chan struct{})}
	s.mu.Lock()
	if s.tail == nil {
		s.head = w
	} else {
		s.tail.next = w
	}
	s.tail = w
	s.state.Or(sbQueued)
	s.grantLocked() // room may have come since tryAcquire
	s.mu.Unlock()
	select {
	case <-w.ready:
		return true
	case <-cancel:
	}
	s.mu.Lock()
	if w.granted { // granted as cancel came: give it back
		s.mu.Unlock()
		s.release(n)
		return false
	}
	s.removeLocked(w)
	s.mu.Unlock()
	return false
}

// release gives back a charge for n payload bytes.
func (s *serverBudget) release(n int64) {
	if s.state.Add(-s.charge(n))&sbQueued != 0 {
		s.mu.Lock()
		s.grantLocked()
		s.mu.Unlock()
	}
}

// grantLocked admits the waiters at the head of the queue, in order, as
// far as they fit, and clears sbQueued once none is left. The caller
// holds mu.
func (s *serverBudget) grantLocked() {
	for w := s.head; w != nil; w = s.head {
		for {
			v := s.state.Load()
			if v&^sbQueued+w.n > s.size {
				return
			}
			if s.state.CompareAndSwap(v, v+w.n) {
				break
			}
		}
		s.head = w.next
		if s.head == nil {
			s.tail = nil
		}
		w.next = nil
		w.granted = true
		close(w.ready)
	}
	s.state.And(^sbQueued)
}

// removeLocked takes a waiter that gave up out of the queue; those behind
// it may fit now. The caller holds mu.
func (s *serverBudget) removeLocked(w *sbWaiter) {
	var prev *sbWaiter
	for q := s.head; q != w; q = q.next {
		prev = q
	}
	if prev == nil {
		s.head = w.next
	} else {
		prev.next = w.next
	}
	if s.tail == w {
		s.tail = prev
	}
	w.next = nil
	s.grantLocked()
}

// inFlight returns the bytes charged.
func (s *serverBudget) inFlight() int64 { return s.state.Load() &^ sbQueued }

// waiters returns how many wait (tests).
func (s *serverBudget) waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for w := s.head; w != nil; w = w.next {
		n++
	}
	return n
}
