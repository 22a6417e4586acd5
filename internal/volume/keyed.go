package volume

import "sync"

// keyed hands out one lock (a sync.Mutex or sync.RWMutex) per volume to
// everyone who asks for it while anyone still holds a reference, and
// forgets it when nobody does: a node that sees volumes come and go for
// years keeps locks only for the volumes in use here, not one for every
// volume it ever touched. A lock obtained after every reference was
// dropped is a new one, which is safe: nobody holds the old one.
type keyed[L any] struct {
	mu sync.Mutex
	m  map[string]*keyedRef[L]
}

type keyedRef[L any] struct {
	l    L
	refs int
}

// get returns key's lock and drop, which gives the reference back; the
// lock must not be used after drop. drop may be called more than once.
func (k *keyed[L]) get(key string) (l *L, drop func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]*keyedRef[L]{}
	}
	r := k.m[key]
	if r == nil {
		r = &keyedRef[L]{}
		k.m[key] = r
	}
	r.refs++
	var once sync.Once
	return &r.l, func() {
		once.Do(func() {
			k.mu.Lock()
			defer k.mu.Unlock()
			if r.refs--; r.refs == 0 {
				delete(k.m, key)
			}
		})
	}
}

// size is the number of keys with a lock (tests).
func (k *keyed[L]) size() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}

// lockKey locks key's mutex of k and returns its unlock, which also
// drops the reference.
func lockKey(k *keyed[sync.Mutex], key string) (unlock func()) {
	mu, drop := k.get(key)
	mu.Lock()
	return func() {
		mu.Unlock()
		drop()
	}
}
