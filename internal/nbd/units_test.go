package nbd

import (
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/basalt-storage/basalt/internal/block"
)

func TestBufferPool(t *testing.T) {
	for _, n := range []int{0, 1, 4095, 4096, 4097, 65536, 65537, 1 << 20, MaxPayload - 1, MaxPayload} {
		b := getBuf(n)
		if len(b) != n || cap(b) < 4096 || cap(b)&(cap(b)-1) != 0 || cap(b) > 2*max(n, 4096) {
			t.Errorf("getBuf(%d): len %d cap %d", n, len(b), cap(b))
		}
		putBuf(b)
		if b2 := getBuf(n); len(b2) != n {
			t.Errorf("getBuf(%d) after putBuf: len %d", n, len(b2))
		}
	}
	// Foreign buffers are not pooled (and do not panic).
	putBuf(nil)
	putBuf(make([]byte, 100))
	putBuf(make([]byte, 5000))
	putBuf(make([]byte, 1, 2*MaxPayload))
	if b := getBuf(4097); cap(b) != 8192 {
		t.Errorf("a foreign 5000-byte buffer came back from the pool: cap %d", cap(b))
	}
}

func TestBudget(t *testing.T) {
	b := newBudget(2, 100)
	b.acquire(60)
	b.acquire(40) // exactly full
	admitted := make(chan struct{})
	go func() {
		b.acquire(1) // no room by count nor bytes
		close(admitted)
	}()
	select {
	case <-admitted:
		t.Fatal("admitted beyond the budget")
	case <-time.After(50 * time.Millisecond):
	}
	b.release(60)
	<-admitted
	b.release(40)
	b.release(1)
	// A request bigger than the whole budget is admitted, alone: even a
	// request without payload waits for it.
	b.acquire(1000)
	second := make(chan struct{})
	go func() {
		b.acquire(0)
		close(second)
	}()
	select {
	case <-second:
		t.Fatal("admitted next to an over-budget request")
	case <-time.After(50 * time.Millisecond):
	}
	b.release(1000)
	<-second
	b.release(0)
	if b.count != 0 || b.bytes != 0 {
		t.Fatalf("budget not back to zero: %d requests, %d bytes", b.count, b.bytes)
	}
}

// fakeListener returns scripted Accept errors.
type fakeListener struct {
	mu    sync.Mutex
	errs  []error
	calls int
}

func (l *fakeListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	err := l.errs[0]
	if len(l.errs) > 1 {
		l.errs = l.errs[1:]
	}
	return nil, err
}
func (l *fakeListener) Close() error   { return nil }
func (l *fakeListener) Addr() net.Addr { return pipeAddr{} }

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "accept timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// Serve retries temporary accept errors with a backoff and returns a
// permanent one; after Close it refuses to serve.
func TestServeAcceptErrors(t *testing.T) {
	fatal := errors.New("listener broke")
	ln := &fakeListener{errs: []error{timeoutErr{}, timeoutErr{}, fatal}}
	s := &Server{Exports: mapExports{}}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	select {
	case err := <-done:
		if !errors.Is(err, fatal) {
			t.Fatalf("Serve returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	if ln.calls != 3 {
		t.Errorf("%d Accept calls", ln.calls)
	}
	s.Close()
	if err := s.Serve(&fakeListener{errs: []error{fatal}}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Serve after Close: %v", err)
	}
}

// An error message longer than the protocol's 4096-byte string limit is
// truncated in the error chunk.
func TestLongErrorMessage(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	long := strings.Repeat("e", 10000)
	dev := &hookDevice{Device: file, read: func(p []byte, off int64, next func([]byte, int64) error) error {
		return errors.New(long)
	}}
	_, addr := serve(t, dev, nil)
	c, _ := open(t, addr, true, false)
	c.send(0, cmdRead, 1, 0, 512, nil)
	cs := c.reply(1)
	e, msg := cs[0].err()
	if e != errIO || len(msg) == 0 || len(msg) > maxString || 6+len(msg) != len(cs[0].payload) {
		t.Fatalf("errno %d, message of %d bytes in a %d-byte chunk", e, len(msg), len(cs[0].payload))
	}
}

// A device that reports a very fragmented range: the reply is bounded, its
// extents are consistent, and the client can make progress.
func TestBlockStatusManyExtents(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	dev := &hookDevice{Device: file, extents: func(off, n int64, next func(int64, int64) ([]block.Extent, error)) ([]block.Extent, error) {
		exts := make([]block.Extent, 0, n)
		for i := int64(0); i < n; i++ {
			exts = append(exts, block.Extent{Length: 1, Hole: i%2 == 0, Zero: i%2 == 0})
		}
		return exts, nil
	}}
	_, addr := serve(t, dev, nil)
	c, _ := open(t, addr, true, true)
	c.send(0, cmdBlockStatus, 1, 0, 100000, nil)
	cs := c.reply(1)
	if len(cs) != 1 || cs[0].typ != replyTypeBlockStatus {
		t.Fatalf("reply %v", cs)
	}
	n := (len(cs[0].payload) - 4) / 8
	if n < 1 || n > maxExtentsPerReply || (len(cs[0].payload)-4)%8 != 0 {
		t.Fatalf("%d extents in %d bytes", n, len(cs[0].payload))
	}
	for i := 0; i < n; i++ {
		l, st := be.Uint32(cs[0].payload[4+8*i:]), be.Uint32(cs[0].payload[8+8*i:])
		if l != 1 || (st == 0) != (i%2 == 1) {
			t.Fatalf("extent %d: length %d status %d", i, l, st)
		}
	}
}

// Commands the device does not support are not advertised and are
// refused with EINVAL.
func TestUnsupportedFlush(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	var flushes atomic.Int32
	dev := &hookDevice{Device: file,
		caps:  func(c block.Capabilities) block.Capabilities { c.Flush = false; return c },
		flush: func(next func() error) error { flushes.Add(1); return next() }}
	_, addr := serve(t, dev, nil)
	c, ei := open(t, addr, false, false)
	if ei.flags&tflagSendFlush != 0 {
		t.Fatalf("SEND_FLUSH advertised: %#x", ei.flags)
	}
	checkErr(t, c, false, "FLUSH unsupported", 0, cmdFlush, 0, 0, nil, errInval)
	if flushes.Load() != 0 {
		t.Fatal("the device was flushed")
	}
}

// TestMessage: error messages are valid UTF-8 of at most maxString bytes,
// cut between characters, whatever a client's export name held.
func TestMessage(t *testing.T) {
	long := strings.Repeat("é", maxString) // two bytes each
	if m := message("%s", "x"+long); len(m) > maxString || !utf8.ValidString(m) || len(m) != maxString-1 {
		t.Errorf("long message: %d bytes, valid %v", len(m), utf8.ValidString(m))
	}
	if m := message("no export %q", "a\xffb"); !utf8.ValidString(m) {
		t.Errorf("message %q is not UTF-8", m)
	}
	if m := message("no export %s", "a\xffb"); m != "no export a\uFFFDb" {
		t.Errorf("message %q", m)
	}
}
