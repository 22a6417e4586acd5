package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/block"
)

const (
	readBufSize  = 64 << 10
	writeBufSize = 256 << 10
	// handshakeBufSize sizes both buffers until an export is chosen
	// (growBuffers): a connection that never gets that far — anyone can
	// open thousands, unauthenticated, each for HandshakeTimeout — would
	// otherwise hold 320 KiB of transmission buffers doing nothing.
	handshakeBufSize = 4 << 10
	// largeReply: payloads this big bypass the write buffer (writev).
	largeReply = 64 << 10
	// nowaitMax: reads up to this size are tried in the reader goroutine
	// (readNow); a bigger one would hold up the requests behind it.
	nowaitMax = 2 << 20
)

// conn is one client connection.
type conn struct {
	srv *Server
	raw net.Conn // the accepted connection; never changes (shutdown closes it)
	nc  net.Conn // raw, or the TLS connection over it after STARTTLS (conn goroutine only)
	r   *bufio.Reader
	w   *bufio.Writer
	log *slog.Logger

	tls          bool
	fixed        bool // the client set NBD_FLAG_C_FIXED_NEWSTYLE
	noZeroes     bool
	structured   bool
	metaSelected bool
	metaExport   string
	openFailures int // INFO and GO that Exports.Open refused (handshake.go)
	// hsSlot is set while the connection holds one of the server's
	// handshake slots (MaxHandshakes; handshakelimit.go).
	hsSlot atomic.Bool

	exp     *Export
	dev     block.Device
	nowait  block.NoWaitReader // dev, when it offers reads without waiting
	splicer block.Splicer      // dev, when it can splice reads (used with sock only: splice.go)
	spliceW block.SpliceWriter // dev, when it can splice writes (splicewrite.go)
	// spliceRefused counts the spliced writes in a row the device took
	// nothing of (splicewrite.go).
	spliceRefused atomic.Int32
	sock          *socket // nil unless plain TCP (nil after STARTTLS)
	local         bool    // the client is on this host: reads are copied, not spliced (splice.go)
	size          uint64
	flags         uint16
	pending       bool      // the reader queued replies it has not flushed (reader only)
	watch         *watchdog // guards the reader while it runs a write (watchdog.go)
	stats         *Stats    // the export's counts (nil: none); set before transmission
	// stopped is set when the server ends the connection (shutdown,
	// quiesce): the reader starts no request after it. (Among the
	// reader's fields: it loads it for every request.)
	stopped atomic.Bool

	budget   *budget
	total    *serverBudget // the server's budget (nil: none)
	inflight sync.WaitGroup
	// Replies are written by the goroutine that produced them, under wmu.
	// waiting counts goroutines queued for wmu: the last one of a convoy
	// flushes, so replies finishing together share system calls, and no
	// reply waits in the buffer for a request still running.
	wmu     sync.Mutex
	waiting atomic.Int32
	werr    error // first write error (under wmu)

	// tlsc is the TLS connection once its handshake is done (nil without
	// TLS): shutdown, run by any goroutine, ends its session through it.
	tlsc atomic.Pointer[tls.Conn]
	// draining is set by quiesce (Server.Shutdown): the connection ends once
	// its requests in flight are answered.
	draining atomic.Bool

	closeOnce sync.Once
	done      chan struct{}
	// ctx is cancelled by shutdown and quiesce: calls made for the
	// connection (Exports.Open) end with it, so Server.Close need not
	// wait for them.
	ctx    context.Context
	cancel context.CancelFunc
}

const (
	// closeNotifyWait bounds how long shutdown tries to end a TLS session
	// cleanly (wait for a reply being written, send close_notify) before
	// it closes the socket regardless.
	closeNotifyWait = time.Second
	// lingerTimeout bounds how long a drained connection waits for the
	// client to take the replies still queued in the socket (linger).
	lingerTimeout = time.Second
)

// errStopped ends a session the server stopped (Shutdown, Close,
// revocation): not an error to log.
var errStopped = errors.New("connection stopped by the server")

// errTLSClosed is the connection's write error once close_notify went
// out: nothing may follow it.
var errTLSClosed = errors.New("TLS session closed")

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		srv:   s,
		raw:   nc,
		nc:    nc,
		sock:  newSocket(nc),
		local: !s.spliceLocal && onThisHost(nc),
		// Set before the connection is tracked (Server.track, under its
		// lock), so whoever finds it there sees it.
		budget: newBudget(s.MaxInFlight, s.MaxInFlightBytes),
		total:  s.total,
		log:    s.Log.With("remote", nc.RemoteAddr().String()),
		done:   make(chan struct{}),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	var rw io.ReadWriter = nc
	if c.sock != nil {
		rw = c.sock
	}
	c.r, c.w = bufio.NewReaderSize(rw, handshakeBufSize), bufio.NewWriterSize(rw, handshakeBufSize)
	return c
}

// growBuffers gives a connection that has chosen its export the
// transmission's buffers. The handshake flushed every reply, so the
// writer holds nothing. The reader is kept if it holds bytes (a client
// that sent requests before it read GO's reply): they cannot be moved
// into a new one without a wrapper under it, which the reads that bypass
// it (readPayload, spliceIn) must not have; such a connection reads its
// requests in smaller batches, nothing worse.
func (c *conn) growBuffers() {
	var rw io.ReadWriter = c.nc
	if c.sock != nil {
		rw = c.sock
	}
	if c.r.Buffered() == 0 {
		c.r = bufio.NewReaderSize(rw, readBufSize)
	}
	c.wmu.Lock()
	if c.w.Buffered() == 0 {
		c.w = bufio.NewWriterSize(rw, writeBufSize)
	}
	c.wmu.Unlock()
}

// shutdown closes the connection; the reader then ends the session. It
// may be called from any goroutine, any number of times. A TLS session
// is shut down first (closeTLS): the spec wants a party that drops the
// connection to shut TLS down first, and without close_notify a client
// cannot tell the end of the session from a truncation. That is bounded:
// a reply being written to a client that reads nothing, or the alert
// itself, is cut short by closing the socket after closeNotifyWait.
func (c *conn) shutdown() {
	c.closeOnce.Do(func() {
		c.stopped.Store(true)
		close(c.done)
		c.cancel()
		if c.tlsc.Load() != nil {
			t := time.AfterFunc(closeNotifyWait, func() { c.raw.Close() })
			c.closeTLS()
			t.Stop()
		}
		c.raw.Close()
	})
}

// quiesce asks the connection to end once the requests it has started are
// answered (Server.Shutdown): the reader starts no more, and its wait for
// the client (or the handshake's, or a TLS handshake's) ends now. An
// Exports.Open under way is cancelled.
func (c *conn) quiesce() {
	c.draining.Store(true)
	c.stopped.Store(true)
	c.cancel()
	// After the flags: whoever resets the deadline (the handshake, as it
	// ends) checks them after it did so.
	c.raw.SetReadDeadline(time.Now())
}

func (c *conn) run() {
	defer c.shutdown()
	defer func() {
		if c.draining.Load() {
			c.closeTLS()
			c.linger()
		}
	}()
	exp, err := c.handshake()
	// The slot is for the handshake only: a connection in transmission
	// holds none, whatever the handshake's outcome.
	c.releaseHandshake()
	if err != nil {
		if !errors.Is(err, errAbort) && !errors.Is(err, io.EOF) && !c.stopped.Load() {
			c.log.Info("nbd handshake ended", "err", err)
		}
		return
	}
	defer release(exp)
	if c.stopped.Load() {
		// Stopped as the handshake ended, which may have reset the read
		// deadline quiesce had set.
		return
	}
	c.growBuffers()
	c.exp, c.dev, c.size, c.stats = exp, exp.Device, uint64(exp.Device.Size()), exp.Stats
	c.nowait, _ = exp.Device.(block.NoWaitReader)
	if !c.local {
		c.splicer, _ = exp.Device.(block.Splicer)
	}
	c.spliceW, _ = exp.Device.(block.SpliceWriter)
	c.flags = c.transmissionFlags(exp)
	if exp.Revoked != nil {
		go func() {
			select {
			case <-exp.Revoked:
				c.log.Info("nbd export revoked; closing connection", "export", exp.LogName)
				c.shutdown()
			case <-c.done:
			}
		}()
	}
	c.log.Debug("nbd transmission", "export", exp.LogName, "size", c.size, "flags", c.flags, "structured", c.structured)
	// DISC (err nil) is the spec's soft disconnect: shutdown then ends
	// the TLS session, as after any other end.
	err = c.transmit()
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !c.stopped.Load() {
		c.log.Info("nbd connection ended", "export", exp.LogName, "err", err)
	}
}

// closeTLS shuts the TLS session down (sends close_notify), as the spec
// requires before the server closes the socket after DISC, and asks
// before any disconnect the server initiates (and as TLS expects after
// the client's close_notify following ABORT): without it the client
// cannot tell the end of the session from a truncation. The caller then
// closes the socket.
//
// It takes the write lock, so the alert follows whole replies, and
// writes nothing once a write has failed: the stream may end inside a
// record, and an alert after it would be garbage. Nothing is written
// after it. crypto/tls bounds the alert's write at 5 seconds; shutdown
// cuts the wait for the lock and for the alert short (closeNotifyWait).
func (c *conn) closeTLS() {
	tc := c.tlsc.Load()
	if tc == nil {
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return
	}
	c.werr = errTLSClosed
	if err := tc.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
		c.log.Debug("nbd: TLS close_notify not sent", "err", err)
	}
}

// linger ends a drained connection's stream without losing its tail. The
// client may have sent requests the server no longer reads, and closing a
// socket with unread input makes the kernel reset the connection, which
// drops what it has not sent yet: the last replies, to a client slow to
// read them. So while the socket still holds bytes the client has not
// acknowledged, it half-closes (the client reads the replies, then the
// end) and waits, discarding input, until the client has them all or
// closes, or for lingerTimeout at most (Server.Shutdown's own limit
// closes the socket sooner).
func (c *conn) linger() {
	tc, ok := c.raw.(*net.TCPConn)
	if !ok {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil || unacked(rc) == 0 {
		return
	}
	if tc.CloseWrite() != nil {
		return
	}
	deadline := time.Now().Add(lingerTimeout)
	var buf [4096]byte
	for unacked(rc) > 0 && time.Now().Before(deadline) {
		tc.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := tc.Read(buf[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return // the client closed (or the socket was)
		}
	}
}

// unacked returns how many bytes (and FIN) the socket has sent or queued
// that the peer has not acknowledged yet (SIOCOUTQ; 0 if unknown).
func unacked(rc syscall.RawConn) int {
	var n int
	rc.Control(func(fd uintptr) {
		n, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
	})
	return n
}

// transmit serves requests until DISC or an error, then waits for the
// requests in flight.
func (c *conn) transmit() error {
	ended := make(chan error, 1)
	c.watch = newWatchdog(func() { go c.readRequests(ended) })
	c.readRequests(ended)
	err := <-ended
	c.inflight.Wait()
	// Replies still buffered go out now: the reader flushes only before
	// it would wait, and it did not wait for a DISC that came with the
	// requests before it. (After DISC the spec wants every reply sent,
	// and closeTLS then tells the client the stream ended whole.)
	c.wmu.Lock()
	if c.werr == nil {
		c.werr = c.w.Flush()
	}
	c.wmu.Unlock()
	return err
}

// readRequests holds the reader's role: it reads requests and starts each
// within the connection's budget, until DISC or an error, which it sends
// to ended. Reads the device can answer at once it runs itself (readNow);
// others run in a goroutine of their own. Small writes it runs itself too
// (writeNow; watchdog.go takes over if one is slow). Any other write is
// run by the goroutine that read its payload, which hands the reader's
// role to a new goroutine first: the payload is still in this CPU's cache
// when it is copied into the page cache (handing a 1 MiB payload to
// another goroutine instead cost a third more CPU per write, the copies
// running from another CPU's cache). A big write whose device can take it
// from a pipe is spliced instead (splicewrite.go), and handed over the
// same way once its payload is off the socket.
func (c *conn) readRequests(ended chan<- error) {
	var hdr [requestSize]byte
	for {
		c.flushBeforeWait(requestSize)
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			ended <- err
			return
		}
		req, ok := parseRequest(hdr[:])
		if !ok {
			ended <- fmt.Errorf("bad request magic %#x", be.Uint32(hdr[:4]))
			return
		}
		if c.stats != nil {
			req.start = since()
		}
		if req.typ == cmdDisc {
			ended <- nil // transmit finishes the requests in flight
			return
		}
		if c.stopped.Load() { // the server is ending the connection
			ended <- errStopped
			return
		}
		var cost int64
		var payload []byte
		var wp *pipe // a big write's payload is spliced through it (splicewrite.go)
		if req.typ == cmdWrite {
			wp = c.writePipe(req)
		}
		switch {
		case req.typ == cmdWrite && req.length > MaxPayload:
			// Stay in sync without holding the payload, then refuse.
			c.flushBeforeWait(int(req.length))
			if _, err := io.CopyN(io.Discard, c.r, int64(req.length)); err != nil {
				ended <- err
				return
			}
			c.acquire(0)
			c.inflight.Add(1)
			c.sendError(req, errInval, "write of %d bytes exceeds the maximum payload of %d", req.length, MaxPayload)
			continue
		case wp != nil:
			cost = int64(req.length)
			if !c.acquire(cost) {
				putPipe(wp)
				ended <- errStopped
				return
			}
			c.flushBeforeWait(int(req.length))
			w := &splicedWrite{p: wp, off: int64(req.offset)}
			if err := c.receiveSpliced(req, w); err != nil {
				wp.close()
				c.release(cost)
				ended <- err
				return
			}
			c.inflight.Add(1)
			go c.readRequests(ended)
			c.finishSpliced(req, w, cost)
			return
		case req.typ == cmdWrite:
			cost = int64(req.length)
			if !c.acquire(cost) {
				ended <- errStopped
				return
			}
			payload = getBuf(int(req.length))
			c.flushBeforeWait(len(payload))
			if err := c.readPayload(payload); err != nil {
				putBuf(payload)
				c.release(cost)
				ended <- err
				return
			}
			c.inflight.Add(1)
			if c.writeNow(req) {
				if c.runWrite(req, payload, cost) {
					continue
				}
				return // a new reader took over during a slow write
			}
			go c.readRequests(ended)
			c.handle(req, payload, cost)
			return
		case req.typ == cmdRead && req.length <= MaxPayload:
			cost = int64(req.length)
			if !c.acquire(cost) {
				ended <- errStopped
				return
			}
			if c.readNow(req, cost) {
				continue
			}
		default:
			c.acquire(0)
		}
		c.inflight.Add(1)
		go c.handle(req, payload, cost)
	}
}

// readNow runs a read in the reader goroutine if the device can answer it
// without waiting (block.NoWaitReader: for a file, a page-cache hit),
// saving the hand-off to a goroutine. Its reply is written to the buffer
// but not flushed: the reader flushes before it next waits for the
// client, so a burst of such reads is answered with one write.
func (c *conn) readNow(req request, cost int64) bool {
	if c.nowait == nil || req.length > nowaitMax {
		return false
	}
	if code, _ := c.check(req); code != 0 {
		return false
	}
	if c.splices(req.length) {
		if r, _ := c.spliceRead(req, cost, true); r != nil {
			c.inflight.Add(1)
			c.answer(r, false)
			c.pending = true
			return true
		}
	}
	buf := getBuf(int(req.length))
	if !c.nowait.TryReadAt(buf, int64(req.offset)) {
		putBuf(buf)
		return false
	}
	c.inflight.Add(1)
	c.answer(c.readReply(req, buf, cost), false)
	c.pending = true
	return true
}

// flushBeforeWait flushes the replies readNow queued unless the next need
// bytes from the client are already buffered (reading them cannot wait).
func (c *conn) flushBeforeWait(need int) {
	if !c.pending || c.r.Buffered() >= need {
		return
	}
	c.flushPending()
}

// acquire takes a request's place in the connection's budget, then
// charges its payload to the server's (serverbudget.go). If it has to
// wait for requests in flight to finish, the replies already queued go
// out first: a reply the reader queued must not wait for a slow request
// it has nothing to do with. It returns false, holding nothing, if the
// connection was shut down while it waited for the server's budget.
func (c *conn) acquire(cost int64) bool {
	if !c.budget.tryAcquire(cost) {
		if c.pending {
			c.flushPending()
		}
		c.budget.acquire(cost)
	}
	if cost == 0 || c.total == nil || c.total.tryAcquire(cost) {
		return true
	}
	if c.pending {
		c.flushPending()
	}
	if c.total.acquire(cost, c.done) {
		return true
	}
	c.budget.release(cost)
	return false
}

// release gives back what acquire took for a request of cost bytes: the
// server's charge first, then the connection's place.
func (c *conn) release(cost int64) {
	if cost != 0 && c.total != nil {
		c.total.release(cost)
	}
	c.budget.release(cost)
}

// flushPending flushes the replies readNow (or a writer that left the
// flush to it) queued.
func (c *conn) flushPending() {
	c.pending = false
	c.wmu.Lock()
	if c.werr == nil {
		c.werr = c.w.Flush()
	}
	failed := c.werr != nil
	c.wmu.Unlock()
	if failed {
		c.shutdown()
	}
}

// handle runs one request and queues its reply. The budget slot taken by
// the reader is released once the reply has been written.
func (c *conn) handle(req request, payload []byte, cost int64) {
	if payload != nil {
		defer putBuf(payload)
	}
	code, msg := c.check(req)
	if code != 0 {
		c.sendErrorCost(req, code, cost, "%s", msg)
		return
	}
	fua := req.flags&cflagFUA != 0
	off, n := int64(req.offset), int64(req.length)
	var err error
	switch req.typ {
	case cmdRead:
		if c.splices(req.length) {
			var r *reply
			if r, err = c.spliceRead(req, cost, false); r != nil {
				c.send(r)
				return
			}
			if err != nil {
				break
			}
		}
		buf := getBuf(int(n))
		if err = c.dev.ReadAt(buf, off); err != nil {
			putBuf(buf)
			break
		}
		c.sendRead(req, buf, cost)
		return
	case cmdWrite:
		err = c.dev.WriteAt(payload, off, fua)
	case cmdFlush:
		err = c.dev.Flush()
	case cmdTrim:
		if n > 0 {
			err = c.dev.Trim(off, n, fua)
		}
	case cmdWriteZeroes:
		if n > 0 {
			err = c.dev.WriteZeroes(off, n, block.ZeroFlags{
				NoHole: req.flags&cflagNoHole != 0, Fast: req.flags&cflagFastZero != 0, FUA: fua})
		}
	case cmdCache:
		// Advisory; the page cache already does what a file can do.
	case cmdBlockStatus:
		c.sendBlockStatus(req, cost)
		return
	}
	c.send(c.result(req, err, cost))
}

// write runs a write and returns its reply.
func (c *conn) write(req request, payload []byte, cost int64) *reply {
	if code, msg := c.check(req); code != 0 {
		return c.errorReply(req, code, cost, "%s", msg)
	}
	return c.result(req, c.dev.WriteAt(payload, int64(req.offset), false), cost)
}

// result is the reply to a command without data: done, or its error.
func (c *conn) result(req request, err error, cost int64) *reply {
	if err == nil {
		return &reply{simple: true, req: req, cost: cost}
	}
	code := errnoOf(req, err)
	if code == errIO {
		c.log.Warn("nbd I/O error", "export", c.exp.LogName, "cmd", commandName(req.typ), "offset", req.offset, "length", req.length, "err", err)
	}
	return c.errorReply(req, code, cost, "%s failed: %v", commandName(req.typ), err)
}

// allowedFlags lists the command flags valid per command.
var allowedFlags = map[uint16]uint16{
	cmdRead:        cflagFUA | cflagDF,
	cmdWrite:       cflagFUA,
	cmdFlush:       cflagFUA,
	cmdTrim:        cflagFUA,
	cmdCache:       cflagFUA,
	cmdWriteZeroes: cflagFUA | cflagNoHole | cflagFastZero,
	cmdBlockStatus: cflagFUA | cflagReqOne,
}

// check validates a request against the negotiated session; it returns a
// non-zero NBD error and a message for an invalid one.
func (c *conn) check(req request) (uint32, string) {
	allowed, known := allowedFlags[req.typ]
	if !known {
		return errInval, fmt.Sprintf("unknown command %d", req.typ)
	}
	if req.flags&^allowed != 0 {
		return errInval, fmt.Sprintf("flags %#x not valid for %s", req.flags&^allowed, commandName(req.typ))
	}
	if req.flags&cflagFUA != 0 && c.flags&tflagSendFUA == 0 {
		return errInval, "FUA was not negotiated"
	}
	if req.flags&cflagDF != 0 && !c.structured {
		return errInval, "DF requires structured replies"
	}
	if req.flags&cflagFastZero != 0 && c.flags&tflagSendFastZero == 0 {
		return errInval, "FAST_ZERO was not negotiated"
	}
	ro := c.flags&tflagReadOnly != 0
	beyond := req.offset > c.size || uint64(req.length) > c.size-req.offset
	switch req.typ {
	case cmdRead:
		if req.length > MaxPayload {
			// The spec keeps EOVERFLOW for a read that asked not to be
			// fragmented (DF); any other oversized read is EINVAL.
			code := uint32(errInval)
			if req.flags&cflagDF != 0 {
				code = errOverflow
			}
			return code, fmt.Sprintf("read of %d bytes exceeds the maximum payload of %d", req.length, MaxPayload)
		}
		if beyond {
			return errInval, "read beyond the end of the export"
		}
	case cmdWrite, cmdWriteZeroes:
		if ro {
			return errPerm, "export is read-only"
		}
		if req.typ == cmdWriteZeroes && c.flags&tflagSendZeroes == 0 {
			return errInval, "WRITE_ZEROES not supported"
		}
		if beyond {
			return errNoSpc, "write beyond the end of the export"
		}
	case cmdTrim:
		if ro {
			return errPerm, "export is read-only"
		}
		if c.flags&tflagSendTrim == 0 {
			return errInval, "TRIM not supported"
		}
		if beyond {
			return errInval, "trim beyond the end of the export"
		}
	case cmdFlush:
		if c.flags&tflagSendFlush == 0 {
			return errInval, "FLUSH not supported"
		}
	case cmdCache:
		if beyond {
			return errInval, "cache beyond the end of the export"
		}
	case cmdBlockStatus:
		if !c.structured || !c.metaSelected {
			return errInval, "BLOCK_STATUS needs a metadata context (SET_META_CONTEXT base:allocation)"
		}
		if beyond {
			return errInval, "block status beyond the end of the export"
		}
		if req.length == 0 {
			return errInval, "block status of zero length"
		}
	}
	return 0, ""
}

// errnoOf maps a device error in answer to req to an NBD error value.
// The spec keeps ENOTSUP for a WRITE_ZEROES with FAST_ZERO that would not
// be fast; any other operation the device cannot do is EINVAL.
func errnoOf(req request, err error) uint32 {
	switch {
	case errors.Is(err, block.ErrReadOnly), errors.Is(err, syscall.EROFS):
		// A backing file system turned read-only refuses the write as a
		// read-only export would (nbdkit answers alike).
		return errPerm
	case errors.Is(err, block.ErrNotSupported):
		if req.typ == cmdWriteZeroes && req.flags&cflagFastZero != 0 {
			return errNotSup
		}
		return errInval
	case errors.Is(err, block.ErrOutOfRange):
		return errInval
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EFBIG):
		return errNoSpc
	case errors.Is(err, block.ErrClosed):
		return errShutdown
	}
	return errIO
}

func (c *conn) sendBlockStatus(req request, cost int64) {
	exts, err := c.dev.Extents(int64(req.offset), int64(req.length))
	if err != nil || len(exts) == 0 {
		// The spec allows "status unknown" (0) for the whole range.
		exts = []block.Extent{{Length: int64(req.length)}}
	}
	if exts[0].Length <= 0 { // a device breaking its contract: say "unknown"
		exts = []block.Extent{{Length: int64(req.length)}}
	}
	reqOne := req.flags&cflagReqOne != 0
	payload := make([]byte, 4, 4+8*min(len(exts), maxExtentsPerReply))
	be.PutUint32(payload, metaContextID)
	remaining := int64(req.length)
	for _, e := range exts {
		if remaining <= 0 || len(payload) >= 4+8*maxExtentsPerReply {
			break
		}
		l := min(e.Length, remaining) // fits the 32-bit field: remaining <= req.length
		if l <= 0 {
			break
		}
		var st uint32
		if e.Hole {
			st |= stateHole
		}
		if e.Zero {
			st |= stateZero
		}
		payload = be.AppendUint32(payload, uint32(l))
		payload = be.AppendUint32(payload, st)
		remaining -= l
		if reqOne {
			break
		}
	}
	c.send(&reply{req: req, typ: replyTypeBlockStatus, extra: payload, cost: cost})
}

func (c *conn) sendRead(req request, data []byte, cost int64) {
	c.send(c.readReply(req, data, cost))
}

// readReply is the reply carrying a read's data (a pooled buffer).
func (c *conn) readReply(req request, data []byte, cost int64) *reply {
	if !c.structured {
		return &reply{simple: true, req: req, data: data, pooled: true, cost: cost}
	}
	if len(data) == 0 { // OFFSET_DATA must carry a byte: an empty read is just done
		putBuf(data)
		return &reply{req: req, typ: replyTypeNone, cost: cost}
	}
	return &reply{req: req, typ: replyTypeOffsetData, offset: req.offset, data: data, pooled: true, cost: cost}
}

func (c *conn) sendError(req request, code uint32, format string, a ...any) {
	c.sendErrorCost(req, code, 0, format, a...)
}

// sendErrorCost sends an error reply (errorReply).
func (c *conn) sendErrorCost(req request, code uint32, cost int64, format string, a ...any) {
	c.send(c.errorReply(req, code, cost, format, a...))
}

// errorReply is an error reply: structured (with a message) when
// negotiated, else simple.
func (c *conn) errorReply(req request, code uint32, cost int64, format string, a ...any) *reply {
	if !c.structured {
		return &reply{simple: true, req: req, errno: code, cost: cost}
	}
	msg := message(format, a...)
	p := make([]byte, 6, 6+len(msg))
	be.PutUint32(p, code)
	be.PutUint16(p[4:], uint16(len(msg)))
	return &reply{req: req, typ: replyTypeError, extra: append(p, msg...), cost: cost}
}

// reply is one reply to send.
type reply struct {
	simple bool
	req    request // what it answers
	errno  uint32  // simple replies
	typ    uint16  // structured replies (always the final chunk)
	offset uint64  // replyTypeOffsetData: the data's offset
	extra  []byte  // other structured payload before data
	data   []byte
	pooled bool  // data came from getBuf
	pipe   *pipe // a spliced read's bytes, sent before data (splice.go)
	piped  int   // how many bytes pipe holds
	cost   int64
}

// send writes a reply, flushing unless another is queued behind it, and
// releases what its request held.
func (c *conn) send(r *reply) { c.answer(r, true) }

// answer writes r and releases what its request held; with flush, the
// last of the goroutines queued to write flushes the buffer.
func (c *conn) answer(r *reply, flush bool) {
	c.waiting.Add(1)
	c.wmu.Lock()
	c.waiting.Add(-1)
	if c.werr == nil {
		c.werr = c.writeReply(r)
	}
	if flush && c.werr == nil && c.waiting.Load() == 0 {
		c.werr = c.w.Flush()
	}
	failed := c.werr != nil
	c.wmu.Unlock()
	if c.stats != nil && !failed {
		c.stats.answered(r)
	}
	if r.pooled {
		putBuf(r.data)
	}
	r.releasePipe()
	c.release(r.cost)
	c.inflight.Done()
	if failed {
		c.shutdown() // unblock the reader; the session is over
	}
}

func (c *conn) writeReply(r *reply) error {
	var hdr [28]byte
	h := hdr[:16]
	if r.simple {
		be.PutUint32(hdr[0:], magicSimple)
		be.PutUint32(hdr[4:], r.errno)
		be.PutUint64(hdr[8:], r.req.cookie)
	} else {
		be.PutUint32(hdr[0:], magicStructured)
		be.PutUint16(hdr[4:], replyFlagDone)
		be.PutUint16(hdr[6:], r.typ)
		be.PutUint64(hdr[8:], r.req.cookie)
		h = hdr[:20]
		if r.typ == replyTypeOffsetData {
			be.PutUint64(hdr[20:], r.offset)
			h = hdr[:28]
		}
		be.PutUint32(hdr[16:], uint32(len(h)-20+len(r.extra)+r.piped+len(r.data)))
	}
	if r.piped > 0 {
		// A spliced read (only ever on plain TCP, no extra): the header
		// held back for the bytes from the pipe, then any rest.
		if err := c.w.Flush(); err != nil {
			return err
		}
		if err := c.sock.sendMore(h); err != nil {
			return err
		}
		if err := c.sock.splice(r.pipe.r, r.piped, len(r.data) > 0); err != nil {
			return err
		}
		r.piped = 0 // the pipe is empty again
		if len(r.data) > 0 {
			_, err := c.sock.Write(r.data)
			return err
		}
		return nil
	}
	if len(r.data) >= largeReply {
		// Send the payload from its own buffer instead of copying it
		// through c.w.
		if err := c.w.Flush(); err != nil {
			return err
		}
		if c.sock != nil && len(r.extra) == 0 {
			// The header with MSG_MORE, then the payload: a fifth more
			// 1 MiB reads per second than one writev of both on a host
			// whose TCP paces (BBR), no worse on one that does not
			// (bench/RESULTS.md, 2026-11-25).
			if err := c.sock.sendMore(h); err != nil {
				return err
			}
			_, err := c.sock.Write(r.data)
			return err
		}
		bufs := net.Buffers{h, r.extra, r.data}
		_, err := bufs.WriteTo(c.nc)
		return err
	}
	if _, err := c.w.Write(h); err != nil {
		return err
	}
	if _, err := c.w.Write(r.extra); err != nil {
		return err
	}
	_, err := c.w.Write(r.data)
	return err
}
