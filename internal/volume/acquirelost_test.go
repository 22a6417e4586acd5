package volume

import (
	"sync"
	"testing"
	"time"
)

// TestAcquireOnExpiredEtcdLease: a node whose etcd lease ends while it
// takes a volume's write lease (the key made on that etcd lease, but not
// yet recorded as held here)
// must not count the volume as its own once the renewal loop has dropped
// every lease and granted a new etcd lease: the key went with the old one,
// so another node may take the volume and write it, while this node's
// fences — the lease held, the new etcd lease valid — let its writes
// through.
func TestAcquireOnExpiredEtcdLease(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	a := e.started(Config{Node: uniq("a"), ImageGrace: time.Hour})
	b := e.started(Config{Node: uniq("b"), ImageGrace: time.Hour})
	v, err := a.CreateVolume(ctx, caller("alice"), CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	a.leases.mu.Lock()
	old := a.leases.id
	a.leases.mu.Unlock()
	// a's acquisition, having made the key, waits until unlock.
	gate := make(chan struct{})
	var once sync.Once
	unlock := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(unlock)
	a.leases.keyMade = func(string) { <-gate }
	type result struct {
		holder string
		token  int64
		err    error
	}
	acquired := make(chan result, 1)
	go func() {
		h, token, err := a.leases.acquire(ctx, v.ID)
		acquired <- result{h, token, err}
	}()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		h, err := e.meta.VolumeLeaseHolder(ctx, v.ID)
		if err != nil {
			unlock()
			t.Fatal(err)
		}
		if h != nil && h.Node == a.cfg.Node {
			break
		}
		if time.Since(start) > 10*time.Second {
			unlock()
			t.Fatal("a never made the lease key")
		}
	}
	if err := e.meta.RevokeLease(ctx, old); err != nil { // a's etcd lease ends, and the key with it
		unlock()
		t.Fatal(err)
	}
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		a.leases.mu.Lock()
		id := a.leases.id
		a.leases.mu.Unlock()
		if id != 0 && id != old {
			break // dropped every lease, and granted a new etcd lease
		}
		if time.Since(start) > 10*time.Second {
			unlock()
			t.Fatal("a never renewed its etcd lease")
		}
	}
	unlock()
	r := <-acquired
	if h, _, err := b.leases.acquire(ctx, v.ID); err != nil || h != b.cfg.Node {
		t.Fatalf("b acquire: %s, %v", h, err)
	}
	a.leases.mu.Lock()
	_, held := a.leases.held[v.ID]
	a.leases.mu.Unlock()
	if held || r.err == nil && a.leases.writes(v.ID, r.token) == nil {
		t.Fatalf("a's acquisition returned (%q, %v) and a holds the lease (%v) while b holds it too: a's stacks write on", r.holder, r.err, held)
	}
}
