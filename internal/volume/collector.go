package volume

import (
	"sync"
	"time"
)

// Image collection runs in the background, off the request path: a delete
// (or a finished flatten) asks for one and returns. Collecting reads every
// snapshot record and every volume's top image in the store, so its cost
// grows with the store; a delete should not pay it, nor wait behind another
// delete's.
//
// A request is served by a run that starts collectDelay after it, so that
// a burst of deletes — a user cleaning up, a script, a cluster's nodes each
// deleting — costs one run instead of one per delete: a run lists every
// record and image, and on a busy node runs back to back would take the
// CPU from the requests themselves. Requests that arrive while a
// collection waits or runs are served by that run or the next, which
// starts after them and so sees everything their callers did. A node
// that stops drops the requests it has not served: its next Start asks for
// a collection, and any node's next one finds the same garbage. Besides,
// every node collects unasked once per image grace (at least a minute
// apart): what a collection must spare for the grace — the images of a
// creation that failed, a stack left without its record — and a collapse
// refused while its volume was busy would otherwise wait for the next
// delete.
// minCollectEvery bounds how often a node collects unasked.
var minCollectEvery = time.Minute

// collectDelay is how long a requested collection waits for more requests
// before it runs: space comes back that much later, which no caller waits
// for.
var collectDelay = time.Second

type collector struct {
	kick chan struct{} // a pending request (capacity 1)

	mu      sync.Mutex
	cond    *sync.Cond
	asked   uint64 // requests made
	done    uint64 // requests served (all those made before the last run began)
	runs    uint64 // runs started
	stopped bool   // no run will come: requests are dropped, waiters return
}

func newCollector() *collector {
	c := &collector{kick: make(chan struct{}, 1)}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// collectSoon asks for an image collection.
func (s *Service) collectSoon() {
	s.gc.mu.Lock()
	stopped := s.gc.stopped
	if !stopped {
		s.gc.asked++
	}
	s.gc.mu.Unlock()
	if stopped {
		return
	}
	select {
	case s.gc.kick <- struct{}{}:
	default: // one is pending already; it will serve this request too
	}
}

// runCollector serves collection requests until the service stops.
func (s *Service) runCollector() {
	defer func() { // Stop: release whoever waits; nothing more will run
		s.gc.mu.Lock()
		s.gc.done, s.gc.stopped = s.gc.asked, true
		s.gc.cond.Broadcast()
		s.gc.mu.Unlock()
	}()
	tick := time.NewTicker(max(s.cfg.ImageGrace, minCollectEvery))
	defer tick.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.gc.kick:
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(collectDelay):
			}
			// Requests made until now are served by this run; one whose
			// kick is drained here is counted below.
			select {
			case <-s.gc.kick:
			default:
			}
		case <-tick.C:
		}
		s.gc.mu.Lock()
		served := s.gc.asked
		s.gc.runs++
		s.gc.mu.Unlock()
		s.collect(s.ctx)
		s.gc.mu.Lock()
		s.gc.done = served
		s.gc.cond.Broadcast()
		s.gc.mu.Unlock()
	}
}

// collected returns once every collection asked for before the call has
// run (or the service stopped).
func (s *Service) collected() {
	s.gc.mu.Lock()
	defer s.gc.mu.Unlock()
	want := s.gc.asked
	for s.gc.done < want {
		s.gc.cond.Wait()
	}
}
