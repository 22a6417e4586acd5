package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// blocker makes a device call wait until released.
type blocker struct {
	entered chan string
	release chan struct{}
}

func newBlocker() *blocker {
	return &blocker{entered: make(chan string, 16), release: make(chan struct{})}
}

func (b *blocker) wait(what string) {
	b.entered <- what
	<-b.release
}

func (b *blocker) expect(t *testing.T, what string) {
	t.Helper()
	select {
	case got := <-b.entered:
		if got != what {
			t.Fatalf("%s reached the device, want %s", got, what)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s never reached the device", what)
	}
}

// Shutdown lets the requests in flight finish and answers them: a WRITE
// whose pwrite is running and a FLUSH in progress get their replies before
// the connection closes, and Shutdown waits for that.
func TestShutdownAnswersInFlight(t *testing.T) {
	modes(t, func(t *testing.T, structured bool) {
		file, _ := sparseFile(t, testSize)
		b := newBlocker()
		dev := &hookDevice{Device: file,
			write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
				b.wait("write")
				return next(p, off, fua)
			},
			flush: func(next func() error) error {
				b.wait("flush")
				return next()
			},
		}
		s, addr := serve(t, dev, nil)
		c, _ := open(t, addr, structured, false)
		if err := c.send(0, cmdWrite, 1, 4096, 4096, pattern(4096, 1)); err != nil {
			t.Fatal(err)
		}
		b.expect(t, "write")
		if err := c.send(0, cmdFlush, 2, 0, 0, nil); err != nil {
			t.Fatal(err)
		}
		b.expect(t, "flush")

		stopped := make(chan error, 1)
		go func() { stopped <- s.Shutdown(context.Background()) }()
		time.Sleep(100 * time.Millisecond) // Shutdown has begun
		close(b.release)
		got := map[uint64]uint32{}
		for range 2 {
			ch, err := c.readReply()
			if err != nil {
				t.Fatalf("replies received before the close: %v; then %v", got, err)
			}
			e, _ := ch.err()
			got[ch.cookie] = e
		}
		if got[1] != 0 || got[2] != 0 {
			t.Fatalf("replies %v, want WRITE (1) and FLUSH (2) done", got)
		}
		c.expectClosed("after Shutdown")
		select {
		case err := <-stopped:
			if err != nil {
				t.Errorf("Shutdown: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Shutdown did not return once the requests were answered")
		}
	})
}

// Once Shutdown has begun no request is started: one sent after it never
// reaches the device, and gets no reply; the one in flight does.
func TestShutdownStartsNothingNew(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	b := newBlocker()
	var later atomic.Int32
	dev := &hookDevice{Device: file,
		write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
			if off == 0 {
				b.wait("first write")
			} else {
				later.Add(1)
			}
			return next(p, off, fua)
		},
		read: func(p []byte, off int64, next func([]byte, int64) error) error {
			later.Add(1)
			return next(p, off)
		},
	}
	s, addr := serve(t, dev, nil)
	c, _ := open(t, addr, true, false)
	if err := c.send(0, cmdWrite, 1, 0, 4096, pattern(4096, 1)); err != nil {
		t.Fatal(err)
	}
	b.expect(t, "first write")
	stopped := make(chan error, 1)
	go func() { stopped <- s.Shutdown(context.Background()) }()
	time.Sleep(100 * time.Millisecond)
	// Sent after Shutdown began (errors ignored: the server may be gone).
	c.send(0, cmdWrite, 2, 8192, 4096, pattern(4096, 2))
	c.send(0, cmdRead, 3, 8192, 4096, nil)
	time.Sleep(100 * time.Millisecond)
	close(b.release)
	ch, err := c.readReply()
	if err != nil {
		t.Fatalf("no reply to the write in flight: %v", err)
	}
	if e, msg := ch.err(); ch.cookie != 1 || e != 0 {
		t.Fatalf("reply %v (%s), want the first write's", ch, msg)
	}
	c.expectClosed("after Shutdown")
	if n := later.Load(); n != 0 {
		t.Errorf("%d requests sent after Shutdown began reached the device", n)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return")
	}
}

// Shutdown of a server whose connections are idle (in transmission, in
// the handshake, with TLS or without) is done at once.
func TestShutdownIdleAtOnce(t *testing.T) {
	fx := newTLSFixture(t)
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, func(s *Server) { s.TLS = fx.server })
	idle, _ := open(t, addr, true, false)
	idle.mustWrite(0, []byte("x"))
	haggling := connect(t, addr, clientFixed)
	haggling.final(optStructuredReply, nil, repAck)
	greeted := dialRaw(t, addr)
	tlsIdle := connect(t, addr, clientFixed|clientNoZeroes)
	if err := tlsIdle.startTLS(fx.client); err != nil {
		t.Fatal(err)
	}
	tlsIdle.goExport("disk")
	tlsIdle.mustWrite(0, []byte("y"))

	start := time.Now()
	if err := s.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second { // "at once", with slack for a loaded machine
		t.Errorf("Shutdown of a server with idle connections took %v", d)
	}
	for _, c := range []*rawClient{idle, haggling, greeted, tlsIdle} {
		c.expectClosed("idle connection after Shutdown")
	}
}

// A request stuck in the device (a hung backing file) holds neither
// Shutdown past its context nor Close past CloseTimeout. The connection
// closes; its goroutine ends, and its export is released, once the device
// returns.
func TestStopBoundedWithStuckDevice(t *testing.T) {
	t.Run("Shutdown", func(t *testing.T) {
		stuckDevice(t, nil, func(s *Server) error {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err := s.Shutdown(ctx)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Shutdown cut short by its context returned %v", err)
			}
			return err
		})
	})
	t.Run("Close", func(t *testing.T) {
		stuckDevice(t, func(s *Server) { s.CloseTimeout = 300 * time.Millisecond }, (*Server).Close)
	})
}

func stuckDevice(t *testing.T, configure func(*Server), stop func(*Server) error) {
	file, _ := sparseFile(t, testSize)
	b := newBlocker()
	dev := &hookDevice{Device: file, read: func(p []byte, off int64, next func([]byte, int64) error) error {
		b.wait("read")
		return next(p, off)
	}}
	var opens, releases atomic.Int32
	exps := countingExports{Export: &Export{Name: "disk", Device: dev}, opens: &opens, releases: &releases}
	s, addr := serve(t, dev, func(s *Server) {
		s.Exports = exps
		if configure != nil {
			configure(s)
		}
	})
	warm, _ := open(t, addr, false, false)
	warm.disc()
	warm.expectClosed("DISC")
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Fatal("warm-up connection left")
	}
	base := runtime.NumGoroutine()

	c, _ := open(t, addr, false, false)
	if err := c.send(0, cmdRead, 1, 0, 4096, nil); err != nil {
		t.Fatal(err)
	}
	b.expect(t, "read")
	stopped := make(chan struct{})
	start := time.Now()
	go func() {
		stop(s)
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		close(b.release)
		t.Fatalf("still waiting for a request stuck in the device after %v", time.Since(start))
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("stopping took %v with a bound of 300ms", d)
	}
	c.expectClosed("stopped with a request stuck in the device")
	if r := releases.Load(); r != 1 {
		// The warm-up's release only: the stuck request still uses the device.
		t.Errorf("%d releases while a request is in the device, want 1", r)
	}
	close(b.release)
	ok := waitFor(5*time.Second, func() bool {
		return releases.Load() == 2 && s.Connections() == 0 && runtime.NumGoroutine() <= base+2
	})
	if !ok {
		buf := make([]byte, 1<<20)
		t.Fatalf("after the device returned: %d releases, %d connections, %d goroutines (baseline %d)\n%s",
			releases.Load(), s.Connections(), runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
	}
}

// The spec: a server being shut down SHOULD answer options with
// ERR_SHUTDOWN. An INFO whose Exports.Open is under way when Shutdown
// begins is cancelled and answered so, and the session ends.
func TestShutdownRefusesOptionInProgress(t *testing.T) {
	exps := newStuckExports(20 * time.Second)
	s, addr := serve(t, nil, func(s *Server) { s.Exports = exps })
	c := connect(t, addr, clientFixed)
	if err := c.sendOption(optInfo, encInfoGo("disk")); err != nil {
		t.Fatal(err)
	}
	<-exps.entered
	start := time.Now()
	if err := s.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second { // the handshake's 30 s would be the failure
		t.Errorf("Shutdown took %v", d)
	}
	r, err := c.readOptReply()
	if err != nil {
		t.Fatalf("no reply to the option under way: %v", err)
	}
	if r.opt != optInfo || r.typ != repErrShutdown {
		t.Errorf("reply %v, want ERR_SHUTDOWN", r)
	}
	c.expectClosed("after ERR_SHUTDOWN")
}

// dialSmallWindow connects with a small receive buffer, so replies the
// client does not read wait in the server's send queue.
func dialSmallWindow(t *testing.T, addr string) *rawClient {
	t.Helper()
	d := net.Dialer{Timeout: ioTimeout, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawClient{t: t, nc: nc, r: bufio.NewReader(nc), reads: map[uint64]uint32{}}
	if _, err := c.readN(18); err != nil {
		t.Fatal(err)
	}
	if err := c.write(encClientFlags(clientFixed | clientNoZeroes)); err != nil {
		t.Fatal(err)
	}
	c.final(optStructuredReply, nil, repAck)
	c.structured = true
	c.goExport("disk")
	return c
}

// Replies the server wrote but the network has not delivered yet (a
// client slow to read) survive Shutdown even when the client sent
// requests the server no longer reads: closing a socket with unread input
// makes the kernel reset the connection and drop what it had not sent
// (linger).
func TestShutdownKeepsQueuedReplies(t *testing.T) {
	const n, size = 8, 1 << 20
	file, _ := sparseFile(t, n*size)
	// Not the file itself: its reads the reader would run one by one
	// (readNow), and those behind the one it is writing would not have
	// started when Shutdown begins.
	dev := &hookDevice{Device: file}
	s, addr := serve(t, dev, nil)
	c := dialSmallWindow(t, addr)
	var reqs []byte
	for i := range n {
		reqs = append(reqs, encRequest(0, cmdRead, uint64(i), uint64(i)*size, size)...)
	}
	if err := c.write(reqs); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the replies fill the send queue
	stopped := make(chan error, 1)
	go func() { stopped <- s.Shutdown(context.Background()) }()
	time.Sleep(200 * time.Millisecond)
	// Requests the server will not read any more.
	c.write(encRequest(0, cmdRead, 100, 0, 4096))
	time.Sleep(100 * time.Millisecond)
	for i := range n {
		ch, err := c.readReply()
		if err != nil {
			t.Fatalf("reply %d of %d: %v", i+1, n, err)
		}
		if e, msg := ch.err(); e != 0 || len(ch.data()) != size {
			t.Fatalf("reply %v (%s)", ch, msg)
		}
	}
	c.expectClosed("after the queued replies")
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return")
	}
}

// ---- TLS: close_notify whenever the server ends the session ----

// The spec asks the party that drops the connection to shut TLS down
// first (ABORT and DISC: handshake_test.go's TestTLSShutdown); without a
// close_notify the client cannot tell the end of the session from a
// truncation.

// tls12 returns the fixture's client configuration limited to TLS 1.2,
// whose record headers tell an alert from data.
func tls12(fx tlsFixture) *tls.Config {
	cfg := fx.client.Clone()
	cfg.MaxVersion = tls.VersionTLS12
	return cfg
}

// openTLS enters transmission on "disk" over TLS.
func openTLS(t *testing.T, addr string, cfg *tls.Config) *rawClient {
	t.Helper()
	c := connect(t, addr, clientFixed|clientNoZeroes)
	if err := c.startTLS(cfg); err != nil {
		t.Fatal(err)
	}
	c.goExport("disk")
	return c
}

// A revoked export's connection ends with close_notify.
func TestTLSCloseNotifyOnRevocation(t *testing.T) {
	fx := newTLSFixture(t)
	file, _ := sparseFile(t, testSize)
	revoked := make(chan struct{})
	var opens, releases atomic.Int32
	exps := countingExports{Export: &Export{Name: "disk", Device: file}, opens: &opens, releases: &releases, revoked: revoked}
	s, addr := serve(t, file, func(s *Server) { s.TLS, s.RequireTLS, s.Exports = fx.server, true, exps })
	c := openTLS(t, addr, tls12(fx))
	c.mustWrite(0, []byte("before"))
	close(revoked)
	c.expectTLSShutdown("revocation")
	drain(t, s, c)
}

// A session the server ends for the client's error ends with close_notify,
// in transmission and in the handshake.
func TestTLSCloseNotifyOnError(t *testing.T) {
	fx := newTLSFixture(t)
	file, _ := sparseFile(t, testSize)
	s, addr := serve(t, file, func(s *Server) { s.TLS, s.RequireTLS = fx.server, true })
	c := openTLS(t, addr, tls12(fx))
	c.mustWrite(0, []byte("before"))
	bad := encRequest(0, cmdRead, 1, 0, 512)
	bad[0] ^= 0xff
	if err := c.write(bad); err != nil {
		t.Fatal(err)
	}
	c.expectTLSShutdown("bad request magic")

	// In the handshake: EXPORT_NAME of an unknown export cannot be
	// refused; the server ends the session.
	c = connect(t, addr, clientFixed|clientNoZeroes)
	if err := c.startTLS(tls12(fx)); err != nil {
		t.Fatal(err)
	}
	if err := c.sendOption(optExportName, []byte("nonesuch")); err != nil {
		t.Fatal(err)
	}
	c.expectTLSShutdown("EXPORT_NAME of an unknown export")
	drain(t, s, c)
}

// Server.Close ends TLS sessions with close_notify, in transmission and
// in the handshake.
func TestTLSCloseNotifyOnClose(t *testing.T) {
	fx := newTLSFixture(t)
	file, _ := sparseFile(t, testSize)
	s, addr := serve(t, file, func(s *Server) { s.TLS, s.RequireTLS = fx.server, true })
	c := openTLS(t, addr, tls12(fx))
	c.mustWrite(0, []byte("before"))
	haggling := connect(t, addr, clientFixed)
	if err := haggling.startTLS(tls12(fx)); err != nil {
		t.Fatal(err)
	}
	haggling.final(optStructuredReply, nil, repAck)
	s.Close()
	c.expectTLSShutdown("Close in transmission")
	haggling.expectTLSShutdown("Close in the handshake")
}

// Server.Shutdown ends TLS sessions with close_notify.
func TestTLSCloseNotifyOnShutdown(t *testing.T) {
	fx := newTLSFixture(t)
	file, _ := sparseFile(t, testSize)
	s, addr := serve(t, file, func(s *Server) { s.TLS, s.RequireTLS = fx.server, true })
	c := openTLS(t, addr, tls12(fx))
	c.mustWrite(0, []byte("before"))
	if err := s.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
	c.expectTLSShutdown("Shutdown")
}

// A TLS client that reads nothing cannot hold the server's close: the
// close_notify is tried for a bounded time only.
func TestTLSCloseBounded(t *testing.T) {
	fx := newTLSFixture(t)
	file, _ := sparseFile(t, testSize)
	revoked := make(chan struct{})
	var opens, releases atomic.Int32
	exps := countingExports{Export: &Export{Name: "disk", Device: file}, opens: &opens, releases: &releases, revoked: revoked}
	s, addr := serve(t, file, func(s *Server) { s.TLS, s.RequireTLS, s.Exports = fx.server, true, exps })
	c := openTLS(t, addr, tls12(fx))
	var reqs []byte
	for i := range 16 {
		reqs = append(reqs, encRequest(0, cmdRead, uint64(i), 0, 1<<20)...)
	}
	if err := c.write(reqs); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the server's writes block: nobody reads
	start := time.Now()
	close(revoked)
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Fatalf("revoked connection whose client reads nothing still open after %v", time.Since(start))
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("closing took %v", d)
	}
	c.close()
}

// A Serve that starts only after Close (its goroutine scheduled late)
// closes its listener: the port is free for the next server.
func TestServeAfterCloseFreesPort(t *testing.T) {
	s := &Server{Exports: mapExports{}}
	s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(ln); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Serve after Close: %v, want net.ErrClosed", err)
	}
	again, err := net.Listen("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("the port after Serve returned: %v", err)
	}
	again.Close()
}
