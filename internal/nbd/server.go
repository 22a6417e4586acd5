package nbd

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

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
}

// Exports resolves export names. Implementations decide authorisation.
type Exports interface {
	// Open returns the export for name. tls is the connection's TLS state
	// after STARTTLS (nil without TLS), so an implementation can check the
	// client certificate. It returns ErrUnknownExport or ErrTLSRequired,
	// or another error (reported as unknown). ctx ends with the handshake
	// (HandshakeTimeout, or the connection closing): Open must return
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
	// HandshakeTimeout bounds option haggling (default 30 s).
	HandshakeTimeout time.Duration

	// coldLocal (tests) serves clients on this host as remote ones: their
	// spliced reads are not warmed.
	coldLocal bool

	mu     sync.Mutex
	conns  map[*conn]struct{}
	lns    []net.Listener
	closed bool
	wg     sync.WaitGroup
}

func (s *Server) defaults() {
	if s.MaxInFlight == 0 {
		s.MaxInFlight = 128
	}
	if s.MaxInFlightBytes == 0 {
		s.MaxInFlightBytes = 64 << 20
	}
	if s.HandshakeTimeout == 0 {
		s.HandshakeTimeout = 30 * time.Second
	}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
}

// Serve accepts connections on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
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
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(delay*2, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		c := newConn(s, nc)
		if !s.track(c) {
			nc.Close()
			continue
		}
		go func() {
			defer s.wg.Done()
			defer s.untrack(c)
			c.run()
		}()
	}
}

func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1) // under mu: Close cannot wait before this connection counts
	return true
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Connections returns the number of open connections.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Close stops accepting, closes every connection and waits for them.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for _, ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.shutdown()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}
