package volume

import (
	"context"
	"crypto/x509"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
)

// Credential checks of live NBD connections. A connection over TLS is
// opened with a client certificate (Exports.Open authenticates it), and
// its user may be deleted, or given new credentials, while it lasts: the
// export's revocation covers detaches only. So the chain of every TLS
// connection open here is checked again every sessionRecheck, and a
// connection whose chain no longer authenticates (revoked, expired) is
// closed. A check that cannot tell (the metadata unavailable) leaves the
// connection be: what cannot be checked is not taken as revoked, as
// closing every connection of a node cut off from the quorum would stop
// its clients for nothing.

// sessionRecheck is how often the chain of each TLS connection is checked
// again: the bound on how long a connection outlives its credentials.
var sessionRecheck = 5 * time.Second

// session is one TLS-authenticated connection (an open export) here.
type session struct {
	chain      []*x509.Certificate
	attachment string
	revoked    chan struct{} // closed when detached or no longer authenticated
	released   chan struct{} // closed when the export is released
	once       sync.Once
}

func (s *session) end() { s.once.Do(func() { close(s.revoked) }) }

// track registers the chain of a TLS connection to attachment, whose
// detach closes detached. It returns the channel to serve as the export's
// Revoked — closed on the detach or when the chain no longer
// authenticates — and the release of the registration.
func (e *Exports) track(chain []*x509.Certificate, attachment string, detached <-chan struct{}) (<-chan struct{}, func()) {
	s := &session{chain: chain, attachment: attachment, revoked: make(chan struct{}), released: make(chan struct{})}
	e.mu.Lock()
	if e.sessions == nil {
		e.sessions = map[*session]struct{}{}
	}
	e.sessions[s] = struct{}{}
	e.mu.Unlock()
	go func() {
		select {
		case <-detached:
			s.end()
		case <-s.revoked:
		case <-s.released:
		}
	}()
	var once sync.Once
	return s.revoked, func() {
		once.Do(func() {
			e.mu.Lock()
			delete(e.sessions, s)
			e.mu.Unlock()
			close(s.released)
		})
	}
}

// recheck checks the chain of every TLS connection open here every
// sessionRecheck until ctx ends, and closes those that no longer
// authenticate.
func (e *Exports) recheck(ctx context.Context) {
	t := time.NewTicker(sessionRecheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		e.mu.Lock()
		open := make([]*session, 0, len(e.sessions))
		for s := range e.sessions {
			open = append(open, s)
		}
		e.mu.Unlock()
		for _, s := range open {
			_, err := e.Authenticate(ctx, s.chain)
			if ee, ok := errs.As(err); ok && ee.Kind == errs.KindUnauthenticated {
				e.s.log.Info("nbd connection's client certificate no longer authenticates; closing the connection",
					"attachment", s.attachment, "user", s.chain[0].Subject.CommonName, "err", err)
				s.end()
			}
		}
	}
}
