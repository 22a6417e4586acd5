package nbd

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// bigPayload: a write payload with at least this many bytes still to come
// from the socket is read with the receive low-water mark (readPayload).
const bigPayload = 256 << 10

// socket is a connection's TCP socket, for what net.Conn does not offer:
// the receive low-water mark (SO_RCVLOWAT: the kernel wakes a reader
// waiting on the socket only once that many bytes are queued, instead of
// at every segment that arrives), used by the reader alone; sends with
// MSG_MORE, used under the write lock; and reads and writes without the
// runtime's system call bookkeeping (Read, Write: the connection's
// buffered reader and writer sit on them).
type socket struct {
	rc    syscall.RawConn
	lowat int // the mark now set; 1 is the kernel's default
}

// newSocket returns nil unless nc is a plain TCP connection. It must not be
// used under TLS: its writes would put bytes on the wire unencrypted, and the
// mark would count record bytes, not payload bytes, some of which the TLS
// layer may already hold — a mark that could exceed what will ever come.
func newSocket(nc net.Conn) *socket {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return &socket{rc: rc, lowat: 1}
}

// Read, Write, sendMore and the splices to and from pipes use raw system
// calls. The socket is non-blocking (the runtime's poller waits when it has
// nothing to give or no room), so a call never blocks, and the runtime's
// bookkeeping for one that might is pure cost: each call through net.Conn
// enters and leaves a "syscall" state, and the first after the process was
// idle wakes the runtime's monitor thread, which then polls every 20 µs
// for a while. On a host whose client shares the CPUs (a hypervisor, fio)
// those wake-ups preempt it: fio's 4 KiB random reads were preempted
// 1,000–5,000 times a second through net.Conn, 200–450 with these
// (bench/RESULTS.md, 2026-11-27).

// rawSplice is splice(2) between a pipe and the socket as a raw system
// call: both are non-blocking (SPLICE_F_NONBLOCK for the pipe), so it
// never blocks either (see Read).
func rawSplice(in, out, n, flags int) (int, error) {
	k, _, e := syscall.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, uintptr(n), uintptr(flags))
	if e != 0 {
		return 0, e
	}
	return int(k), nil
}

// Read reads what the socket holds, waiting in the poller if it is empty;
// io.EOF once the client has closed its side.
func (s *socket) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var serr error
	err := s.rc.Read(func(fd uintptr) bool {
		for {
			m, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch e {
			case 0:
				n = int(m)
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait until readable
			default:
				serr = e
			}
			return true
		}
	})
	switch {
	case err != nil:
		return 0, err
	case serr != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", serr)}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p, waiting in the poller while the socket has no
// room.
func (s *socket) Write(p []byte) (int, error) { return s.send(p, 0) }

// sendMore sends p with MSG_MORE: the kernel holds it to go out with the
// next send, which must follow at once.
func (s *socket) sendMore(p []byte) error {
	_, err := s.send(p, syscall.MSG_MORE)
	return err
}

// send sends all of p with flags, and MSG_NOSIGNAL (a peer gone is EPIPE,
// not a signal).
func (s *socket) send(p []byte, flags int) (int, error) {
	var n int
	var serr error
	err := s.rc.Write(func(fd uintptr) bool {
		for n < len(p) {
			m, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&p[n])), uintptr(len(p)-n),
				uintptr(flags|syscall.MSG_NOSIGNAL), 0, 0)
			switch e {
			case 0:
				n += int(m)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // wait until writable, then go on
			default:
				serr = e
				return true
			}
		}
		return true
	})
	switch {
	case err != nil:
		return n, err
	case serr != nil:
		return n, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("sendto", serr)}
	}
	return n, nil
}

// setLowat makes n the receive low-water mark; false if the kernel refused.
func (s *socket) setLowat(n int) bool {
	if n == s.lowat {
		return true
	}
	var serr error
	if err := s.rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	}); err != nil || serr != nil {
		return false
	}
	s.lowat = n
	return true
}

// setUserTimeout sets tc's TCP_USER_TIMEOUT (Server.UserTimeout). A
// kernel that refuses leaves the connection as it was: only the release
// of a dead client's connection is later.
func setUserTimeout(tc *net.TCPConn, d time.Duration) {
	if rc, err := tc.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
		})
	}
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
	if c.sock == nil || len(p)-c.r.Buffered() < bigPayload {
		_, err := io.ReadFull(c.r, p)
		return err
	}
	defer func() {
		if !c.sock.setLowat(1) {
			c.log.Warn("nbd: cannot reset the socket's receive low-water mark; closing the connection")
			c.shutdown()
		}
	}()
	for got := 0; got < len(p); {
		// Bytes in the buffer are no wait; those beyond it are.
		if missing := len(p) - got - c.r.Buffered(); missing > 0 && !c.sock.setLowat(missing) {
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

// onThisHost reports whether nc's peer is on this host: a loopback
// address, or the connection's own local address (a client that dialled
// one of the host's other addresses).
func onThisHost(nc net.Conn) bool {
	r, ok1 := nc.RemoteAddr().(*net.TCPAddr)
	l, ok2 := nc.LocalAddr().(*net.TCPAddr)
	return ok1 && ok2 && (r.IP.IsLoopback() || r.IP.Equal(l.IP))
}
