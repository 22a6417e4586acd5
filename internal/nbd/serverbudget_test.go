package nbd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// acquireAsync starts acquire(n) in a goroutine and waits until it is
// queued (the budget then has want waiters) or admitted. The channel gets
// its result.
func acquireAsync(t *testing.T, s *serverBudget, n int64, cancel <-chan struct{}, want int) <-chan bool {
	t.Helper()
	got := make(chan bool, 1)
	go func() { got <- s.acquire(n, cancel) }()
	if !waitFor(5*time.Second, func() bool { return s.waiters() == want || len(got) > 0 }) {
		t.Fatalf("acquire(%d) neither queued nor admitted", n)
	}
	return got
}

func admitted(ch <-chan bool) bool {
	select {
	case ok := <-ch:
		if !ok {
			panic("acquire gave up")
		}
		return true
	case <-time.After(30 * time.Millisecond):
		return false
	}
}

// The server budget admits waiters first come, first served, lets nobody
// past them, clamps what is bigger than it, and lets a waiter that gives
// up leave the queue (or give back a grant that raced with it).
func TestServerBudgetFIFO(t *testing.T) {
	s := newServerBudget(100)
	if !s.tryAcquire(100) {
		t.Fatal("an empty budget refused its size")
	}
	if s.tryAcquire(1) {
		t.Fatal("a full budget admitted more")
	}
	a := acquireAsync(t, s, 60, nil, 1)
	b := acquireAsync(t, s, 10, nil, 2)
	c := acquireAsync(t, s, 50, nil, 3)
	if admitted(a) || admitted(b) || admitted(c) {
		t.Fatal("admitted beyond the budget")
	}
	s.release(100)
	if !admitted(a) || !admitted(b) {
		t.Fatal("the first two waiters, who fit, were not admitted")
	}
	if admitted(c) {
		t.Fatal("a waiter that does not fit was admitted")
	}
	// 30 bytes free, but c waits: nobody passes it.
	if s.tryAcquire(1) {
		t.Fatal("tryAcquire passed a waiter")
	}
	d := acquireAsync(t, s, 1, nil, 2)
	if admitted(d) {
		t.Fatal("a small request passed a big one queued before it")
	}
	s.release(60)
	if !admitted(c) || !admitted(d) {
		t.Fatal("waiters not admitted once there was room")
	}
	if got := s.inFlight(); got != 61 {
		t.Fatalf("%d bytes charged, want 61", got)
	}
	s.release(10)
	s.release(50)
	s.release(1)

	// A request bigger than the budget is charged the budget: alone.
	s.acquire(1000, nil)
	if got := s.inFlight(); got != 100 {
		t.Fatalf("an oversized request charged %d, want the budget (100)", got)
	}
	e := acquireAsync(t, s, 1, nil, 1)
	if admitted(e) {
		t.Fatal("admitted next to an oversized request")
	}
	s.release(1000)
	if !admitted(e) {
		t.Fatal("not admitted after the oversized request")
	}
	s.release(1)

	// A waiter that gives up leaves the queue; those behind it go.
	s.acquire(50, nil)
	cancel := make(chan struct{})
	big := acquireAsync(t, s, 80, cancel, 1)
	small := acquireAsync(t, s, 10, nil, 2)
	if admitted(small) {
		t.Fatal("passed a waiter")
	}
	close(cancel)
	if ok := <-big; ok {
		t.Fatal("cancelled acquire reported success")
	}
	if !admitted(small) {
		t.Fatal("the waiter behind one that gave up was not admitted")
	}
	s.release(10)
	s.release(50)
	if s.inFlight() != 0 || s.waiters() != 0 || s.state.Load() != 0 {
		t.Fatalf("budget not back to zero: state %#x, %d waiters", s.state.Load(), s.waiters())
	}

	// Cancelled before it waited: nothing charged.
	closed := make(chan struct{})
	close(closed)
	s.acquire(100, nil)
	if s.acquire(1, closed) {
		t.Fatal("acquire with a closed cancel admitted beyond the budget")
	}
	s.release(100)
	if s.state.Load() != 0 {
		t.Fatalf("state %#x after all was released", s.state.Load())
	}
}

// Under a storm of acquires (some cancelled) and releases the charge never
// exceeds the budget, and everything comes back.
func TestServerBudgetStress(t *testing.T) {
	const size = 1000
	s := newServerBudget(size)
	var wg sync.WaitGroup
	var over atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 2000 {
				n := int64(r.IntN(1300)) // some bigger than the budget
				var cancel chan struct{}
				if r.IntN(8) == 0 {
					cancel = make(chan struct{})
					time.AfterFunc(time.Duration(r.IntN(50))*time.Microsecond, func() { close(cancel) })
				}
				if !s.acquire(n, cancel) {
					continue
				}
				if v := s.inFlight(); v > size {
					over.Store(v)
				}
				if r.IntN(4) == 0 {
					runtime.Gosched()
				}
				s.release(n)
			}
		})
	}
	wg.Wait()
	if v := over.Load(); v != 0 {
		t.Errorf("%d bytes charged, budget %d", v, size)
	}
	if s.state.Load() != 0 || s.waiters() != 0 {
		t.Fatalf("after the storm: state %#x, %d waiters", s.state.Load(), s.waiters())
	}
}

// budgetSettles waits until the server's budget is back to zero with
// nobody waiting, and fails the test if it is not.
func budgetSettles(t *testing.T, s *Server, what string) {
	t.Helper()
	if !waitFor(10*time.Second, func() bool { return s.InFlightBytes() == 0 && s.total.waiters() == 0 }) {
		t.Fatalf("%s: %d bytes still charged to the server budget (state %#x), %d waiting",
			what, s.InFlightBytes(), s.total.state.Load(), s.total.waiters())
	}
}

// Many connections pipelining big writes to a slow device never have more
// payload in flight, together, than MaxInFlightBytesTotal (in the server's
// accounting, and in the device), and they take turns: between two writes
// of one connection, every other connection gets a bounded number in.
func TestServerBudgetBoundsConnections(t *testing.T) {
	const (
		conns   = 16
		perConn = 8
		reqSize = 1 << 20
		total   = 4 * reqSize
		slot    = perConn * reqSize
	)
	file, _ := sparseFile(t, conns*slot)
	var cur, peak atomic.Int64
	var seqMu sync.Mutex
	var seq []int // the connection of each write, in the order they reached the device
	dev := &hookDevice{Device: file, write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
		n := cur.Add(int64(len(p)))
		for m := peak.Load(); n > m && !peak.CompareAndSwap(m, n); m = peak.Load() {
		}
		seqMu.Lock()
		seq = append(seq, int(off/slot))
		seqMu.Unlock()
		time.Sleep(10 * time.Millisecond)
		defer cur.Add(-int64(len(p)))
		return next(p, off, fua)
	}}
	s, addr := serve(t, dev, func(s *Server) { s.MaxInFlightBytesTotal = total })
	clients := make([]*rawClient, conns)
	for i := range clients {
		clients[i], _ = open(t, addr, false, false)
	}
	var chargedPeak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if v := s.InFlightBytes(); v > chargedPeak.Load() {
				chargedPeak.Store(v)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	errs := make(chan error, 2*conns)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			p := pattern(reqSize, byte(i))
			for j := range perConn {
				if err := c.send(0, cmdWrite, uint64(j), uint64(i*slot+j*reqSize), reqSize, p); err != nil {
					errs <- fmt.Errorf("connection %d: %v", i, err)
					return
				}
			}
		})
		wg.Go(func() {
			for range perConn {
				ch, err := c.readReply()
				if err != nil {
					errs <- fmt.Errorf("connection %d: %v", i, err)
					return
				}
				if ch.errno != 0 {
					errs <- fmt.Errorf("connection %d: write %d: errno %d", i, ch.cookie, ch.errno)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Turns: the writes of other connections that reached the device
	// between two of one connection's. First come, first served allows
	// conns-1 (each other connection has at most one request queued);
	// the slack is for the hops from admission to the device.
	seqMu.Lock() // (the race detector cannot see the replies follow the appends)
	order := seq
	seqMu.Unlock()
	maxGap, last := 0, map[int]int{}
	for i, cn := range order {
		if j, ok := last[cn]; ok {
			maxGap = max(maxGap, i-j-1)
		}
		last[cn] = i
	}
	t.Logf("%d writes; peak payload in the device %d KiB, peak charged %d KiB, budget %d KiB; longest wait %d writes of others",
		len(order), peak.Load()>>10, chargedPeak.Load()>>10, total>>10, maxGap)
	if len(order) != conns*perConn {
		t.Fatalf("%d writes reached the device, want %d", len(order), conns*perConn)
	}
	if p := peak.Load(); p > total {
		t.Errorf("%d bytes of payload in the device at once, server budget %d", p, total)
	}
	if p := chargedPeak.Load(); p > total {
		t.Errorf("%d bytes charged at once, server budget %d", p, total)
	}
	if peak.Load() < 2*reqSize {
		t.Errorf("peak %d: writes were not concurrent, the test proves nothing", peak.Load())
	}
	if maxGap > 3*conns {
		t.Errorf("a connection waited while %d writes of others went in (FIFO allows %d)", maxGap, conns-1)
	}
	budgetSettles(t, s, "after the writes")
}

// A request bigger than the whole server budget still runs (alone), and
// the connections around it go on.
func TestServerBudgetRequestLargerThanBudget(t *testing.T) {
	dev, _ := sparseFile(t, 8<<20)
	s, addr := serve(t, dev, func(s *Server) { s.MaxInFlightBytesTotal = 256 << 10 })
	big, _ := open(t, addr, true, false)
	small, _ := open(t, addr, false, false)
	p := pattern(4<<20, 3)
	done := make(chan error, 1)
	go func() {
		for i := range 8 {
			if e := small.writeAt(0, uint64(6<<20+i*(64<<10)), pattern(64<<10, byte(i))); e != 0 {
				done <- fmt.Errorf("small write: errno %d", e)
				return
			}
		}
		done <- nil
	}()
	big.mustWrite(0, p)
	if got := big.mustRead(0, 4<<20); string(got) != string(p) {
		t.Fatal("read back wrong data")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	budgetSettles(t, s, "after requests bigger than the budget")
}

// Device errors give the charge back.
func TestServerBudgetDeviceErrors(t *testing.T) {
	file, _ := sparseFile(t, 4<<20)
	errDev := errors.New("device error")
	dev := &hookDevice{Device: file,
		write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error { return errDev },
		read:  func(p []byte, off int64, next func([]byte, int64) error) error { return errDev },
	}
	s, addr := serve(t, dev, func(s *Server) { s.MaxInFlightBytesTotal = 1 << 20 })
	modes(t, func(t *testing.T, structured bool) {
		c, _ := open(t, addr, structured, false)
		for i := range 20 {
			n := uint32(4096 << (i % 9)) // 4 KiB to 1 MiB
			if err := c.send(0, cmdWrite, uint64(2*i), 0, n, make([]byte, n)); err != nil {
				t.Fatal(err)
			}
			if err := c.send(0, cmdRead, uint64(2*i+1), 0, n, nil); err != nil {
				t.Fatal(err)
			}
		}
		// Invalid requests too: beyond the end, a write too big.
		c.send(0, cmdRead, 100, 4<<20, 1<<20, nil)
		c.send(0, cmdWrite, 101, 4<<20, 1<<20, make([]byte, 1<<20))
		for range 42 {
			ch, err := c.readReply()
			if err != nil {
				t.Fatal(err)
			}
			if e, _ := ch.err(); e == 0 {
				t.Fatalf("reply %v: no error", ch)
			}
		}
		// The connection is still open: its budget must be back already.
		budgetSettles(t, s, "after failed requests")
		c.disc()
	})
}

// Clients that vanish mid-request — mid-payload, with reads in flight
// whose replies they never read, while their reader waits for the
// server's budget — leave nothing charged. With and without splicing.
func TestServerBudgetAbruptDisconnects(t *testing.T) {
	for _, splice := range []bool{false, true} {
		t.Run(map[bool]string{false: "copied", true: "spliced"}[splice], func(t *testing.T) {
			file, _ := sparseFile(t, 8<<20)
			var s *Server
			var addr string
			if splice {
				s, addr = serve(t, &splicingW{File: file}, func(s *Server) { s.MaxInFlightBytesTotal = 2 << 20; s.spliceLocal = true })
			} else {
				// Not a block.SpliceWriter: writes are copied.
				s, addr = serve(t, &hookDevice{Device: file}, func(s *Server) { s.MaxInFlightBytesTotal = 2 << 20 })
			}
			scenarios := []func(nc net.Conn){
				func(nc net.Conn) { // a big write cut short
					goTransmission(nc)
					nc.Write(encRequest(0, cmdWrite, 1, 0, 1<<20))
					nc.Write(make([]byte, 300<<10))
					time.Sleep(10 * time.Millisecond)
				},
				func(nc net.Conn) { // a small write cut short
					goTransmission(nc)
					nc.Write(encRequest(0, cmdWrite, 1, 0, 100<<10))
					nc.Write(make([]byte, 1000))
				},
				func(nc net.Conn) { // reads never collected
					goTransmission(nc)
					var b []byte
					for i := range 32 {
						b = append(b, encRequest(0, cmdRead, uint64(i), uint64(i)<<16, 1<<20)...)
					}
					nc.Write(b)
				},
				func(nc net.Conn) { // a stream of writes, gone
					goTransmission(nc)
					for i := range 8 {
						if _, err := nc.Write(append(encRequest(0, cmdWrite, uint64(i), uint64(i)<<20, 512<<10), make([]byte, 512<<10)...)); err != nil {
							return
						}
					}
				},
				func(nc net.Conn) { // a write far bigger than the budget, cut short
					goTransmission(nc)
					nc.Write(encRequest(0, cmdWrite, 1, 0, 6<<20))
					nc.Write(make([]byte, 2<<20))
				},
			}
			var wg sync.WaitGroup
			for i := range 48 {
				wg.Go(func() {
					nc, err := net.DialTimeout("tcp", addr, ioTimeout)
					if err != nil {
						return
					}
					defer nc.Close()
					nc.SetDeadline(time.Now().Add(2 * time.Second))
					hello := make([]byte, 18)
					if _, err := io.ReadFull(nc, hello); err != nil {
						return
					}
					scenarios[i%len(scenarios)](nc)
				})
			}
			wg.Wait()
			if !waitFor(10*time.Second, func() bool { return s.Connections() == 0 }) {
				t.Fatalf("%d connections left", s.Connections())
			}
			budgetSettles(t, s, "after abrupt disconnects")
			// The server still works.
			c, _ := open(t, addr, false, false)
			c.mustWrite(0, pattern(1<<20, 1))
			c.mustRead(0, 1<<20)
			budgetSettles(t, s, "after a request")
		})
	}
}

// Spliced reads and writes are charged and give their charge back,
// including those that fail.
func TestServerBudgetSpliced(t *testing.T) {
	t.Run("writes", func(t *testing.T) {
		for _, fail := range []bool{false, true} {
			file, _ := sparseFile(t, 16<<20)
			dev := &splicingW{File: file, part: 0.5, failWrite: fail}
			s, addr := serve(t, dev, func(s *Server) { s.MaxInFlightBytesTotal = 1 << 20 })
			c, _ := open(t, addr, true, false)
			for i := range 12 {
				n := []int{256 << 10, 1 << 20, 3<<20 + 5}[i%3]
				if err := c.send(0, cmdWrite, uint64(i), uint64(i)<<20, uint32(n), pattern(n, byte(i))); err != nil {
					t.Fatal(err)
				}
			}
			for range 12 {
				ch, err := c.readReply()
				if err != nil {
					t.Fatal(err)
				}
				if e, _ := ch.err(); (e != 0) != fail {
					t.Fatalf("write %d: errno %d", ch.cookie, e)
				}
			}
			if dev.taken.Load() == 0 && !fail {
				t.Fatal("nothing was spliced")
			}
			budgetSettles(t, s, "after spliced writes")
			c.disc()
		}
	})
	t.Run("reads", func(t *testing.T) {
		for _, tc := range []struct {
			handler, failRest bool
		}{{false, false}, {true, false}, {true, true}} {
			file, _ := sparseFile(t, 8<<20)
			dev := &splicing{File: file, part: 0.5, handler: tc.handler, failRest: tc.failRest}
			s, addr := serve(t, dev, func(s *Server) { s.MaxInFlightBytesTotal = 1 << 20; s.spliceLocal = true })
			c, _ := open(t, addr, true, false)
			for i := range 24 {
				if err := c.send(0, cmdRead, uint64(i), uint64(i)<<18, []uint32{64 << 10, 1 << 20, 300 << 10}[i%3], nil); err != nil {
					t.Fatal(err)
				}
			}
			for range 24 {
				ch, err := c.readReply()
				if err != nil {
					t.Fatal(err)
				}
				if e, _ := ch.err(); (e != 0) != tc.failRest {
					t.Fatalf("read %d: errno %d", ch.cookie, e)
				}
			}
			if dev.spliced.Load() == 0 {
				t.Fatal("nothing was spliced")
			}
			budgetSettles(t, s, "after spliced reads")
			c.disc()
		}
	})
}

// blockedBudget serves a device whose writes wait for release, with a
// server budget of 1 MiB: holder's 1 MiB write fills it (and stays in the
// device), and waiter's read queues for it. It returns the server, both
// clients and the device's release.
func blockedBudget(t *testing.T, configure func(*Server)) (s *Server, holder, waiter *rawClient, release func()) {
	t.Helper()
	file, _ := sparseFile(t, 4<<20)
	b := newBlocker()
	dev := &hookDevice{Device: file, write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
		b.wait("write")
		return next(p, off, fua)
	}}
	s, addr := serve(t, dev, func(s *Server) {
		s.MaxInFlightBytesTotal = 1 << 20
		if configure != nil {
			configure(s)
		}
	})
	holder, _ = open(t, addr, false, false)
	waiter, _ = open(t, addr, false, false)
	if err := holder.send(0, cmdWrite, 1, 0, 1<<20, pattern(1<<20, 1)); err != nil {
		t.Fatal(err)
	}
	b.expect(t, "write")
	if err := waiter.send(0, cmdRead, 2, 0, 4096, nil); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return s.total.waiters() == 1 }) {
		t.Fatal("the read did not wait for the server budget")
	}
	var once sync.Once
	release = func() { once.Do(func() { close(b.release) }) }
	t.Cleanup(release)
	return s, holder, waiter, release
}

// Shutdown answers a request whose reader waits for the server's budget
// (it was read before Shutdown began): the budget frees as the others
// drain. Everything charged comes back.
func TestServerBudgetShutdown(t *testing.T) {
	s, holder, waiter, release := blockedBudget(t, nil)
	stopped := make(chan error, 1)
	go func() { stopped <- s.Shutdown(context.Background()) }()
	time.Sleep(50 * time.Millisecond) // Shutdown has begun
	if s.total.waiters() != 1 {
		t.Fatal("Shutdown ended the wait for the budget of a request already read")
	}
	release()
	if ch := holder.reply(1); ch[0].errno != 0 {
		t.Fatalf("write: errno %d", ch[0].errno)
	}
	if ch := waiter.reply(2); ch[0].errno != 0 || len(ch[0].payload) != 4096 {
		t.Fatalf("read: %v", ch[0])
	}
	holder.expectClosed("after Shutdown")
	waiter.expectClosed("after Shutdown")
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	budgetSettles(t, s, "after Shutdown")
}

// Close (and a Shutdown whose context ends) stops a reader waiting for
// the server's budget held by a request stuck in a device: its
// connection ends at once. The stuck one gives its charge back when the
// device returns.
func TestServerBudgetStopWhileWaiting(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(*Server)
	}{
		{"Close", func(s *Server) { s.Close() }},
		{"Shutdown-expired", func(s *Server) {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			s.Shutdown(ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, holder, waiter, release := blockedBudget(t, func(s *Server) { s.CloseTimeout = 200 * time.Millisecond })
			tc.stop(s)
			waiter.expectClosed("stopped while waiting for the budget")
			holder.expectClosed("stopped with a request in the device")
			if !waitFor(5*time.Second, func() bool { return s.Connections() == 1 }) {
				t.Fatalf("%d connections left, want the stuck one only", s.Connections())
			}
			if s.total.waiters() != 0 {
				t.Fatal("the stopped reader still waits")
			}
			if got := s.InFlightBytes(); got != 1<<20 {
				t.Fatalf("%d bytes charged, want the stuck write's 1 MiB", got)
			}
			release()
			if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
				t.Fatalf("%d connections left after the device returned", s.Connections())
			}
			budgetSettles(t, s, "after the device returned")
		})
	}
}

// A revoked export ends a connection waiting for the budget, too.
func TestServerBudgetRevoked(t *testing.T) {
	file, _ := sparseFile(t, 4<<20)
	b := newBlocker()
	dev := &hookDevice{Device: file, write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
		b.wait("write")
		return next(p, off, fua)
	}}
	revoked := make(chan struct{})
	var opens, releases atomic.Int32
	s, addr := serve(t, dev, func(s *Server) {
		s.MaxInFlightBytesTotal = 1 << 20
		s.Exports = countingExports{Export: &Export{Name: "disk", Device: dev}, opens: &opens, releases: &releases, revoked: revoked}
	})
	holder, _ := open(t, addr, false, false)
	waiter, _ := open(t, addr, false, false)
	holder.send(0, cmdWrite, 1, 0, 1<<20, pattern(1<<20, 1))
	b.expect(t, "write")
	waiter.send(0, cmdWrite, 2, 0, 8192, make([]byte, 8192))
	if !waitFor(5*time.Second, func() bool { return s.total.waiters() == 1 }) {
		t.Fatal("the write did not wait for the server budget")
	}
	close(revoked)
	waiter.expectClosed("revoked while waiting")
	close(b.release)
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Fatalf("%d connections left", s.Connections())
	}
	budgetSettles(t, s, "after revocation")
}

// No server-wide bound: nothing is charged.
func TestServerBudgetOff(t *testing.T) {
	dev, _ := sparseFile(t, 4<<20)
	s, addr := serve(t, dev, func(s *Server) { s.MaxInFlightBytesTotal = -1 })
	c, _ := open(t, addr, false, false)
	c.mustWrite(0, pattern(1<<20, 1))
	c.mustRead(0, 1<<20)
	if s.total != nil || s.InFlightBytes() != 0 {
		t.Fatal("a server budget without a bound")
	}
	s2 := &Server{}
	s2.defaults()
	if s2.MaxInFlightBytesTotal != defaultMaxInFlightBytesTotal || s2.total == nil || s2.total.size != defaultMaxInFlightBytesTotal {
		t.Fatalf("default: %d", s2.MaxInFlightBytesTotal)
	}
}
