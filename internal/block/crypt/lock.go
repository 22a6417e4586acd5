package crypt

import "sync"

// rangeLock serialises mutating operations on overlapping sector ranges.
//
// Why: a write that does not cover a whole sector must read, decrypt,
// patch, re-encrypt and write that sector back. Two such writes to the
// same sector (or one and a whole-sector write, zero or trim) running
// concurrently would each write back a sector holding only their own
// change, losing the other's — an outcome no ordering of the two explains.
// Holding the sectors a mutation touches for its duration makes every
// outcome one of the orderings.
//
// Requests are granted in arrival order among those that conflict (a
// request waits while any earlier request, granted or waiting, conflicts
// with it), so a stream of small writes cannot starve a large one, and
// since each operation holds exactly one range there is no lock-order
// deadlock.
//
// Reads of whole sectors do not lock: a read racing a write to a sector
// it covers overlaps it, and may see either version, as on a disk. A read
// of part of a sector takes the sectors shared (rlock): a write to
// another part of the sector does not overlap it, yet re-encrypts the
// whole sector, and the child may return that sector half written — a
// 512-byte part of a hole half new ciphertext and half zeroes, which
// decrypts to garbage in bytes neither request touched. Shared requests
// do not conflict with each other.
type rangeLock struct {
	mu   sync.Mutex
	reqs []*lockReq // granted and waiting, in arrival order
}

type lockReq struct {
	first, last int64 // sectors, inclusive
	shared      bool  // a partial read: conflicts only with exclusive requests
	granted     bool
	ready       chan struct{} // closed when granted (nil if granted at once)
}

// conflicts reports whether r and o may not be held at once: they overlap
// and are not both shared.
func (r *lockReq) conflicts(o *lockReq) bool {
	return r.first <= o.last && o.first <= r.last && !(r.shared && o.shared)
}

// lock waits until sectors [first, last] are free and takes them
// exclusively.
func (l *rangeLock) lock(first, last int64) *lockReq {
	return l.acquire(&lockReq{first: first, last: last})
}

// rlock waits until no exclusive request holds or waits for any of
// sectors [first, last] and takes them shared.
func (l *rangeLock) rlock(first, last int64) *lockReq {
	return l.acquire(&lockReq{first: first, last: last, shared: true})
}

func (l *rangeLock) acquire(r *lockReq) *lockReq {
	l.mu.Lock()
	r.granted = true
	for _, o := range l.reqs {
		if o.conflicts(r) {
			r.granted = false
			r.ready = make(chan struct{})
			break
		}
	}
	l.reqs = append(l.reqs, r)
	wait := r.ready // read under mu: unlock sets granted concurrently
	l.mu.Unlock()
	if wait != nil {
		<-wait
	}
	return r
}

// unlock releases r and grants every waiting request that no earlier
// request conflicts with any more.
func (l *rangeLock) unlock(r *lockReq) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, o := range l.reqs {
		if o == r {
			copy(l.reqs[i:], l.reqs[i+1:])
			l.reqs[len(l.reqs)-1] = nil
			l.reqs = l.reqs[:len(l.reqs)-1]
			break
		}
	}
	for i, w := range l.reqs {
		if w.granted {
			continue
		}
		free := true
		for _, o := range l.reqs[:i] {
			if o.conflicts(w) {
				free = false
				break
			}
		}
		if free {
			w.granted = true
			close(w.ready)
		}
	}
}
