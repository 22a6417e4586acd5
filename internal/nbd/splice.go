package nbd

import (
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// Big reads are spliced: where the device offers block.Splicer (a stack
// whose bytes lie as they are in a file) and the connection is plain TCP,
// a read of spliceMin to pipeSize bytes is moved from the page cache into
// a pipe (splice(2), references to the cached pages, no copy), and from
// the pipe into the socket behind its reply header. The bytes are then
// copied once, into the client, instead of into a buffer and again into
// the socket (bench/RESULTS.md, session 18: 1 MiB reads over loopback,
// 380–395 against 157–183 µs of server CPU per MiB).
//
// The device moves the bytes into the pipe outside the write lock (it may
// wait for the disk there, as ReadAt would); the write lock covers only
// the pipe's move into the socket, which never waits for the disk. Bytes
// the device did not move (a layer that cannot splice part of the range)
// are read with ReadAt and sent after the spliced ones.
//
// Only a remote client's reads are spliced. A client on this host copies
// the bytes out of the socket itself, and behind a splice that copy is
// their first touch since they came into the page cache: its thread
// stalls on memory for all of them, and a client that drives the volume
// from one thread (fio's nbd engine, QEMU's NBD driver) is bound by it.
// Reading the bytes once in the server first (tee(2) into a second pipe)
// took 1 MiB reads over loopback from 0.95 of nbdkit's rate to 1.06–1.28
// on kernel 6.18 (bench/RESULTS.md, session 21); on 6.18.44 splicing lost
// either way (0.36 cold, 0.49 warmed) while copying — read into a
// buffer, written to the socket, as nbdkit does — made 1.19–1.21, for
// less server CPU than nbdkit's (session 27). Over a network the NIC
// reads the spliced pages itself, and no CPU copies them on either side.
//
// A pipe with bytes in it is never reused: one whose reply was not sent
// whole is closed. Idle empty pipes are kept (up to maxIdlePipes), since
// making one and sizing it is three system calls.

const (
	spliceMin    = largeReply
	pipeSize     = 1 << 20
	pageSize     = 4096 // a pipe holds whole pages, one per slot
	maxIdlePipes = 16
)

type pipe struct{ r, w int }

var pipes struct {
	mu   sync.Mutex
	idle []*pipe
	live int  // pipes open, idle or in use
	off  bool // pipes of pipeSize cannot be had here: no more splicing
}

// getPipe returns an empty pipe with room for pipeSize bytes, or nil.
func getPipe() *pipe {
	pipes.mu.Lock()
	defer pipes.mu.Unlock()
	if n := len(pipes.idle); n > 0 {
		p := pipes.idle[n-1]
		pipes.idle = pipes.idle[:n-1]
		return p
	}
	if pipes.off {
		return nil
	}
	var fds [2]int
	// Non-blocking: a device that moved more than the pipe holds would
	// see EAGAIN (and leave the rest to ReadAt) rather than wait for ever.
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil
	}
	if sz, err := unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, pipeSize); err != nil || sz < pipeSize {
		unix.Close(fds[0])
		unix.Close(fds[1])
		// Refused with none of ours open: a limit of the host
		// (fs.pipe-max-size, or the user's pipe pages), not of the
		// moment.
		pipes.off = pipes.live == 0
		return nil
	}
	pipes.live++
	return &pipe{r: fds[0], w: fds[1]}
}

// putPipe keeps an empty pipe for reuse.
func putPipe(p *pipe) {
	pipes.mu.Lock()
	if len(pipes.idle) < maxIdlePipes {
		pipes.idle = append(pipes.idle, p)
		p = nil
	}
	pipes.mu.Unlock()
	if p != nil {
		p.close()
	}
}

// close closes a pipe, with whatever it holds.
func (p *pipe) close() {
	unix.Close(p.r)
	unix.Close(p.w)
	pipes.mu.Lock()
	pipes.live--
	pipes.mu.Unlock()
}

// splices reports whether a read of n bytes is to be spliced.
func (c *conn) splices(n uint32) bool {
	return c.splicer != nil && c.sock != nil && n >= spliceMin && n <= pipeSize
}

// spliceRead moves the bytes of a read into a pipe and returns its reply,
// or nil (nothing to send yet: the caller reads as usual). The bytes the
// device did not move are read into a buffer: with nowait (the reader)
// by TryReadAt, or the reply is nil; otherwise by ReadAt, whose error is
// returned.
func (c *conn) spliceRead(req request, cost int64, nowait bool) (*reply, error) {
	p := getPipe()
	if p == nil {
		return nil, nil
	}
	off, n := int64(req.offset), int(req.length)
	// A pipe holds pipeSize/pageSize pages, and a range not aligned to
	// pages spans one more than its length: what does not fit is the rest.
	room := pipeSize - int(off%pageSize)
	k := c.splicer.SpliceTo(p.w, off, min(n, room), nowait)
	if k == 0 {
		putPipe(p)
		return nil, nil
	}
	var rest []byte
	if k < n {
		rest = getBuf(n - k)
		if nowait {
			if !c.nowait.TryReadAt(rest, off+int64(k)) {
				putBuf(rest)
				p.close()
				return nil, nil
			}
		} else if err := c.dev.ReadAt(rest, off+int64(k)); err != nil {
			putBuf(rest)
			p.close()
			return nil, err
		}
	}
	r := &reply{simple: !c.structured, req: req, data: rest, pooled: rest != nil,
		pipe: p, piped: k, cost: cost}
	if c.structured {
		r.typ, r.offset = replyTypeOffsetData, req.offset
	}
	return r, nil
}

// releasePipe returns a sent reply's pipe for reuse, or closes it if the
// reply did not go out whole.
func (r *reply) releasePipe() {
	if r.pipe == nil {
		return
	}
	if r.piped == 0 {
		putPipe(r.pipe)
	} else {
		r.pipe.close()
	}
	r.pipe = nil
}

// splice moves n bytes from the pipe whose read end is from into the
// socket; with more, the kernel holds them for the send that follows.
func (s *socket) splice(from, n int, more bool) error {
	flags := unix.SPLICE_F_MOVE | unix.SPLICE_F_NONBLOCK
	if more {
		flags |= unix.SPLICE_F_MORE
	}
	var serr error
	err := s.rc.Write(func(fd uintptr) bool {
		for n > 0 {
			k, err := rawSplice(from, int(fd), n, flags)
			switch {
			case err == unix.EAGAIN:
				return false // wait until writable, then go on
			case err == unix.EINTR:
				continue
			case err != nil:
				serr = err
				return true
			case k == 0:
				serr = io.ErrUnexpectedEOF // the pipe held less than it should
				return true
			}
			n -= int(k)
		}
		return true
	})
	if err != nil {
		return err
	}
	return serr
}
