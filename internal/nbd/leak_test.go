package nbd

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Clients that vanish at every awkward point leave nothing behind: no
// connection, no goroutine.
func TestNoLeaksOnAbruptDisconnect(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	// The export is revocable (never revoked): each connection's watcher
	// goroutine must end with the connection.
	s, addr := serve(t, dev, func(s *Server) {
		s.HandshakeTimeout = 5 * time.Second
		s.Exports = mapExports{"disk": {Name: "disk", Device: dev, Revoked: make(chan struct{})}}
	})
	// Warm up (pools, the accept loop) and take the baseline.
	c, _ := open(t, addr, true, true)
	c.disc()
	c.expectClosed("DISC")
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Fatal("warm-up connection left")
	}
	base := runtime.NumGoroutine()

	scenarios := []struct {
		name string
		f    func(nc net.Conn)
	}{
		{"greeting only", func(nc net.Conn) {}},
		{"half the client flags", func(nc net.Conn) { nc.Write([]byte{0, 0}) }},
		{"half an option header", func(nc net.Conn) { nc.Write(append(encClientFlags(clientFixed), encOption(optGo, nil)[:9]...)) }},
		{"half an option payload", func(nc net.Conn) {
			nc.Write(append(encClientFlags(clientFixed), encOption(optGo, encInfoGo("disk", 1, 2, 3))[:22]...))
		}},
		{"half a request header", func(nc net.Conn) {
			goTransmission(nc)
			nc.Write(encRequest(0, cmdRead, 1, 0, 4096)[:14])
		}},
		{"WRITE of 1 MiB cut after 1000 bytes", func(nc net.Conn) {
			goTransmission(nc)
			nc.Write(encRequest(0, cmdWrite, 1, 0, 1<<20))
			nc.Write(make([]byte, 1000))
		}},
		{"oversized WRITE cut short", func(nc net.Conn) {
			goTransmission(nc)
			nc.Write(encRequest(0, cmdWrite, 1, 0, MaxPayload+4096))
			nc.Write(make([]byte, 70000))
		}},
		{"READs in flight, replies never read", func(nc net.Conn) {
			goTransmission(nc)
			var b []byte
			for i := range 32 {
				b = append(b, encRequest(0, cmdRead, uint64(i), 0, 65536)...)
			}
			nc.Write(b)
		}},
	}
	const conns = 200
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	var failures atomic.Int32
	for i := range conns {
		sc := scenarios[i%len(scenarios)]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			nc, err := net.DialTimeout("tcp", addr, ioTimeout)
			if err != nil {
				failures.Add(1)
				return
			}
			nc.SetDeadline(time.Now().Add(ioTimeout))
			hello := make([]byte, 18)
			if _, err := io.ReadFull(nc, hello); err != nil {
				failures.Add(1)
			}
			sc.f(nc)
			nc.Close()
		}()
	}
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d clients failed to connect", n)
	}
	ok := waitFor(10*time.Second, func() bool {
		return s.Connections() == 0 && runtime.NumGoroutine() <= base+3
	})
	if !ok {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("after %d abrupt clients: %d connections, %d goroutines (baseline %d)\n%s",
			conns, s.Connections(), runtime.NumGoroutine(), base, buf)
	}
	// The server still works.
	c, _ = open(t, addr, false, false)
	c.mustRead(0, 4096)
}

// goTransmission negotiates GO on "disk" with NO_ZEROES over nc, reading
// (and discarding) the replies.
func goTransmission(nc net.Conn) {
	nc.Write(append(encClientFlags(clientFixed|clientNoZeroes), encOption(optGo, encInfoGo("disk"))...))
	for {
		h := make([]byte, 20)
		if _, err := io.ReadFull(nc, h); err != nil {
			return
		}
		d := make([]byte, be.Uint32(h[16:]))
		if _, err := io.ReadFull(nc, d); err != nil {
			return
		}
		if be.Uint32(h[12:]) == repAck {
			return
		}
	}
}

// Payload memory per connection is bounded by MaxInFlightBytes: a client
// pipelining 256 KiB writes against a slow device never has more than the
// budget (plus, at most, one request admitted alone) held at once.
func TestInFlightBytesBounded(t *testing.T) {
	file, _ := sparseFile(t, 16<<20)
	const budget = 1 << 20
	const reqSize = 256 << 10
	var cur, peak, calls atomic.Int64
	dev := &hookDevice{Device: file, write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
		n := cur.Add(int64(len(p)))
		for {
			m := peak.Load()
			if n <= m || peak.CompareAndSwap(m, n) {
				break
			}
		}
		calls.Add(1)
		time.Sleep(15 * time.Millisecond)
		defer cur.Add(-int64(len(p)))
		return next(p, off, fua)
	}}
	s, addr := serve(t, dev, func(s *Server) { s.MaxInFlightBytes = budget })
	c, _ := open(t, addr, false, false)
	const n = 48
	sendErr := make(chan error, 1)
	go func() {
		p := pattern(reqSize, 9)
		for i := range n {
			if err := c.send(0, cmdWrite, uint64(i), uint64(i%64)*reqSize, reqSize, p); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()
	// Sample the server's own accounting too, while the writes run (from
	// the first reply on). A connection's budget is set before the server
	// tracks it, under s.mu.
	var budgetPeak atomic.Int64
	stop, start := make(chan struct{}), make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		<-start
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			s.mu.Lock()
			for cn := range s.conns {
				if b := cn.budget; b != nil {
					b.mu.Lock()
					if b.bytes > budgetPeak.Load() {
						budgetPeak.Store(b.bytes)
					}
					b.mu.Unlock()
				}
			}
			s.mu.Unlock()
		}
	}()
	for i := range n {
		ch, err := c.readReply()
		if err != nil {
			t.Fatal(err)
		}
		if ch.errno != 0 {
			t.Fatalf("write %d: errno %d", ch.cookie, ch.errno)
		}
		if i == 0 {
			close(start)
		}
	}
	close(stop)
	<-sampled
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	t.Logf("peak payload in the device %d KiB, peak budget %d KiB, %d writes", peak.Load()>>10, budgetPeak.Load()>>10, calls.Load())
	if p := peak.Load(); p > budget+reqSize {
		t.Errorf("%d bytes of write payload in flight, budget %d", p, budget)
	}
	if p := budgetPeak.Load(); p > budget+reqSize {
		t.Errorf("budget accounting reached %d bytes, budget %d", p, budget)
	}
	if peak.Load() < 2*reqSize {
		t.Errorf("peak %d: writes were not concurrent, the test proves nothing", peak.Load())
	}
}

// A request larger than the whole byte budget is admitted alone and does
// not wedge the connection.
func TestRequestLargerThanBudget(t *testing.T) {
	dev, _ := sparseFile(t, 4<<20)
	_, addr := serve(t, dev, func(s *Server) { s.MaxInFlightBytes = 64 << 10; s.MaxInFlight = 2 })
	c, _ := open(t, addr, true, false)
	p := pattern(1<<20, 4)
	for i := range 3 {
		c.send(0, cmdWrite, uint64(i), uint64(i)<<20, 1<<20, p)
	}
	c.send(0, cmdRead, 10, 0, 1<<20, nil)
	seen := map[uint64]bool{}
	for range 4 {
		ch, err := c.readReply()
		if err != nil {
			t.Fatal(err)
		}
		if e, msg := ch.err(); e != 0 {
			t.Fatalf("%v %s", ch, msg)
		}
		seen[ch.cookie] = true
	}
	if fmt.Sprint(seen) != "map[0:true 1:true 2:true 10:true]" {
		t.Fatalf("replies %v", seen)
	}
}
