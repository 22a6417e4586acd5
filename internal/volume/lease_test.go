package volume

import "testing"

// TestLeaseDeletionOlderThanKey: the deletion of a lease key older than
// the one this node holds (a previous run's, revoked at start, whose
// event arrives late) leaves the lease alone; a deletion after the key
// was made fences it.
func TestLeaseDeletionOlderThanKey(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	v, err := s.CreateVolume(ctx, caller("alice"), CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if holder, err := s.leases.acquire(ctx, v.ID); err != nil || holder != s.cfg.Node {
		t.Fatalf("acquire: %q %v", holder, err)
	}
	held := func() (int64, bool) {
		s.leases.mu.Lock()
		defer s.leases.mu.Unlock()
		tok, ok := s.leases.held[v.ID]
		return tok, ok
	}
	token, _ := held()
	s.leases.takeOver(ctx, v.ID, token-1)
	if _, ok := held(); !ok {
		t.Fatal("a deletion older than the held key fenced the lease")
	}
	s.leases.takeOver(ctx, v.ID, token+1)
	if _, ok := held(); ok {
		t.Fatal("the deletion of the held key did not fence the lease")
	}
}
