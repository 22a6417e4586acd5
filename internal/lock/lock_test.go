package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// locker is a Locker on its own session (a node of its own).
func locker(t *testing.T, prefix, owner string, ttl int) *Locker {
	t.Helper()
	s := newSession(t, testClient(t), ttl)
	t.Cleanup(func() { s.Close() })
	return New(s, prefix, Options{Owner: owner, Log: quiet})
}

// must(t)(l.Acquire(...)) is the holder, or the test's end.
func must(t *testing.T) func(*Held, error) *Held {
	return func(h *Held, err error) *Held {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
}

// result is the outcome of an Acquire or Upgrade running in the background.
type result struct {
	h   *Held
	err error
}

func acquireAsync(ctx context.Context, l *Locker, res string, m Mode) chan result {
	ch := make(chan result, 1)
	go func() {
		h, err := l.Acquire(ctx, res, m)
		ch <- result{h, err}
	}()
	return ch
}

func upgradeAsync(ctx context.Context, h *Held) chan error {
	ch := make(chan error, 1)
	go func() { ch <- h.Upgrade(ctx) }()
	return ch
}

// blocked asserts that nothing arrives on ch for a while.
func blocked[T any](t *testing.T, ch chan T, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: should block, got %v", what, r)
	case <-time.After(300 * time.Millisecond):
	}
}

func arrives[T any](t *testing.T, ch chan T, what string) T {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still blocked", what)
	}
	panic("unreachable")
}

// waitQueue waits until the queue of res reads want (owner:mode ...).
func waitQueue(t *testing.T, l *Locker, res, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q, err := l.Queue(context.Background(), res)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, h := range q {
			got = append(got, h.Owner+":"+h.Mode.String())
		}
		if strings.Join(got, " ") == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %q, want %q", strings.Join(got, " "), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestUpgradeWaitsForReaders: an update holder with a reader ahead of it and
// one beside it upgrades; the upgrade waits for both, a reader arriving
// after the upgrade started waits for the writer, and a writer queued behind
// the update holder stays behind the upgraded writer.
func TestUpgradeWaitsForReaders(t *testing.T) {
	ctx := context.Background()
	p := testPrefix(t)
	r1, u, r2, r3, w := locker(t, p, "r1", 30), locker(t, p, "u", 30), locker(t, p, "r2", 30),
		locker(t, p, "r3", 30), locker(t, p, "w", 30)

	h1 := must(t)(r1.Acquire(ctx, "vol", Read))
	hu := must(t)(u.Acquire(ctx, "vol", Update))
	h2 := must(t)(r2.Acquire(ctx, "vol", Read))
	wch := acquireAsync(ctx, w, "vol", Write)
	waitQueue(t, u, "vol", "r1:read u:update r2:read w:write")

	up := upgradeAsync(ctx, hu)
	waitQueue(t, u, "vol", "r1:read u:write r2:read w:write")
	r3ch := acquireAsync(ctx, r3, "vol", Read)
	waitQueue(t, u, "vol", "r1:read u:write r2:read w:write r3:read")
	blocked(t, up, "upgrade with two readers")

	if err := h1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	blocked(t, up, "upgrade with one reader left")
	if err := h2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := arrives(t, up, "upgrade after the readers left"); err != nil {
		t.Fatal(err)
	}
	if hu.Mode() != Write {
		t.Fatalf("mode after upgrade: %v", hu.Mode())
	}
	blocked(t, r3ch, "reader arriving during the upgrade")
	blocked(t, wch, "writer queued behind the update holder")

	if err := hu.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// w was queued before r3: it goes first, r3 after it.
	rw := arrives(t, wch, "writer after the upgraded writer released")
	if rw.err != nil {
		t.Fatal(rw.err)
	}
	blocked(t, r3ch, "reader behind the writer")
	if rw.h.Token() <= hu.Token() {
		t.Fatalf("fencing: writer token %d after upgraded writer token %d", rw.h.Token(), hu.Token())
	}
	if err := rw.h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rr := arrives(t, r3ch, "reader after the writer")
	if rr.err != nil {
		t.Fatal(rr.err)
	}
	rr.h.Release(ctx)
}

// TestUpgradeCancelled: an upgrade whose context ends goes back to update,
// and the reader it had stopped gets in.
func TestUpgradeCancelled(t *testing.T) {
	ctx := context.Background()
	p := testPrefix(t)
	a, b, c := locker(t, p, "a", 30), locker(t, p, "b", 30), locker(t, p, "c", 30)
	hu := must(t)(a.Acquire(ctx, "vol", Update))
	hr := must(t)(b.Acquire(ctx, "vol", Read))

	err := hu.TryUpgrade(ctx)
	var ce *ConflictError
	if !errors.As(err, &ce) || len(ce.Blockers) != 1 || ce.Blockers[0].Owner != "b" {
		t.Fatalf("TryUpgrade with a reader: %v", err)
	}
	waitQueue(t, a, "vol", "a:update b:read")

	uctx, cancel := context.WithCancel(ctx)
	up := upgradeAsync(uctx, hu)
	waitQueue(t, a, "vol", "a:write b:read")
	cch := acquireAsync(ctx, c, "vol", Read)
	waitQueue(t, a, "vol", "a:write b:read c:read")
	blocked(t, cch, "reader during the upgrade")
	cancel()
	if err := arrives(t, up, "cancelled upgrade"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled upgrade: %v", err)
	}
	if hu.Mode() != Update {
		t.Fatalf("mode after a cancelled upgrade: %v", hu.Mode())
	}
	rc := arrives(t, cch, "reader after the upgrade was cancelled")
	if rc.err != nil {
		t.Fatal(rc.err)
	}
	for _, h := range []*Held{hr, rc.h} {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := hu.TryUpgrade(ctx); err != nil {
		t.Fatalf("TryUpgrade alone: %v", err)
	}
	if err := hu.Upgrade(ctx); !errors.Is(err, ErrNotUpdate) {
		t.Fatalf("second upgrade: %v", err)
	}
	if err := hu.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := hu.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if err := hu.Upgrade(ctx); !errors.Is(err, ErrReleased) {
		t.Fatalf("upgrade after release: %v", err)
	}
}

// TestSessionDeath: a holder whose node dies without releasing frees the
// lock: at once when its lease is revoked, after the TTL when its
// keepalives just stop.
func TestSessionDeath(t *testing.T) {
	ctx := context.Background()
	cli := testClient(t)
	for _, how := range []string{"revoked", "expired"} {
		t.Run(how, func(t *testing.T) {
			p := testPrefix(t)
			const ttl = 2
			dying := newSession(t, cli, ttl)
			a := New(dying, p, Options{Owner: "a", Log: quiet})
			b := locker(t, p, "b", 30)
			ha := must(t)(a.Acquire(ctx, "vol", Write))
			bch := acquireAsync(ctx, b, "vol", Write)
			waitQueue(t, b, "vol", "a:write b:write")
			blocked(t, bch, "writer behind a live writer")

			start := time.Now()
			dying.Orphan() // keepalives stop; nothing is released
			if how == "revoked" {
				if _, err := cli.Revoke(ctx, dying.Lease()); err != nil {
					t.Fatal(err)
				}
			}
			rb := arrives(t, bch, "writer behind a dead writer")
			if rb.err != nil {
				t.Fatal(rb.err)
			}
			took := time.Since(start)
			if how == "expired" && took < time.Second {
				t.Fatalf("granted after %v, before the lease could expire", took)
			}
			t.Logf("%s: granted after %v", how, took.Round(time.Millisecond))
			if rb.h.Token() <= ha.Token() {
				t.Fatalf("fencing: token %d after %d", rb.h.Token(), ha.Token())
			}
			select {
			case <-ha.Lost():
			case <-time.After(5 * time.Second):
				t.Fatal("Lost not closed")
			}
			if err := ha.Release(ctx); !errors.Is(err, ErrLost) {
				t.Fatalf("release of a lost lock: %v", err)
			}
			if _, err := a.Acquire(ctx, "other", Read); err == nil {
				t.Fatal("acquire on a dead session succeeded")
			}
			rb.h.Release(ctx)
		})
	}
}

// TestTryAcquireAndCancel: refusals name who is in the way and leave no
// key; a cancelled Acquire leaves the queue.
func TestTryAcquireAndCancel(t *testing.T) {
	ctx := context.Background()
	p := testPrefix(t)
	a, b, c := locker(t, p, "a", 30), locker(t, p, "b", 30), locker(t, p, "c", 30)
	ha := must(t)(a.Acquire(ctx, "vol", Read))
	bch := acquireAsync(ctx, b, "vol", Write)
	waitQueue(t, a, "vol", "a:read b:write")

	// c may not pass the queued writer.
	_, err := c.TryAcquire(ctx, "vol", Read)
	var ce *ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) {
		t.Fatalf("TryAcquire behind a queued writer: %v", err)
	}
	want := []Holder{{Owner: "b", Mode: Write, Waiting: true}}
	if len(ce.Blockers) != 1 || ce.Blockers[0].Owner != want[0].Owner || ce.Blockers[0].Mode != Write ||
		!ce.Blockers[0].Waiting || ce.Resource != "vol" || ce.Mode != Read {
		t.Fatalf("conflict %+v, want blockers %+v", ce, want)
	}
	if !strings.Contains(err.Error(), "b waits for write") {
		t.Fatalf("message %q", err)
	}
	waitQueue(t, a, "vol", "a:read b:write")

	// A writer's refusal names both.
	_, err = c.TryAcquire(ctx, "vol", Write)
	if !errors.As(err, &ce) || len(ce.Blockers) != 2 || ce.Blockers[0].Owner != "a" || ce.Blockers[0].Waiting {
		t.Fatalf("TryAcquire write: %v", err)
	}

	// A waiter whose context ends leaves the queue.
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(tctx, "vol", Update); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire with a deadline: %v", err)
	}
	waitQueue(t, a, "vol", "a:read b:write")

	// Queue order holds: c behind b behind a.
	cch := acquireAsync(ctx, c, "vol", Read)
	waitQueue(t, a, "vol", "a:read b:write c:read")
	blocked(t, cch, "reader behind a queued writer")
	ha.Release(ctx)
	rb := arrives(t, bch, "writer")
	if rb.err != nil {
		t.Fatal(rb.err)
	}
	blocked(t, cch, "reader behind a writer")
	rb.h.Release(ctx)
	rc := arrives(t, cch, "reader")
	if rc.err != nil {
		t.Fatal(rc.err)
	}
	rc.h.Release(ctx)
	waitQueue(t, a, "vol", "")
}

// TestResourceNames: resources are independent whatever their names,
// including names that are prefixes of others or hold slashes.
func TestResourceNames(t *testing.T) {
	ctx := context.Background()
	p := testPrefix(t)
	a := locker(t, p, "a", 30)
	var hs []*Held
	for _, r := range []string{"vol", "vol/1", "vol/", "vo", "v%2F", "volume:x", "ü"} {
		h, err := a.TryAcquire(ctx, r, Write)
		if err != nil {
			t.Fatalf("%q: %v", r, err)
		}
		hs = append(hs, h)
	}
	for _, h := range hs {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.TryAcquire(ctx, "", Read); err == nil {
		t.Fatal("empty resource accepted")
	}
	if _, err := a.TryAcquire(ctx, "x", Mode(7)); err == nil {
		t.Fatal("bad mode accepted")
	}
}

// TestIsOwner: a transaction guarded by IsOwner commits only under the lock.
func TestIsOwner(t *testing.T) {
	ctx := context.Background()
	p := testPrefix(t)
	cli := testClient(t)
	a := locker(t, p, "a", 30)
	h := must(t)(a.Acquire(ctx, "vol", Write))
	key := p + "data"
	resp, err := cli.Txn(ctx).If(h.IsOwner()).Then(clientv3.OpPut(key, "1")).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("guarded put under the lock: %v %v", resp, err)
	}
	h.Release(ctx)
	resp, err = cli.Txn(ctx).If(h.IsOwner()).Then(clientv3.OpPut(key, "2")).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("guarded put after release: %v %v", resp, err)
	}
}

// TestStress: goroutines on separate sessions take one resource in random
// modes (update holders upgrade half of the time), and a shared checker
// sees, on every grant: no writer with anyone, no two update holders, and
// tokens that respect fencing: a holder's token is newer than the token of
// every earlier holder whose mode conflicts with its own.
func TestStress(t *testing.T) {
	ctx := context.Background()
	p := testPrefix(t)
	const nodes = 8
	duration := 3 * time.Second
	if testing.Short() {
		duration = time.Second
	}
	var (
		mu                          sync.Mutex
		readers, updaters, writers  int
		maxAny, maxExcl, maxWriter  int64 // newest tokens granted so far
		grants, upgrades, conflicts int
		errs                        []string
	)
	report := func(format string, args ...any) {
		errs = append(errs, fmt.Sprintf(format, args...))
	}
	// enter is called once the lock is granted, leave before releasing, so
	// each checked interval lies inside the real one.
	enter := func(m Mode, tok int64) {
		mu.Lock()
		defer mu.Unlock()
		grants++
		switch m {
		case Read:
			if writers > 0 {
				report("reader granted beside a writer")
			}
			if tok <= maxWriter {
				report("reader token %d not newer than writer token %d", tok, maxWriter)
			}
			readers++
		case Update:
			if writers > 0 || updaters > 0 {
				report("update granted beside %d writers, %d updaters", writers, updaters)
			}
			if tok <= maxExcl {
				report("update token %d not newer than %d", tok, maxExcl)
			}
			updaters++
			maxExcl = max(maxExcl, tok)
		case Write:
			if writers > 0 || updaters > 0 || readers > 0 {
				report("writer granted beside %d/%d/%d", readers, updaters, writers)
			}
			if tok <= maxAny {
				report("writer token %d not newer than %d", tok, maxAny)
			}
			writers++
			maxExcl, maxWriter = max(maxExcl, tok), max(maxWriter, tok)
		}
		maxAny = max(maxAny, tok)
	}
	upgraded := func(tok int64) {
		mu.Lock()
		defer mu.Unlock()
		upgrades++
		if readers > 0 || writers > 0 || updaters != 1 {
			report("upgrade completed beside %d readers, %d writers, %d updaters", readers, writers, updaters)
		}
		updaters, writers = updaters-1, writers+1
		maxWriter = max(maxWriter, tok)
	}
	leave := func(m Mode) {
		mu.Lock()
		defer mu.Unlock()
		switch m {
		case Read:
			readers--
		case Update:
			updaters--
		case Write:
			writers--
		}
	}

	stop := time.Now().Add(duration)
	var wg sync.WaitGroup
	for n := 0; n < nodes; n++ {
		l := locker(t, p, fmt.Sprintf("n%d", n), 30)
		rng := rand.New(rand.NewPCG(uint64(n), 42))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				m := []Mode{Read, Read, Update, Write}[rng.IntN(4)]
				var h *Held
				var err error
				if rng.IntN(5) == 0 {
					h, err = l.TryAcquire(ctx, "vol", m)
					if errors.Is(err, ErrConflict) {
						mu.Lock()
						conflicts++
						mu.Unlock()
						continue
					}
				} else {
					h, err = l.Acquire(ctx, "vol", m)
				}
				if err != nil {
					mu.Lock()
					report("acquire: %v", err)
					mu.Unlock()
					return
				}
				enter(m, h.Token())
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
				if m == Update && rng.IntN(2) == 0 {
					if err := h.Upgrade(ctx); err != nil {
						mu.Lock()
						report("upgrade: %v", err)
						mu.Unlock()
						return
					}
					upgraded(h.Token())
					m = Write
					time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
				}
				leave(m)
				if err := h.Release(ctx); err != nil {
					mu.Lock()
					report("release: %v", err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d violations, first ones:\n%s", len(errs), strings.Join(errs[:min(10, len(errs))], "\n"))
	}
	t.Logf("%d grants, %d upgrades, %d refused tries in %v by %d nodes", grants, upgrades, conflicts, duration, nodes)
	if grants < nodes || upgrades == 0 {
		t.Fatalf("too little happened: %d grants, %d upgrades", grants, upgrades)
	}
}

// TestReleaseRetried: a release that fails (here: its context is already
// cancelled, as when etcd does not answer in time) still frees the lock
// soon, while the session lives on; so does a withdrawn request.
func TestReleaseRetried(t *testing.T) {
	ctx := context.Background()
	p := testPrefix(t)
	a, b := locker(t, p, "a", 30), locker(t, p, "b", 30)
	ha := must(t)(a.Acquire(ctx, "vol", Write))
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if err := ha.Release(dead); err == nil {
		t.Fatal("release with a cancelled context succeeded")
	}
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	defer wcancel()
	hb, err := b.Acquire(wctx, "vol", Write)
	if err != nil {
		t.Fatalf("lock still held after a failed release: %v", err)
	}
	hb.Release(ctx)
	waitQueue(t, b, "vol", "")
}

// TestLateRequestSwept: a request whose enqueue failed with its outcome
// unknown may have its put applied after the withdrawal (a forwarded
// proposal delivered late): the key that appears then is deleted, so the
// resource is not blocked until the session ends.
func TestLateRequestSwept(t *testing.T) {
	saved := lateSweeps
	lateSweeps = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}
	defer func() { lateSweeps = saved }()
	ctx := context.Background()
	p := testPrefix(t)
	a, b := locker(t, p, "a", 30), locker(t, p, "b", 30)
	key := a.newKey("vol")
	a.sweepLate("vol", key)
	time.Sleep(120 * time.Millisecond) // after the first sweeps: the put is late
	rec := record{Mode: Write.String(), Owner: "a"}
	if _, err := a.cli.Put(ctx, key, rec.encode(), clientv3.WithLease(a.sess.Lease())); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	hb, err := b.Acquire(wctx, "vol", Write)
	if err != nil {
		t.Fatalf("the late request still blocks the resource: %v", err)
	}
	hb.Release(ctx)
	waitQueue(t, b, "vol", "")
}
