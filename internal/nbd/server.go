package nbd

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// acceptAgain reports whether an accept error passes: a timeout, or the
// process or system out of file descriptors or memory for a moment, or a
// connection aborted before it was accepted. Serve would otherwise stop
// serving for good — every attachment of the node unreachable until a
// restart — because a burst of connections or open files hit a limit.
func acceptAgain(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Export is what a client connects to.
type Export struct {
	// Name is what the client asked for. It may be a secret: never log it.
	Name string
	// LogName identifies the export in logs (e.g. an attachment id).
	LogName     string
	Description string
	Device      block.Device
	// ReadOnly serves the device read-only even if it could write.
	ReadOnly bool
	// Revoked is closed when the export is withdrawn: the server closes
	// every connection using it. Nil means never.
	Revoked <-chan struct{}
	// Release is called once when a connection (or an INFO query) is done
	// with the export. May be nil.
	Release func()
	// Stats, if not nil, counts the requests answered (stats.go).
	Stats *Stats
}

// Exports resolves export names. Implementations decide authorisation.
type Exports interface {
	// Open returns the export for name. tls is the connection's TLS state
	// after STARTTLS (nil without TLS), so an implementation can check the
	// client certificate. It returns ErrUnknownExport or ErrTLSRequired,
	// or another error (reported as unknown). ctx ends with the handshake
	// (HandshakeTimeout, the connection closing, or Server.Shutdown
	// beginning): Open must return
	// once it is done, and must not tie the export's life to it.
	Open(ctx context.Context, name string, tls *tls.ConnectionState) (*Export, error)
}

// Errors an Exports implementation returns.
var (
	ErrUnknownExport = errors.New("unknown export")
	ErrTLSRequired   = errors.New("TLS required for this export")
)

// Server serves NBD connections.
type Server struct {
	Exports Exports
	// TLS enables STARTTLS (nil: no TLS). With RequireTLS every option but
	// STARTTLS and ABORT is refused until TLS is up (the spec's FORCEDTLS).
	TLS        *tls.Config
	RequireTLS bool
	Log        *slog.Logger
	// MaxInFlight and MaxInFlightBytes bound each connection's concurrent
	// requests and their payload memory (defaults 128 and 64 MiB).
	MaxInFlight      int
	MaxInFlightBytes int64
	// MaxInFlightBytesTotal bounds the payload memory in flight across
	// all connections: write payloads read and not yet written to the
	// device, read data not yet sent (default 256 MiB; negative: no
	// server-wide bound). A connection that would exceed it stops reading
	// from its client until there is room, connections taking their turns
	// first come, first served; a request bigger than the whole bound is
	// charged all of it, and runs alone (serverbudget.go).
	MaxInFlightBytesTotal int64
	// HandshakeTimeout bounds option haggling (default 30 s).
	HandshakeTimeout time.Duration
	// MaxHandshakes bounds the connections in the handshake at once,
	// server-wide (default 256; negative: no bound). Nothing is
	// authenticated before the export name, so this is what bounds the
	// memory idle unauthenticated connections hold, and the export names
	// guessed in parallel. A connection that finds the bound reached
	// waits a moment for a slot, then is closed before the greeting;
	// connections past the handshake do not count (handshakelimit.go).
	MaxHandshakes int
	// UserTimeout is how long data the server sent may stay unacknowledged
	// — the client's host gone or cut off, or the client not reading so
	// that its window stays shut — before the kernel ends the connection
	// (TCP_USER_TIMEOUT; default 60 s, negative: the kernel's default,
	// retransmissions backed off for about 15 minutes). What such a
	// connection holds — its replies' data and payloads, counted against
	// MaxInFlightBytesTotal, and its export — is released then, not a
	// quarter of an hour later: a few hypervisor hosts lost at once must
	// not stall every other client of the node for that long.
	UserTimeout time.Duration
	// CloseTimeout bounds how long Close waits for requests still running
	// in a device once it has closed their connections (default 5 s): a
	// hung backing file must not hold it for ever. Such a request's
	// connection ends, and releases its export, when the device returns.
	CloseTimeout time.Duration

	// total is the server-wide budget (nil: none), made by defaults.
	total *serverBudget
	// hs bounds the connections in the handshake (MaxHandshakes), made by
	// defaults; hsSlotWait (tests) replaces handshakeSlotWait.
	hs         *handshakeGate
	hsSlotWait time.Duration
	// stopping is closed by Close and Shutdown: connections waiting for a
	// handshake slot give up. hsWaiting (under mu) counts them, waiters
	// lets Close and Shutdown wait for them to have closed their sockets.
	stopping  chan struct{}
	hsWaiting int
	waiters   sync.WaitGroup

	// spliceLocal (tests) serves clients on this host as remote ones:
	// their big reads are spliced.
	spliceLocal bool

	mu     sync.Mutex
	conns  map[*conn]struct{}
	lns    []net.Listener
	closed bool
	// gone is closed when the last connection has ended, once Close or
	// Shutdown waits for that (nil otherwise).
	gone chan struct{}
}

const defaultCloseTimeout = 5 * time.Second

func (s *Server) defaults() {
	if s.MaxInFlight == 0 {
		s.MaxInFlight = 128
	}
	if s.MaxInFlightBytes == 0 {
		s.MaxInFlightBytes = 64 << 20
	}
	if s.MaxInFlightBytesTotal == 0 {
		s.MaxInFlightBytesTotal = defaultMaxInFlightBytesTotal
	}
	if s.total == nil && s.MaxInFlightBytesTotal > 0 {
		s.total = newServerBudget(s.MaxInFlightBytesTotal)
	}
	if s.HandshakeTimeout == 0 {
		s.HandshakeTimeout = 30 * time.Second
	}
	if s.MaxHandshakes == 0 {
		s.MaxHandshakes = DefaultMaxHandshakes
	}
	if s.hs == nil {
		s.hs = newHandshakeGate(s.MaxHandshakes)
	}
	if s.stopping == nil {
		s.stopping = make(chan struct{})
	}
	if s.UserTimeout == 0 {
		s.UserTimeout = 60 * time.Second
	}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
}

// Serve accepts connections on ln until Close or Shutdown, which close
// it. Called after them (a goroutine that started late), it closes ln
// itself: nobody else would, and its port would stay taken.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return net.ErrClosed
	}
	s.defaults()
	if s.conns == nil {
		s.conns = map[*conn]struct{}{}
	}
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			if acceptAgain(err) {
				if delay == 0 {
					s.Log.Warn("nbd accept failed; trying again, backing off up to 1s", "err", err)
				}
				delay = min(max(delay*2, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		if !s.hs.tryAcquire() {
			s.startHandshake(nc) // waits beside the loop, or refuses
			continue
		}
		s.start(nc)
	}
}

// start serves an accepted connection that holds a handshake slot; the
// connection gives the slot back (conn.releaseHandshake).
func (s *Server) start(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		if s.UserTimeout > 0 {
			setUserTimeout(tc, s.UserTimeout)
		}
	}
	c := newConn(s, nc)
	c.hsSlot.Store(true)
	if !s.track(c) {
		c.releaseHandshake()
		nc.Close()
		return
	}
	go func() {
		defer s.untrack(c)
		// Also here, not only as the handshake ends: should run end
		// another way, the slot must not be lost for good.
		defer c.releaseHandshake()
		c.run()
	}()
}

func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{} // under mu: Close and Shutdown see every connection Serve starts
	return true
}

// untrack forgets a connection that has ended: its requests are done and
// its export released.
func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	if len(s.conns) == 0 && s.gone != nil {
		close(s.gone)
		s.gone = nil
	}
	s.mu.Unlock()
}

// InFlightBytes returns the payload bytes in flight across all
// connections, as charged to MaxInFlightBytesTotal (0 without that
// bound).
func (s *Server) InFlightBytes() int64 {
	s.mu.Lock()
	t := s.total
	s.mu.Unlock()
	if t == nil {
		return 0
	}
	return t.inFlight()
}

// Connections returns the number of open connections.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Shutdown stops the server gracefully (the spec: on a server shutdown,
// wait for the requests in flight to be serviced before disconnecting).
// It stops accepting and closes the listeners; every connection stops
// reading requests, finishes those it has started and sends their
// replies, then ends (TLS with close_notify). A request counts as started
// once its header was read; those the client sent after are not answered
// (not with ESHUTDOWN either: a client that reconnects resends them,
// where an error would reach its users). Connections in the handshake
// end at once (an option being served is refused with ERR_SHUTDOWN);
// idle ones end at once.
//
// Shutdown returns nil once every connection has ended. If ctx ends
// first, it closes the rest as Close does, without waiting for requests
// still in a device, and returns ctx's error; such a connection ends, and
// releases its export, when its device returns. Like net/http's
// Shutdown, it waits as long as ctx lets it: give it a deadline.
func (s *Server) Shutdown(ctx context.Context) error {
	conns, gone, log := s.stop()
	s.waiters.Wait() // they give up at once (stopping)
	for _, c := range conns {
		c.quiesce()
	}
	select {
	case <-gone:
		return nil
	case <-ctx.Done():
	}
	select {
	case <-gone:
		return nil
	default:
	}
	closeAll(conns)
	log.Warn("nbd shutdown: closed connections whose requests had not finished", "err", ctx.Err())
	return ctx.Err()
}

// Close stops accepting, closes every connection at once (requests in
// flight get no reply; TLS sessions get a close_notify if that can be
// sent within a second) and waits for the connections to end: for their
// requests to leave the device, and their exports to be released, but no
// longer than CloseTimeout. Shutdown is the graceful way.
func (s *Server) Close() error {
	wait := s.CloseTimeout
	if wait <= 0 {
		wait = defaultCloseTimeout
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	conns, gone, log := s.stop()
	s.waiters.Wait() // they give up at once (stopping)
	closeAll(conns)
	select {
	case <-gone:
	case <-timer.C:
		log.Warn("nbd close: requests still in their device; not waiting for them", "connections", s.Connections(), "waited", wait)
	}
	return nil
}

// stop marks the server closed and closes its listeners. It returns the
// connections open, a channel closed once none is left, and the log.
func (s *Server) stop() ([]*conn, <-chan struct{}, *slog.Logger) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed && s.stopping != nil {
		close(s.stopping)
	}
	s.closed = true
	for _, ln := range s.lns {
		ln.Close()
	}
	s.lns = nil
	log := s.Log
	if log == nil { // never served
		log = slog.New(slog.DiscardHandler)
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	if len(conns) == 0 {
		gone := make(chan struct{})
		close(gone)
		return conns, gone, log
	}
	if s.gone == nil {
		s.gone = make(chan struct{})
	}
	return conns, s.gone, log
}

// closeAll closes connections, concurrently: each may take up to
// closeNotifyWait to end its TLS session.
func closeAll(conns []*conn) {
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(c.shutdown)
	}
	wg.Wait()
}
