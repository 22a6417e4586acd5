package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// queueStates renders Queue as owner:mode:holds|waits, oldest first.
func queueStates(t *testing.T, l *Locker, res string) string {
	t.Helper()
	q, err := l.Queue(context.Background(), res)
	if err != nil {
		t.Fatal(err)
	}
	s := ""
	for i, h := range q {
		if i > 0 {
			s += " "
		}
		st := "holds"
		if h.Waiting {
			st = "waits"
		}
		s += fmt.Sprintf("%s:%s:%s", h.Owner, h.Mode, st)
	}
	return s
}

// TestQueueUpgradeWaiting: while an update holder upgrades, Queue
// must show the reader admitted beside it as holding (it does hold) and the
// upgrading holder as waiting (for that reader), and a reader arriving
// after the upgrade as waiting.
func TestQueueUpgradeWaiting(t *testing.T) {
	ctx := context.Background()
	p := testPrefix(t)
	a, b, c := locker(t, p, "a", 30), locker(t, p, "b", 30), locker(t, p, "c", 30)
	hu := must(t)(a.Acquire(ctx, "vol", Update))
	hr := must(t)(b.Acquire(ctx, "vol", Read))
	uctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up := upgradeAsync(uctx, hu)
	waitQueue(t, a, "vol", "a:write b:read")
	cch := acquireAsync(ctx, c, "vol", Read)
	waitQueue(t, a, "vol", "a:write b:read c:read")
	if got, want := queueStates(t, a, "vol"), "a:write:waits b:read:holds c:read:waits"; got != want {
		t.Errorf("queue during the upgrade: %q, want %q", got, want)
	}
	// A TryAcquire refused by the upgrade names the reader as a holder.
	_, err := c.TryAcquire(ctx, "vol", Write)
	var ce *ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("TryAcquire write during the upgrade: %v", err)
	}
	for _, bl := range ce.Blockers {
		if bl.Owner == "b" && bl.Waiting {
			t.Errorf("conflict names the admitted reader as waiting: %v", err)
		}
	}
	if err := hr.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := arrives(t, up, "upgrade"); err != nil {
		t.Fatal(err)
	}
	if got, want := queueStates(t, a, "vol"), "a:write:holds c:read:waits"; got != want {
		t.Errorf("queue after the upgrade: %q, want %q", got, want)
	}
	hu.Release(ctx)
	rc := arrives(t, cch, "reader")
	if rc.err != nil {
		t.Fatal(rc.err)
	}
	rc.h.Release(ctx)
}

// TestUpgradeSessionDies: an upgrader whose session ends mid-wait
// gets ErrLost at once; its key goes with the lease, so the reader stopped
// by the upgrade gets in and a writer queued behind follows the readers.
func TestUpgradeSessionDies(t *testing.T) {
	ctx := context.Background()
	cli := testClient(t)
	p := testPrefix(t)
	dying := newSession(t, cli, 2)
	a := New(dying, p, Options{Owner: "a", Log: quiet})
	b, c, d := locker(t, p, "b", 30), locker(t, p, "c", 30), locker(t, p, "d", 30)
	hu := must(t)(a.Acquire(ctx, "vol", Update))
	hb := must(t)(b.Acquire(ctx, "vol", Read))
	up := upgradeAsync(ctx, hu)
	waitQueue(t, b, "vol", "a:write b:read")
	cch := acquireAsync(ctx, c, "vol", Read)
	waitQueue(t, b, "vol", "a:write b:read c:read")
	dch := acquireAsync(ctx, d, "vol", Write)
	waitQueue(t, b, "vol", "a:write b:read c:read d:write")
	blocked(t, cch, "reader behind the upgrade")
	dying.Orphan()
	if _, err := cli.Revoke(ctx, dying.Lease()); err != nil {
		t.Fatal(err)
	}
	if err := arrives(t, up, "upgrade of a dead session"); !errors.Is(err, ErrLost) {
		t.Fatalf("upgrade whose session died: %v", err)
	}
	rc := arrives(t, cch, "reader after the upgrader died")
	if rc.err != nil {
		t.Fatal(rc.err)
	}
	blocked(t, dch, "writer behind two readers")
	hb.Release(ctx)
	rc.h.Release(ctx)
	rd := arrives(t, dch, "writer")
	if rd.err != nil {
		t.Fatal(rd.err)
	}
	if rd.h.Token() <= rc.h.Token() {
		t.Fatalf("fencing: writer token %d not after reader token %d", rd.h.Token(), rc.h.Token())
	}
	if err := hu.Release(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("release of the dead upgrader: %v", err)
	}
	rd.h.Release(ctx)
	waitQueue(t, b, "vol", "")
}

// TestWriterNotStarved: readers that keep overlapping do not keep a
// queued writer out; readers arriving after it wait for it.
func TestWriterNotStarved(t *testing.T) {
	ctx := context.Background()
	p := testPrefix(t)
	w := locker(t, p, "w", 30)
	first := must(t)(locker(t, p, "r0", 30).Acquire(ctx, "vol", Read))
	wch := acquireAsync(ctx, w, "vol", Write)
	waitQueue(t, w, "vol", "r0:read w:write")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var during []string
	for i := 0; i < 4; i++ {
		l := locker(t, p, fmt.Sprintf("r%d", i+1), 30)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				h, err := l.Acquire(ctx, "vol", Read)
				if err != nil {
					return
				}
				if h.Mode() == Read {
					mu.Lock()
					during = append(during, "r")
					mu.Unlock()
				}
				time.Sleep(30 * time.Millisecond)
				h.Release(ctx)
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	first.Release(ctx)
	rw := arrives(t, wch, "writer behind a stream of readers")
	if rw.err != nil {
		t.Fatal(rw.err)
	}
	mu.Lock()
	n := len(during)
	mu.Unlock()
	if n != 0 {
		t.Errorf("%d readers granted after the writer queued", n)
	}
	rw.h.Release(ctx)
	close(stop)
	wg.Wait()
}

// TestCompactedWatch: a wait whose watch starts at a compacted
// revision looks at the queue again instead of hanging, and a waiter
// across a compaction is still granted.
func TestCompactedWatch(t *testing.T) {
	ctx := context.Background()
	cli := testClient(t)
	p := testPrefix(t)
	a, b := locker(t, p, "a", 30), locker(t, p, "b", 30)
	ha := must(t)(a.Acquire(ctx, "vol", Write))
	bch := acquireAsync(ctx, b, "vol", Write)
	waitQueue(t, a, "vol", "a:write b:write")
	old := ha.Token()
	// Move the revision on and compact past the holder's creation.
	for i := 0; i < 3; i++ {
		if _, err := cli.Put(ctx, p+"filler", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.Get(ctx, p+"filler")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := a.sleep(sctx, ha.Key(), old); err != nil {
		t.Fatalf("sleep from a compacted revision: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("sleep from a compacted revision took %v", took)
	}
	ha.Release(ctx)
	rb := arrives(t, bch, "waiter across a compaction")
	if rb.err != nil {
		t.Fatal(rb.err)
	}
	rb.h.Release(ctx)
}

// TestCancelledWaitersLeaveNoKey: many waiters whose contexts end
// leave nothing in the queue.
func TestCancelledWaitersLeaveNoKey(t *testing.T) {
	ctx := context.Background()
	p := testPrefix(t)
	a := locker(t, p, "a", 30)
	ha := must(t)(a.Acquire(ctx, "vol", Write))
	var wg sync.WaitGroup
	for i := 0; i < 12; i++ {
		l := locker(t, p, fmt.Sprintf("c%d", i), 30)
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Duration(1+i*7)*time.Millisecond)
			defer cancel()
			if h, err := l.Acquire(cctx, "vol", Mode(1+i%3)); err == nil {
				h.Release(ctx)
			}
		}()
	}
	wg.Wait()
	waitQueue(t, a, "vol", "a:write")
	ha.Release(ctx)
	waitQueue(t, a, "vol", "")
}

// TestAcquireOnEndedSession: once a Locker's session has ended (its
// keepalives stopped: Done is closed) while its lease still lives on the
// server, Acquire and TryAcquire refuse with ErrLost and queue nothing: a
// request on a lease nobody renews would otherwise be granted already lost
// and keep other nodes out until the lease expires.
func TestAcquireOnEndedSession(t *testing.T) {
	ctx := context.Background()
	cli := testClient(t)
	p := testPrefix(t)
	dying := newSession(t, cli, 30)
	defer cli.Revoke(ctx, dying.Lease())
	a := New(dying, p, Options{Owner: "a", Log: quiet})
	b := locker(t, p, "b", 30)
	dying.Orphan() // keepalives stop; the lease lives on for its TTL
	<-a.Done()
	if h, err := a.Acquire(ctx, "vol", Write); !errors.Is(err, ErrLost) {
		t.Errorf("Acquire on an ended session: %v, %v", h, err)
	}
	if h, err := a.TryAcquire(ctx, "vol", Read); !errors.Is(err, ErrLost) {
		t.Errorf("TryAcquire on an ended session: %v, %v", h, err)
	}
	if got := queueStates(t, b, "vol"); got != "" {
		t.Fatalf("queue after requests on an ended session: %q", got)
	}
	hb, err := b.TryAcquire(ctx, "vol", Write)
	if err != nil {
		t.Fatalf("the ended session's request keeps others out: %v", err)
	}
	hb.Release(ctx)
}
