package nbd

import (
	"context"
	"log/slog"
	"net"
	"sync/atomic"
	"time"
)

// The handshake bound (Server.MaxHandshakes) caps the connections in the
// handshake at once, server-wide. Nobody authenticates before the export
// name (the attachment's secret), so without it anyone who reaches the
// port could open tens of thousands of connections, each holding a
// goroutine and its handshake buffers (about 11 KiB of heap) for
// HandshakeTimeout, and guess export names on all of them in parallel.
// With it, idle handshakes cost at most MaxHandshakes times that, and
// guesses run on at most MaxHandshakes connections at once.
//
// A connection holds its slot from its accept until its handshake ends:
// an export chosen (transmission does not count: those connections are
// authenticated, and bounded by the attachments), or the handshake
// failed, timed out, was aborted, its TLS handshake failed, or the server
// stopped. conn.run gives the slot back as handshake returns, whichever
// way, exactly once (conn.hsSlot).
//
// A connection that finds every slot taken waits for one for a short
// while (handshakeSlotWait), then is closed before the greeting: the
// client sees the connection end and may retry. Why wait at all: a
// legitimate handshake takes milliseconds, so a burst of genuine clients
// a little over the bound (a host's VMs reconnecting after a restart)
// gets through without a visible refusal. Why only briefly, and why
// close rather than queue: slots an attacker holds stay taken for
// HandshakeTimeout, so a long wait would only pile up more sockets
// and goroutines; and the wait happens beside the accept loop, never in
// it, so the loop keeps draining the listen queue (a client queued there
// behind thousands of refused ones would otherwise wait minutes). The
// waiters are bounded too (as many as there are slots): beyond that a
// connection is closed at once, so a flood costs at most about twice the
// bound in sockets, and the waiters hold no buffers.
//
// What it does not do: it bounds memory and parallel guessing, not who
// gets the slots. A client that keeps MaxHandshakes connections idle
// keeps new clients out until HandshakeTimeout ends its connections (and
// then competes for the freed slots with every other client, first come,
// first served among those waiting).

// DefaultMaxHandshakes is Server.MaxHandshakes' default. 256 idle
// handshakes hold about 3 MiB of heap, nothing for a node; and genuine
// handshakes last milliseconds, so 256 at once would take thousands of
// connections a second — far beyond a node's clients, which connect once
// per attachment (a few per disk with multi-conn) and stay connected.
const DefaultMaxHandshakes = 256

// handshakeSlotWait is how long a connection waits for a slot before it
// is closed (see above).
const handshakeSlotWait = 250 * time.Millisecond

// refusalLogEvery spaces the log lines about refused connections: a flood
// must not flood the log too. The first refusal after a quiet spell is
// logged at once.
const refusalLogEvery = time.Minute

// handshakeGate is the counting semaphore behind the bound.
type handshakeGate struct {
	// slots holds a token per connection in the handshake (nil: no
	// bound). A send takes a slot; blocked senders are served in order
	// as slots are given back.
	slots chan struct{}
	// inUse counts the slots taken (also without a bound, for Handshakes).
	inUse atomic.Int64
	// refused counts connections closed for want of a slot.
	refused atomic.Uint64
	// nextLog (unix nanoseconds) is when the next refusal may be logged;
	// logged is refused's value at the last line.
	nextLog atomic.Int64
	logged  atomic.Uint64
}

func newHandshakeGate(max int) *handshakeGate {
	g := &handshakeGate{}
	if max > 0 {
		g.slots = make(chan struct{}, max)
	}
	return g
}

// tryAcquire takes a slot if one is free.
func (g *handshakeGate) tryAcquire() bool {
	if g.slots != nil {
		select {
		case g.slots <- struct{}{}:
		default:
			return false
		}
	}
	g.inUse.Add(1)
	return true
}

// acquire waits up to d for a slot; false if none came, or stop was
// closed first.
func (g *handshakeGate) acquire(d time.Duration, stop <-chan struct{}) bool {
	if g.tryAcquire() {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		g.inUse.Add(1)
		return true
	case <-t.C:
	case <-stop:
	}
	return false
}

// release gives a slot back.
func (g *handshakeGate) release() {
	g.inUse.Add(-1)
	if g.slots != nil {
		<-g.slots
	}
}

// startHandshake starts a connection the accept loop found no free slot
// for: it waits for one beside the loop, or is refused.
func (s *Server) startHandshake(nc net.Conn) {
	if !s.addWaiter() {
		s.refuse(nc)
		return
	}
	go func() {
		defer s.doneWaiting()
		if s.hs.acquire(s.slotWait(), s.stopping) {
			s.start(nc)
			return
		}
		s.refuse(nc)
	}()
}

// addWaiter counts a connection in as waiting for a slot; false if as
// many wait as there are slots, or the server is stopping. Counted under
// mu, as connections are tracked: Close and Shutdown, which set closed
// under it and then wait for the waiters, see every one started.
func (s *Server) addWaiter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.hsWaiting >= cap(s.hs.slots) {
		return false
	}
	s.hsWaiting++
	s.waiters.Add(1)
	return true
}

func (s *Server) doneWaiting() {
	s.mu.Lock()
	s.hsWaiting--
	s.mu.Unlock()
	s.waiters.Done()
}

// slotWait is how long a connection waits for a slot: handshakeSlotWait,
// but never longer than the handshake itself may take.
func (s *Server) slotWait() time.Duration {
	if s.hsSlotWait > 0 {
		return s.hsSlotWait
	}
	return min(handshakeSlotWait, s.HandshakeTimeout)
}

// refuse closes a connection no slot was found for, before the greeting,
// counts it and logs it: at Debug each, at Warn once per refusalLogEvery.
func (s *Server) refuse(nc net.Conn) {
	g := s.hs
	n := g.refused.Add(1) // before the close: a client that sees it sees the count
	nc.Close()
	if s.Log.Enabled(context.Background(), slog.LevelDebug) {
		s.Log.Debug("nbd connection refused: too many connections in the handshake", "remote", nc.RemoteAddr().String())
	}
	now := time.Now().UnixNano()
	next := g.nextLog.Load()
	if now < next || !g.nextLog.CompareAndSwap(next, now+int64(refusalLogEvery)) {
		return
	}
	since := n - g.logged.Swap(n)
	s.Log.Warn("nbd: too many connections in the handshake; refusing new ones",
		"max_handshakes", cap(g.slots), "refused", since, "refused_total", n,
		"next_report_in", refusalLogEvery)
}

// Handshakes returns the number of connections in the handshake (holding
// a slot of MaxHandshakes).
func (s *Server) Handshakes() int {
	s.mu.Lock()
	g := s.hs
	s.mu.Unlock()
	if g == nil {
		return 0
	}
	return int(g.inUse.Load())
}

// HandshakesRefused returns the number of connections closed before the
// greeting because MaxHandshakes connections were in the handshake.
func (s *Server) HandshakesRefused() uint64 {
	s.mu.Lock()
	g := s.hs
	s.mu.Unlock()
	if g == nil {
		return 0
	}
	return g.refused.Load()
}

// releaseHandshake gives the connection's slot back, if it holds one:
// called as its handshake ends, whichever way, and as it ends in any
// case; the swap makes sure the slot is given back once.
func (c *conn) releaseHandshake() {
	if c.hsSlot.Swap(false) {
		c.srv.hs.release()
	}
}
