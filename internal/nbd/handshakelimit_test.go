package nbd

import (
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// expectRefused dials addr and asserts that the server closes the
// connection without a greeting: no handshake slot was free.
func expectRefused(t *testing.T, addr string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatal(err) // the kernel accepts it: the refusal is the server's
	}
	defer nc.Close()
	nc.SetReadDeadline(time.Now().Add(ioTimeout))
	b, err := io.ReadAll(nc)
	if len(b) > 0 {
		t.Fatalf("a connection beyond MaxHandshakes got %d bytes (% x), want none", len(b), b[:min(len(b), 18)])
	}
	if !isClosedErr(err) {
		t.Fatalf("a connection beyond MaxHandshakes was not closed: %v", err)
	}
}

// waitHandshakes waits until n connections hold handshake slots.
func waitHandshakes(t *testing.T, s *Server, n int) {
	t.Helper()
	if !waitFor(10*time.Second, func() bool { return s.Handshakes() == n }) {
		t.Fatalf("%d connections in the handshake, want %d", s.Handshakes(), n)
	}
}

// Connections that send nothing hold at most MaxHandshakes slots; those
// beyond are closed before the greeting (after the short wait for a
// slot) and counted. A slot freed, by a client that finishes or by the
// handshake timeout, lets the next client in; connections in
// transmission hold none.
func TestHandshakeLimit(t *testing.T) {
	const max, extra = 4, 3
	dev, _ := sparseFile(t, testSize)
	// HandshakeTimeout leaves the first part, before the idle clients
	// time out, plenty of time on a loaded machine.
	var logged atomic.Int32
	s, addr := serve(t, dev, func(s *Server) {
		s.MaxHandshakes, s.HandshakeTimeout, s.hsSlotWait = max, 5*time.Second, 20*time.Millisecond
		s.Log = slog.New(countingHandler{&logged})
	})
	idle := make([]*rawClient, max)
	for i := range idle {
		idle[i] = dialRaw(t, addr) // greeted: it holds a slot
	}
	waitHandshakes(t, s, max)
	for range extra {
		expectRefused(t, addr)
	}
	if got := s.HandshakesRefused(); got != extra {
		t.Errorf("HandshakesRefused %d, want %d", got, extra)
	}

	// One idle client gives up: a legitimate client gets its slot, and
	// gives it back once in transmission.
	idle[0].close()
	waitHandshakes(t, s, max-1)
	c, _ := open(t, addr, true, false)
	c.mustRead(0, 4096)
	waitHandshakes(t, s, max-1) // the one in transmission holds none
	idle[0] = dialRaw(t, addr)
	waitHandshakes(t, s, max)
	expectRefused(t, addr)
	if got := s.HandshakesRefused(); got != extra+1 {
		t.Errorf("HandshakesRefused %d, want %d", got, extra+1)
	}
	// Refusals are logged at Info or above once per refusalLogEvery, not
	// once each: a flood of them must not flood the log.
	if got := logged.Load(); got != 1 {
		t.Errorf("%d log records at Info or above for %d refusals, want 1", got, extra+1)
	}

	// The idle ones time out; every slot is free again.
	waitHandshakes(t, s, 0)
	for range max {
		dialRaw(t, addr)
	}
	waitHandshakes(t, s, max)
	c.mustRead(4096, 4096) // the connection in transmission was not touched
	if got := s.HandshakesRefused(); got != extra+1 {
		t.Errorf("HandshakesRefused %d after the slots freed, want %d", got, extra+1)
	}
}

// A connection that finds every slot taken waits a moment for one: a
// slot freed meanwhile is its, and it is greeted, not refused.
func TestHandshakeSlotWait(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, func(s *Server) { s.MaxHandshakes, s.hsSlotWait = 1, 5*time.Second })
	first := dialRaw(t, addr)
	waitHandshakes(t, s, 1)
	nc, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	greeted := make(chan error, 1)
	go func() {
		nc.SetReadDeadline(time.Now().Add(ioTimeout))
		_, err := io.ReadFull(nc, make([]byte, 18))
		greeted <- err
	}()
	if !waitFor(5*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.hsWaiting == 1
	}) {
		t.Fatal("the second connection is not waiting for a slot")
	}
	first.close()
	if err := <-greeted; err != nil {
		t.Fatalf("the waiting connection was not greeted once a slot was free: %v", err)
	}
	if n := s.HandshakesRefused(); n != 0 {
		t.Errorf("HandshakesRefused %d, want 0", n)
	}
}

// Connections waiting for a slot are bounded (as many as there are
// slots; the next is closed at once, without waiting), and Close ends
// their wait at once, leaving no goroutine behind.
func TestHandshakeSlotWaitersBounded(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, func(s *Server) { s.MaxHandshakes, s.hsSlotWait = 2, time.Minute })
	// Warm up (the accept loop, pools) and take the baseline.
	c, _ := open(t, addr, false, false)
	c.disc()
	c.expectClosed("DISC")
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Fatal("warm-up connection left")
	}
	base := runtime.NumGoroutine()

	dialRaw(t, addr)
	dialRaw(t, addr)
	waitHandshakes(t, s, 2)
	var waiting []net.Conn
	for range 2 {
		nc, err := net.DialTimeout("tcp", addr, ioTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		waiting = append(waiting, nc)
	}
	if !waitFor(5*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.hsWaiting == 2
	}) {
		t.Fatal("two connections should wait for a slot")
	}
	start := time.Now()
	expectRefused(t, addr) // a third waiter: refused without the minute's wait
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the connection beyond the waiters' bound was refused after %v, want at once", d)
	}
	if n := s.HandshakesRefused(); n != 1 {
		t.Errorf("HandshakesRefused %d, want 1", n)
	}

	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for connections waiting for a slot")
	}
	for _, nc := range waiting {
		nc.SetReadDeadline(time.Now().Add(ioTimeout))
		if b, err := io.ReadAll(nc); len(b) > 0 || !isClosedErr(err) {
			t.Errorf("a waiting connection got %d bytes and %v at Close, want closed without a greeting", len(b), err)
		}
	}
	if got := s.Handshakes(); got != 0 {
		t.Errorf("%d handshake slots held after Close, want 0", got)
	}
	if !waitFor(5*time.Second, func() bool { return runtime.NumGoroutine() <= base+3 }) {
		t.Errorf("%d goroutines after Close, baseline %d", runtime.NumGoroutine(), base)
	}
}

// Every way a handshake ends gives its slot back, once: failures (bad
// flags, bad option magic, a client gone mid-option, an unknown export
// by EXPORT_NAME), ABORT, the handshake timeout, a failed TLS handshake,
// a connection reaching transmission, and Shutdown and Close. Each case
// runs more times than there are slots, so a slot not given back would
// get a later connection refused; one given back twice would leave the
// count below zero.
func TestHandshakeSlotReleased(t *testing.T) {
	const max = 2
	fx := newTLSFixture(t)
	dev, _ := sparseFile(t, testSize)
	var s *Server
	var addr string
	cases := []struct {
		name string
		// timeout: the case waits for the handshake timeout, which is
		// short for it (and only for it: the others must not hit it).
		timeout bool
		f       func(t *testing.T)
	}{
		{"bad client flags", false, func(t *testing.T) {
			c := connect(t, addr, 0x80)
			c.expectClosed("bad client flags")
		}},
		{"bad option magic", false, func(t *testing.T) {
			c := connect(t, addr, clientFixed)
			c.write(make([]byte, 16))
			c.expectClosed("bad option magic")
		}},
		{"client gone mid-option", false, func(t *testing.T) {
			c := connect(t, addr, clientFixed)
			c.write(encOption(optGo, encInfoGo("disk"))[:9])
			c.close()
		}},
		{"EXPORT_NAME unknown", false, func(t *testing.T) {
			c := connect(t, addr, clientFixed)
			c.sendOption(optExportName, []byte("nope"))
			c.expectClosed("EXPORT_NAME of an unknown export")
		}},
		{"ABORT", false, func(t *testing.T) {
			c := connect(t, addr, clientFixed)
			c.final(optGo, encInfoGo("nope"), repErrUnknown)
			c.final(optAbort, nil, repAck)
			c.expectClosed("ABORT")
		}},
		{"timeout", true, func(t *testing.T) {
			c := connect(t, addr, clientFixed)
			c.expectClosed("handshake timeout")
		}},
		{"TLS handshake fails", false, func(t *testing.T) {
			c := connect(t, addr, clientFixed)
			c.final(optStartTLS, nil, repAck)
			c.write([]byte("not a ClientHello at all, but long enough"))
			c.nc.SetReadDeadline(time.Now().Add(ioTimeout))
			io.Copy(io.Discard, c.r) // an alert at most, then the close
		}},
		{"TLS without a client certificate", false, func(t *testing.T) {
			c := connect(t, addr, clientFixed)
			if err := c.startTLS(fx.clientNoID); err == nil {
				c.nc.SetReadDeadline(time.Now().Add(ioTimeout))
				io.Copy(io.Discard, c.r) // TLS 1.3: refused after the client's side is done
			}
			c.close()
		}},
		{"transmission", false, func(t *testing.T) {
			c, _ := open(t, addr, false, false)
			waitHandshakes(t, s, 0) // the server may still be returning from GO
			c.mustRead(0, 4096)
			if got := s.Handshakes(); got != 0 {
				t.Errorf("a connection in transmission holds a handshake slot (%d held)", got)
			}
			c.disc()
			c.expectClosed("DISC")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			timeout := 5 * time.Second
			if tc.timeout {
				timeout = 300 * time.Millisecond
			}
			s, addr = serve(t, dev, func(s *Server) {
				s.MaxHandshakes, s.HandshakeTimeout, s.hsSlotWait, s.TLS = max, timeout, 20*time.Millisecond, fx.server
			})
			for range max + 1 {
				tc.f(t)
				waitHandshakes(t, s, 0)
			}
			if n := s.HandshakesRefused(); n != 0 {
				t.Fatalf("%d connections refused: a slot was not given back", n)
			}
			if tc.timeout {
				// The fill below could race the timeout; the rounds
				// above took every slot in turn, and a slot given back
				// twice would have left the count below zero.
				return
			}
			time.Sleep(50 * time.Millisecond) // a late second release would show now
			waitHandshakes(t, s, 0)
			// Every slot can be taken, and no more.
			cs := make([]*rawClient, max)
			for i := range cs {
				cs[i] = dialRaw(t, addr)
			}
			waitHandshakes(t, s, max)
			expectRefused(t, addr)
			for _, c := range cs {
				c.close()
			}
			waitHandshakes(t, s, 0)
		})
	}

	for _, stop := range []string{"Shutdown", "Close"} {
		t.Run(stop, func(t *testing.T) {
			exps := newStuckExports(20 * time.Second)
			s, addr := serve(t, dev, func(s *Server) {
				s.MaxHandshakes, s.HandshakeTimeout, s.Exports = max, time.Minute, exps
			})
			c := connect(t, addr, clientFixed)
			if err := c.sendOption(optGo, encInfoGo("disk")); err != nil {
				t.Fatal(err)
			}
			<-exps.entered // one in Exports.Open
			dialRaw(t, addr)
			waitHandshakes(t, s, max)
			var done atomic.Bool
			go func() {
				if stop == "Shutdown" {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					s.Shutdown(ctx)
				} else {
					s.Close()
				}
				done.Store(true)
			}()
			if !waitFor(ioTimeout, done.Load) {
				t.Fatalf("%s did not return", stop)
			}
			if got := s.Handshakes(); got != 0 {
				t.Errorf("%d handshake slots held after %s, want 0", got, stop)
			}
		})
	}
}
