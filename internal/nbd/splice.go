package nbd

import (
	"io"
	"sync"
	"syscall"
	"unsafe"

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
// A client on this host gets the spliced bytes warm: before the reply is
// sent, the server reads them once (warm), which brings them into the
// CPUs' caches. Spliced, the client's copy out of the socket is the bytes'
// first touch since they came into the page cache, and its thread stalls
// on memory for all of them; a client that drives the volume from one
// thread (fio's nbd engine, QEMU's NBD driver) is bound by that copy, not
// by the server. Read first by the server, in parallel with the client's
// work on earlier replies, the bytes reach the client from the caches:
// bench/nbd.sh's 1 MiB reads over loopback went from 0.95 of nbdkit's
// rate to 1.06–1.28, for about 230 µs more server CPU per MiB, two
// thirds to three quarters of nbdkit's (bench/RESULTS.md, session 21).
// A remote client's copy does not share this host's caches, so its reads
// are spliced cold.
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
	if c.warm {
		p.warm(k)
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

// warmBufs hold what warm reads; it throws the bytes away, so one small
// buffer serves any number of reads and stays in the cache itself.
var warmBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// warm reads the n bytes at the head of the pipe without taking them out
// of it: tee(2) gives a second pipe references to the same pages, and the
// bytes are read out of that one. Warming is an optimisation: whatever
// fails, the pipe still holds its bytes (tee never takes them).
func (p *pipe) warm(n int) {
	t := getPipe()
	if t == nil {
		return
	}
	// Both pipes are non-blocking and t is empty with p's capacity, so
	// neither call can block: raw system calls (see socket.go).
	k, _, e := syscall.RawSyscall6(unix.SYS_TEE, uintptr(p.r), uintptr(t.w), uintptr(n), unix.SPLICE_F_NONBLOCK, 0, 0)
	if e != 0 || k == 0 {
		putPipe(t)
		return
	}
	b := warmBufs.Get().(*[]byte)
	left := int(k)
	for left > 0 {
		m, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(t.r), uintptr(unsafe.Pointer(&(*b)[0])), uintptr(min(left, len(*b))))
		if e == unix.EINTR {
			continue
		}
		if e != 0 || m == 0 {
			break
		}
		left -= int(m)
	}
	warmBufs.Put(b)
	if left > 0 {
		t.close()
	} else {
		putPipe(t)
	}
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
