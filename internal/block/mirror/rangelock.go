package mirror

import "sync"

// rangeLock serialises operations on overlapping byte ranges, first come
// first served: a request waits for every earlier request that overlaps it
// (granted or still waiting), so a resync's region lock is not starved by a
// stream of small writes, and two overlapping writes reach every leg in the
// same order (otherwise the legs could end up holding different winners).
// Each holder holds one range at a time, so it cannot deadlock.
type rangeLock struct {
	mu      sync.Mutex
	q       []*lockReq // in arrival order
	waiting int
}

type lockReq struct {
	off, end int64
	granted  bool
	ready    chan struct{}
}

func overlaps(a *lockReq, off, end int64) bool { return a.off < end && off < a.end }

// lock takes [off, end) and returns the handle to unlock it with.
func (rl *rangeLock) lock(off, end int64) *lockReq {
	rl.mu.Lock()
	r := &lockReq{off: off, end: end}
	blocked := false
	for _, o := range rl.q {
		if overlaps(o, off, end) {
			blocked = true
			break
		}
	}
	rl.q = append(rl.q, r)
	if !blocked {
		r.granted = true
		rl.mu.Unlock()
		return r
	}
	r.ready = make(chan struct{})
	rl.waiting++
	rl.mu.Unlock()
	<-r.ready
	return r
}

// unlock releases r and grants every waiter no earlier request blocks.
func (rl *rangeLock) unlock(r *lockReq) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	for i, o := range rl.q {
		if o == r {
			rl.q = append(rl.q[:i], rl.q[i+1:]...)
			break
		}
	}
	if rl.waiting == 0 {
		return
	}
	for i, w := range rl.q {
		if w.granted {
			continue
		}
		blocked := false
		for _, o := range rl.q[:i] {
			if overlaps(o, w.off, w.end) {
				blocked = true
				break
			}
		}
		if !blocked {
			w.granted = true
			rl.waiting--
			close(w.ready)
		}
	}
}
