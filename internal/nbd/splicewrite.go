package nbd

import (
	"errors"
	"io"

	"golang.org/x/sys/unix"
)

// Big writes are spliced the other way: where the device offers
// block.SpliceWriter and the connection is plain TCP, a write with at
// least bigPayload bytes still to come from the socket is moved from the
// socket into a pipe (splice(2): references to the received pages, no
// copy) and from the pipe into the device, which moves it into the page
// cache — one copy instead of two, socket to buffer and buffer to page
// cache (bench/RESULTS.md, session 19: 1 MiB writes over loopback, 335–414
// against 257–357 µs of server CPU per MiB).
//
// The reader does this itself, since the payload must be off the socket
// before the next request can be read. A payload that fits the pipe
// (a 1 MiB one with whole-page fragments does) is all taken off the
// socket before the device sees any of it; then a new reader takes over
// and this goroutine writes and replies, as for any big write. A bigger
// one, or one the pipe holds in more slots than pages, is written in
// pieces as the pipe fills. The bytes the reader had buffered already are
// written from its buffer first. What the device does not take is read
// back from the pipe and written with WriteAt, which reports any error; after
// an error the rest of the payload is only taken off the socket.
//
// Until the whole payload is in, the device is given bytes only up to a
// sector boundary (sectorSize, of the device's offsets): a write whose
// client goes away mid-payload — never acknowledged — leaves, like a
// disk's, whole sectors new and the rest old, never a sector torn inside
// (databases and journals count on that). The tail waits in the pipe.
//
// FUA writes are not spliced (SpliceFrom never is FUA). A connection
// whose device took nothing from the pipe maxSpliceRefusals times in a
// row stops trying: its stack cannot splice (the volume wrappers offer
// SpliceFrom whatever lies below them), and the bytes would only be
// copied back out of the pipe.

const maxSpliceRefusals = 16

// sectorSize is the unit a write whose payload never all arrives is
// applied in (see above).
const sectorSize = 512

// errWouldWait: the socket has no bytes now, or the pipe no room.
var errWouldWait = errors.New("would wait")

// errPipeFull: spliceIn was to wait for the socket, but the socket has
// bytes: the pipe is what has no room.
var errPipeFull = errors.New("pipe full")

// splicedWrite is a write whose payload goes through a pipe.
type splicedWrite struct {
	p      *pipe
	off    int64 // where the bytes in the pipe go
	inPipe int   // bytes in the pipe
	err    error // the device's first error: later bytes are dropped
}

// whole is how many of n bytes that go at off end at a sector boundary
// (0 if none does).
func whole(off int64, n int) int {
	return max(0, n-int((off+int64(n))%sectorSize))
}

// writePipe returns a pipe for write req if its payload is to be spliced,
// else nil.
func (c *conn) writePipe(req request) *pipe {
	if c.spliceW == nil || c.sock == nil || req.flags&cflagFUA != 0 || req.length > MaxPayload ||
		int(req.length)-c.r.Buffered() < bigPayload || c.spliceRefused.Load() >= maxSpliceRefusals {
		return nil
	}
	if code, _ := c.check(req); code != 0 {
		return nil // refused as usual, after its payload is read
	}
	return getPipe()
}

// receiveSpliced takes write req's payload off the socket, into the
// device through w's pipe as far as the pipe cannot hold it. An error is
// the connection's (the device's goes to w.err); the pipe is then the
// caller's to close.
func (c *conn) receiveSpliced(req request, w *splicedWrite) error {
	n := int(req.length)
	if b := min(c.r.Buffered(), n); b > 0 {
		// More is to come (writePipe): the tail past the last sector
		// boundary waits in the (empty) pipe.
		buf, _ := c.r.Peek(b)
		a := whole(w.off, b)
		if a > 0 {
			w.err = c.dev.WriteAt(buf[:a], w.off, false)
			w.off += int64(a)
		}
		if a < b {
			if err := fillPipe(w.p.w, buf[a:b]); err != nil {
				return err
			}
			w.inPipe = b - a
		}
		c.r.Discard(b)
		n -= b
	}
	defer func() {
		if !c.sock.setLowat(1) {
			c.log.Warn("nbd: cannot reset the socket's receive low-water mark; closing the connection")
			c.shutdown()
		}
	}()
	for n > 0 {
		// Wait (for the rest of the payload at once: the low-water mark)
		// only when the pipe holds nothing the device may have yet; else
		// that goes to the device.
		wait := whole(w.off, w.inPipe) == 0
		if wait && !c.sock.setLowat(n) {
			return errors.New("cannot set the socket's receive low-water mark")
		}
		k, err := c.sock.spliceIn(w.p.w, n, wait)
		switch {
		case errors.Is(err, errWouldWait):
			if err := c.drain(w, whole(w.off, w.inPipe)); err != nil {
				return err
			}
		case errors.Is(err, errPipeFull):
			// Less than a sector fills every slot of the pipe: a client
			// sending tiny segments, each of which splice gives a slot
			// of its own. Gathered into one, the rest comes in.
			if err := gatherPipe(w.p, w.inPipe); err != nil {
				return err
			}
		case err != nil:
			return err
		default:
			n -= k
			w.inPipe += k
		}
	}
	return nil
}

// finishSpliced writes what is left in the pipe and replies.
func (c *conn) finishSpliced(req request, w *splicedWrite, cost int64) {
	if err := c.drain(w, w.inPipe); err != nil {
		w.p.close()
		c.log.Warn("nbd: a spliced write's pipe failed; closing the connection", "err", err)
		c.shutdown()
		c.sendErrorCost(req, errIO, cost, "write: %v", err)
		return
	}
	putPipe(w.p)
	c.send(c.result(req, w.err, cost))
}

// drain moves the first n bytes in the pipe into the device: what
// SpliceFrom takes, then the rest by WriteAt (after an error, nowhere).
// An error is the pipe's: its bytes could not be read back.
func (c *conn) drain(w *splicedWrite, n int) error {
	if n == 0 {
		return nil
	}
	if w.err == nil {
		k := c.spliceW.SpliceFrom(w.p.r, w.off, n)
		if k == 0 {
			c.spliceRefused.Add(1)
		} else {
			c.spliceRefused.Store(0)
		}
		w.off += int64(k)
		w.inPipe -= k
		n -= k
		if n == 0 {
			return nil
		}
	}
	buf := getBuf(n)
	defer putBuf(buf)
	if err := readPipe(w.p.r, buf); err != nil {
		return err
	}
	if w.err == nil {
		w.err = c.dev.WriteAt(buf, w.off, false)
	}
	w.off += int64(n)
	w.inPipe -= n
	return nil
}

// gatherPipe reads the n bytes in p, less than a sector, and writes them
// back: into one slot of the then empty pipe.
func gatherPipe(p *pipe, n int) error {
	buf := getBuf(n)
	defer putBuf(buf)
	if err := readPipe(p.r, buf); err != nil {
		return err
	}
	return fillPipe(p.w, buf)
}

// fillPipe writes p, less than a sector, into an empty pipe (which takes
// it at once: a pipe holds at least a page).
func fillPipe(fd int, p []byte) error {
	for len(p) > 0 {
		k, err := unix.Write(fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		p = p[k:]
	}
	return nil
}

// readPipe reads len(p) bytes the pipe is known to hold.
func readPipe(fd int, p []byte) error {
	for r := 0; r < len(p); {
		k, err := unix.Read(fd, p[r:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if k == 0 {
			return io.ErrUnexpectedEOF
		}
		r += k
	}
	return nil
}

// spliceIn moves up to n bytes from the socket into the pipe whose write
// end is to. With wait it waits for the socket to have some, but returns
// errPipeFull when the socket has some and the pipe no room; without, it
// returns errWouldWait when it would wait — or when the pipe is full.
func (s *socket) spliceIn(to, n int, wait bool) (int, error) {
	var k int
	var serr error
	full := false
	err := s.rc.Read(func(fd uintptr) bool {
		for {
			k, serr = rawSplice(int(fd), to, n, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			if serr != unix.EINTR {
				break
			}
		}
		if serr == unix.EAGAIN && wait {
			// Nothing to read, or no room in the pipe: waiting for a
			// socket that has bytes already would be for ever.
			if q, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil && q > 0 {
				full = true
				return true
			}
			return false // wait until readable, then again
		}
		return true
	})
	switch {
	case err != nil:
		return 0, err
	case full:
		return 0, errPipeFull
	case serr == unix.EAGAIN:
		return 0, errWouldWait
	case serr != nil:
		return 0, serr
	case k == 0:
		return 0, io.ErrUnexpectedEOF // the client closed mid-payload
	}
	return k, nil
}
