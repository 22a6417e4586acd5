package nbd

import (
	"io"
	"net"
	"syscall"
)

// bigPayload: a write payload with at least this many bytes still to come
// from the socket is read with the receive low-water mark (readPayload).
const bigPayload = 256 << 10

// lowWater sets a TCP socket's receive low-water mark (SO_RCVLOWAT): the
// kernel wakes a reader waiting on the socket only once that many bytes are
// queued, instead of at every segment that arrives. Only the reader
// goroutine uses it.
type lowWater struct {
	rc  syscall.RawConn
	cur int // the mark now set; 1 is the kernel's default
}

// newLowWater returns nil unless nc is a plain TCP connection. Over TLS the
// mark would count record bytes, not payload bytes, and the TLS layer may
// already hold some of them: a mark set there could exceed what will come.
func newLowWater(nc net.Conn) *lowWater {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return &lowWater{rc: rc, cur: 1}
}

// set makes n the mark; false if the kernel refused.
func (w *lowWater) set(n int) bool {
	if n == w.cur {
		return true
	}
	var serr error
	if err := w.rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	}); err != nil || serr != nil {
		return false
	}
	w.cur = n
	return true
}

// readPayload reads a write's payload. A big one is read with the
// socket's low-water mark at the number of bytes still missing, so the
// reader sleeps until the payload is complete and wakes once, where it
// would otherwise wake and read at every 64 KiB segment (bench/RESULTS.md:
// 1 MiB writes went from 4.7 reads and 2.2 poller waits per request to
// 2.6 and 0.5, and a fifth less CPU).
//
// The mark must never exceed what the client still owes, or the reader
// would sleep for ever: it is recomputed from the bytes received before
// every read, and it is back at 1 before the reader waits for anything
// else (if that fails, the connection is closed rather than risked).
func (c *conn) readPayload(p []byte) error {
	if c.lowat == nil || len(p)-c.r.Buffered() < bigPayload {
		_, err := io.ReadFull(c.r, p)
		return err
	}
	defer func() {
		if !c.lowat.set(1) {
			c.log.Warn("nbd: cannot reset the socket's receive low-water mark; closing the connection")
			c.shutdown()
		}
	}()
	for got := 0; got < len(p); {
		// Bytes in the buffer are no wait; those beyond it are.
		if missing := len(p) - got - c.r.Buffered(); missing > 0 && !c.lowat.set(missing) {
			_, err := io.ReadFull(c.r, p[got:])
			return err
		}
		n, err := c.r.Read(p[got:])
		got += n
		if err != nil && got < len(p) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}
