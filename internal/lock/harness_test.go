package lock

// The harness drives the real, etcd-backed service step by step, with the
// same internal methods Acquire and Upgrade loop over (enqueue, evaluate,
// poll, beginUpgrade, settle), and checks it against the model after every
// step:
//   - the outcome of the step is the model's;
//   - every client is in the model's state, and the etcd queue holds exactly
//     the model's requests, in the model's order, in the model's modes;
//   - liveness: a waiter the model would grant now has been woken (the key
//     it watches changed), so the real Acquire loop would look again.
// Waiters look (poll) only when the script or the enumeration says so; the
// exhaustive test offers "poll" exactly to the woken ones, which is what the
// real loop does. A reader that finds only update keys in its way records
// its admission in a separate step ("admit"), so that other clients' steps
// can come between its look and its admission, as they can in reality.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/meta/metatest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func TestMain(m *testing.M) { metatest.Main(m) }

var testSeq atomic.Int64

// testPrefix gives each test its own key space in the shared member.
func testPrefix(t testing.TB) string {
	return fmt.Sprintf("/basalt-test/locks/%s-%d/", strings.ReplaceAll(t.Name(), "/", "_"), testSeq.Add(1))
}

func testClient(t testing.TB) *clientv3.Client {
	return metatest.Shared(t).Meta.Client()
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newSession opens a session with a short TTL: a leaked test lease goes away.
func newSession(t testing.TB, cli *clientv3.Client, ttl int) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
	if err != nil {
		t.Fatalf("new session: %v", err)
	}
	return s
}

type hclient struct {
	sess *concurrency.Session
	l    *Locker
	w    *waiter   // pending acquire
	h    *Held     // held (also while upgrading)
	u    *upgrader // pending upgrade
}

type harness struct {
	t        testing.TB
	ctx      context.Context
	cli      *clientv3.Client
	prefix   string
	resource string
	cs       []*hclient
	m        model
	trace    []string
	// last is the queue as check last read it (nil: read it again).
	last []entry
}

func newHarness(t testing.TB, n int) *harness {
	h := &harness{t: t, ctx: context.Background(), cli: testClient(t), prefix: testPrefix(t)}
	for i := 0; i < n; i++ {
		h.cs = append(h.cs, h.newClient(i))
	}
	return h
}

func (h *harness) newClient(i int) *hclient {
	s := newSession(h.t, h.cli, 30)
	return &hclient{sess: s, l: New(s, h.prefix, Options{Owner: clientName(i), Log: quiet})}
}

// reset starts a fresh run on a new resource: the model is empty and no
// client has anything (the old resource's keys are deleted).
func (h *harness) reset(resource string) {
	if h.resource != "" {
		if _, err := h.cli.Delete(h.ctx, h.prefix+h.resource+"/", clientv3.WithPrefix()); err != nil {
			h.t.Fatalf("cleanup: %v", err)
		}
	}
	h.resource, h.m, h.trace, h.last = resource, model{}, nil, nil
	for _, c := range h.cs {
		c.w, c.h, c.u = nil, nil, nil
	}
}

func (h *harness) close() {
	h.reset("")
	for _, c := range h.cs {
		c.sess.Close()
	}
}

func (h *harness) fail(format string, args ...any) error {
	return fmt.Errorf("after\n\t%s\n%s", strings.Join(h.trace, "\n\t"), fmt.Sprintf(format, args...))
}

// real performs o on etcd and returns its outcome.
func (h *harness) real(o op) (string, error) {
	c := h.cs[o.client]
	ctx := h.ctx
	switch o.kind {
	case opAcquire:
		w, err := c.l.enqueue(ctx, h.resource, o.mode)
		if err != nil {
			return "", err
		}
		c.w = w
		return c.waiterOutcome(), nil
	case opTry:
		held, err := c.l.TryAcquire(ctx, h.resource, o.mode)
		if errors.Is(err, ErrConflict) {
			return "conflict", nil
		}
		if err != nil {
			return "", err
		}
		c.h = held
		return "granted", nil
	case opPoll:
		switch {
		case c.w != nil && !c.w.admitting:
			if err := c.w.poll(ctx); err != nil {
				return "", err
			}
			return c.waiterOutcome(), nil
		case c.u != nil:
			if err := c.u.poll(ctx); err != nil || !c.u.done {
				return "waits", err
			}
			c.h.mode, c.u = Write, nil
			return "granted", nil
		}
		return "", errors.New("nothing to poll")
	case opAdmit:
		if c.w == nil || !c.w.admitting {
			return "", errors.New("not admitting")
		}
		if err := c.w.admit(ctx); err != nil {
			return "", err
		}
		return c.waiterOutcome(), nil
	case opCancel:
		switch {
		case c.w != nil:
			c.w.abandon(ctx)
			c.w = nil
		case c.u != nil:
			c.u.revert(ctx)
			c.u = nil
		default:
			return "", errors.New("nothing to cancel")
		}
		return "ok", nil
	case opRelease:
		err := c.h.Release(ctx)
		c.h = nil
		return "ok", err
	case opKill:
		// The node dies: no release, no withdrawal; its lease goes.
		c.sess.Orphan()
		if _, err := h.cli.Revoke(ctx, c.sess.Lease()); err != nil {
			return "", err
		}
		if c.h != nil {
			select {
			case <-c.h.Lost():
			case <-time.After(5 * time.Second):
				return "", errors.New("Held.Lost not closed after the session died")
			}
		}
		*c = *h.newClient(o.client)
		return "ok", nil
	case opUpgrade:
		u, err := c.h.beginUpgrade(ctx)
		if err != nil {
			return "", err
		}
		if u.done {
			c.h.mode = Write
			return "granted", nil
		}
		c.u = u
		return "waits", nil
	case opTryUpgrade:
		err := c.h.TryUpgrade(ctx)
		if errors.Is(err, ErrConflict) {
			return "conflict", nil
		}
		return "granted", err
	}
	return "", fmt.Errorf("unknown op %v", o)
}

// waiterOutcome turns a look at the queue into an outcome: granted (the
// client now holds), admits (a reader that must still record its
// admission), waits.
func (c *hclient) waiterOutcome() string {
	switch {
	case c.w.granted:
		c.h, c.w = c.w.held(), nil
		return "granted"
	case c.w.admitting:
		return "admits"
	}
	return "waits"
}

// state describes client c of the real service in the model's words.
func (h *harness) state(i int) string {
	c := h.cs[i]
	switch {
	case c.w != nil:
		return "waits " + c.w.mode.String()
	case c.u != nil:
		return "upgrading"
	case c.h != nil:
		return "holds " + c.h.mode.String()
	}
	return "idle"
}

// do applies o to the model and the real service and checks them.
func (h *harness) do(o op) (string, error) { return h.step(o, true) }

// step is do, optionally without the full check (replaying a prefix that
// was checked before); outcomes are compared all the same.
func (h *harness) step(o op, full bool) (string, error) {
	h.last = nil
	h.trace = append(h.trace, o.String())
	want, err := h.m.apply(o)
	if err != nil {
		return "", h.fail("model refuses %v: %v", o, err)
	}
	got, err := h.real(o)
	if err != nil {
		return "", h.fail("%v: %v", o, err)
	}
	if got == "admits" && want == "granted" {
		// The model grants at once what the real reader grants itself in
		// one more step, admit, which the model treats as a poll: until
		// then the request is waiting.
		h.m.q[h.m.find(o.client)].st = mWaiting
		want = got
	}
	if got != want {
		return got, h.fail("%v: got %s, model says %s", o, got, want)
	}
	h.trace[len(h.trace)-1] += " -> " + got
	if !full {
		return got, nil
	}
	return got, h.check()
}

// check compares the real service with the model.
func (h *harness) check() error {
	if err := h.m.check(); err != nil {
		return h.fail("%v", err)
	}
	for i := range h.cs {
		if got, want := h.state(i), h.m.state(i); got != want {
			return h.fail("client %s: real %q, model %q", clientName(i), got, want)
		}
	}
	q, err := h.snapshot()
	if err != nil {
		return h.fail("%v", err)
	}
	h.last = q
	got := queueNames(q)
	var want []string
	for _, e := range h.m.q {
		md := e.mode
		if e.st == mUpgrading {
			md = Write
		}
		want = append(want, clientName(e.client)+":"+md.String())
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		return h.fail("etcd queue [%s], model [%s]", strings.Join(got, " "), strings.Join(want, " "))
	}
	woken := h.wokenIn(q)
	for i, e := range h.m.q {
		if e.st != mHeld && h.m.grantable(i) && !woken[e.client] {
			return h.fail("liveness: model grants %s now, but the key it watches has not changed",
				clientName(e.client))
		}
	}
	return nil
}

// snapshot reads the resource's queue in one request.
func (h *harness) snapshot() ([]entry, error) {
	resp, err := h.cli.Get(h.ctx, h.prefix+h.resource+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	return parseQueue(resp.Kvs)
}

// current is the queue as the last check read it, or read now.
func (h *harness) current() ([]entry, error) {
	if h.last != nil {
		return h.last, nil
	}
	q, err := h.snapshot()
	if err == nil {
		h.last = q
	}
	return q, err
}

// queue lists the etcd queue as client:mode in create order.
func (h *harness) queue() ([]string, error) {
	q, err := h.snapshot()
	if err != nil {
		return nil, err
	}
	return queueNames(q), nil
}

func queueNames(q []entry) []string {
	var out []string
	for _, e := range q {
		out = append(out, e.rec.Owner+":"+e.mode.String())
	}
	return out
}

// woken tells which pending clients the real loop would wake: the key they
// watch changed after the revision they watch from.
func (h *harness) woken() (map[int]bool, error) {
	q, err := h.snapshot()
	if err != nil {
		return nil, err
	}
	return h.wokenIn(q), nil
}

func (h *harness) wokenIn(q []entry) map[int]bool {
	out := map[int]bool{}
	for i, c := range h.cs {
		key, rev, ok := c.watch()
		if !ok {
			continue
		}
		out[i] = true
		if c.w != nil && c.w.admitting {
			continue // not asleep: its next step is admit
		}
		for _, e := range q {
			if e.key == key && e.mod <= rev {
				out[i] = false
			}
		}
	}
	return out
}

// watch is what a pending client's real loop would be watching.
func (c *hclient) watch() (key string, rev int64, ok bool) {
	switch {
	case c.w != nil:
		return c.w.watchKey, c.w.watchRev, true
	case c.u != nil:
		return c.u.watchKey, c.u.watchRev, true
	}
	return "", 0, false
}

// parseOp reads "a acquire read", "b poll", ...
func parseOp(line string) (op, error) {
	f := strings.Fields(line)
	if len(f) < 2 || len(f[0]) != 1 || f[0][0] < 'a' || f[0][0] > 'z' {
		return op{}, fmt.Errorf("bad command %q", line)
	}
	o := op{client: int(f[0][0] - 'a'), kind: -1}
	for k, n := range opNames {
		if n == f[1] {
			o.kind = k
		}
	}
	switch {
	case o.kind < 0:
		return op{}, fmt.Errorf("unknown operation %q", f[1])
	case (o.kind == opAcquire || o.kind == opTry) != (len(f) == 3), len(f) > 3:
		return op{}, fmt.Errorf("bad arguments in %q", line)
	case len(f) == 3:
		md, err := ParseMode(f[2])
		if err != nil {
			return op{}, err
		}
		o.mode = md
	}
	return o, nil
}
