package nbd

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestUserTimeoutReleasesAStuckClient: a client that stops reading its
// replies (its host gone, cut off, or the process stopped) holds the data
// of the replies the server could not send, counted against the server's
// budget of payload in flight. With UserTimeout the kernel ends such a
// connection once sent data has stayed unacknowledged that long, and all
// it held is released; without it, it is held for the kernel's
// retransmission time (a quarter of an hour), during which a few such
// clients would stall every other.
func TestUserTimeoutReleasesAStuckClient(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
	}{{"set", 2 * time.Second}, {"off", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			file, _ := sparseFile(t, testSize)
			s, addr := serve(t, file, func(s *Server) { s.UserTimeout = tc.timeout })
			c, _ := open(t, addr, false, false)
			if tc.name == "set" {
				assertUserTimeout(t, s, tc.timeout)
			}
			// 48 MiB of replies: far more than the two sockets buffer.
			// (The reader sends the replies of reads the page cache
			// answers itself, so it stops reading requests when one
			// cannot leave; a dead client can hold up to the connection's
			// budget, 64 MiB, when requests take the long way.)
			const n, size = 48, 1 << 20
			var b []byte
			for i := range n {
				b = append(b, encRequest(0, cmdRead, uint64(i), uint64(i)*size%testSize, size)...)
			}
			if err := c.write(b); err != nil {
				t.Fatal(err)
			}
			// The client reads nothing from now on: once the sockets'
			// buffers are full, a reply waits to be sent, holding its data.
			if !waitFor(10*time.Second, func() bool { return s.InFlightBytes() >= size }) {
				t.Fatalf("the server holds %d bytes for the stuck client, want a reply's", s.InFlightBytes())
			}
			if tc.timeout < 0 {
				time.Sleep(3 * time.Second)
				if s.InFlightBytes() == 0 {
					t.Fatal("released without a user timeout: the test shows nothing")
				}
				return
			}
			start := time.Now()
			if !waitFor(30*time.Second, func() bool { return s.InFlightBytes() == 0 }) {
				t.Fatalf("%d bytes still held %v after the client stopped reading", s.InFlightBytes(), time.Since(start))
			}
			t.Logf("released after %v", time.Since(start).Round(10*time.Millisecond))
		})
	}
}

// assertUserTimeout checks the option on the server's side of its one
// connection.
func assertUserTimeout(t *testing.T, s *Server, want time.Duration) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		tc, ok := c.nc.(*net.TCPConn)
		if !ok {
			t.Fatalf("connection is a %T", c.nc)
		}
		rc, err := tc.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var gerr error
		rc.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT) })
		if gerr != nil || time.Duration(got)*time.Millisecond != want {
			t.Fatalf("TCP_USER_TIMEOUT %d ms (%v), want %v", got, gerr, want)
		}
	}
}
