package store

import (
	"errors"
	"fmt"
	"time"
)

// ErrStalled: a check of the store has not returned in the time allowed —
// its file system does not answer (an NFS or Lustre server that is down
// under a hard mount, a frozen file system). The kernel holds such calls
// until the file system answers, and nothing in user space can end them.
var ErrStalled = errors.New("the store's file system does not answer")

// probe is a Check under way (Probe).
type probe struct {
	done    chan struct{}
	err     error
	started time.Time
}

// Probe is Check bounded in time, for callers that must answer whatever
// the file system does (status, metrics): a Check on a stalled file
// system blocks until it answers, and a status request would hang with
// it. Probe runs at most one Check at a time, which every caller asking
// meanwhile shares, and answers ErrStalled once it has waited timeout:
// the Check goes on, and the first Probe after it returns starts another.
// So a stalled store holds one goroutine, not one per request.
func (s *Store) Probe(timeout time.Duration) error {
	s.probeMu.Lock()
	p := s.probing
	if p == nil {
		p = &probe{done: make(chan struct{}), started: time.Now()}
		s.probing = p
		go func() {
			err := s.Check()
			s.probeMu.Lock()
			s.probing = nil
			s.probeMu.Unlock()
			p.err = err
			close(p.done)
		}()
	}
	s.probeMu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.err
	case <-t.C:
		return fmt.Errorf("store %s: %w: a check of it has waited %v (is its file server down, or the file system frozen?)",
			s.Root, ErrStalled, time.Since(p.started).Round(time.Second))
	}
}
