package volume

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

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
	if holder, _, err := s.leases.acquire(ctx, v.ID); err != nil || holder != s.cfg.Node {
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

// TestLeaseReleasedElsewhere: a write lease released through a node other
// than its holder (the volume's rw attachment detached there) passes on
// only once the holder has stopped writing: at once when the holder hears
// of the release — it fences its stacks and then deletes the key — and,
// when the holder is cut off (here: a node that took the lease and then
// neither renews nor watches, as behind a partition), not before the
// holder's own lease validity has ended.
func TestLeaseReleasedElsewhere(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	b := e.started(Config{Node: uniq("b")})
	alice := caller("alice")
	v, err := b.CreateVolume(ctx, alice, CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	attach := func(s *Service, v *meta.Volume) *meta.Attachment {
		t.Helper()
		a, err := s.Attach(ctx, alice, v.ID, "host", meta.ModeRW)
		if err != nil {
			t.Fatal(err)
		}
		if h, err := e.meta.VolumeLeaseHolder(ctx, v.ID); err != nil || h == nil || h.Node != s.cfg.Node {
			t.Fatalf("holder after attaching through %s: %+v %v", s.cfg.Node, h, err)
		}
		return a
	}
	// open is a writer's stack's fence on s: nil while s may write v.
	open := func(s *Service, v *meta.Volume) func() error { return writerFence(t, s, v.ID) }

	// A holder that hears of the release hands the lease over at once,
	// having fenced itself.
	a1 := e.started(Config{Node: uniq("a")})
	att := attach(a1, v)
	fence1 := open(a1, v)
	if err := b.Detach(ctx, alice, att.ID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		h, err := e.meta.VolumeLeaseHolder(ctx, v.ID)
		if err != nil {
			t.Fatal(err)
		}
		if h == nil {
			break
		}
		if time.Since(start) > leaseTTL-leaseMargin {
			t.Fatalf("%s still holds the lease %v after its release through %s", h.Node, time.Since(start), b.cfg.Node)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := fence1(); !errors.Is(err, block.ErrFenced) {
		t.Fatalf("the holder's lease key is gone, its stack's fence says %v", err)
	}
	// a1 is done with: running, it may take the lease of the next rw
	// attachment before a2 does (it did, once in CI), and the part below
	// is about a2 and b.
	a1.Stop()
	// And so is v: the handover's key deletion sent b (as every node) to
	// take v over should it still have an rw attachment, after a random
	// pause and a read of the volume — which, on a loaded host, may come
	// only once a2 has attached it again, and then b wins the lease (it
	// did, under CPU contention). The part below is about a lease a2
	// holds; a volume whose key was never deleted has no such takeover
	// pending.
	v, err = b.CreateVolume(ctx, alice, CreateVolume{Name: "v2", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}

	// A holder that cannot hear keeps the lease until its validity ends.
	a2 := e.service(Config{Node: uniq("a")})
	a2.leases.renew(ctx) // its etcd lease, renewed never again
	att = attach(a2, v)
	fence2 := open(a2, v)
	if err := b.Detach(ctx, alice, att.ID); err != nil {
		t.Fatal(err)
	}
	// A new rw attachment through b: b asks for the lease (and fails).
	if _, err := b.Attach(ctx, alice, v.ID, "host2", meta.ModeRW); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for i := 0; ; i++ {
		_, _, err := b.leases.acquire(ctx, v.ID)
		h, herr := e.meta.VolumeLeaseHolder(ctx, v.ID)
		writes := fence2() == nil
		if herr != nil {
			t.Fatal(herr)
		}
		if h != nil && h.Node != a2.cfg.Node {
			if writes {
				t.Fatalf("%s took the lease over while its holder %s, cut off, may still write", h.Node, a2.cfg.Node)
			}
			break
		}
		if i == 0 && (!errs.IsCode(err, CodeWriteLeaseHandover) || !writes) {
			t.Fatalf("right after the release: acquire %v (want %s), holder writes %v", err, CodeWriteLeaseHandover, writes)
		}
		if time.Since(start) > leaseTTL+5*time.Second {
			t.Fatalf("the lease of %s never expired", a2.cfg.Node)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReleaseStopsWritingFirst: the holder giving its lease up (the
// volume's last rw attachment detached) deletes the lease key — letting
// another node take the volume — only after the writes already under way
// here have ended (one stalled in the file system must not land after the
// next holder's first write), and fences its stacks before it does.
func TestReleaseStopsWritingFirst(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	att, err := s.Attach(ctx, alice, v.ID, "host", meta.ModeRW)
	if err != nil {
		t.Fatal(err)
	}
	if h, _, err := s.leases.acquire(ctx, v.ID); err != nil || h != s.cfg.Node {
		t.Fatalf("acquire: %q %v", h, err)
	}
	check := writerFence(t, s, v.ID)
	// A write in flight: past the fence, holding the gate's read side.
	gate, drop := s.gate(v.ID)
	defer drop()
	gate.RLock()
	detached := make(chan error, 1)
	go func() { detached <- s.Detach(ctx, alice, att.ID) }()
	time.Sleep(300 * time.Millisecond)
	if h, err := e.meta.VolumeLeaseHolder(ctx, v.ID); err != nil || h == nil || h.Node != s.cfg.Node {
		t.Fatalf("with a write in flight the lease key is %+v (%v); want it still %s's", h, err, s.cfg.Node)
	}
	select {
	case err := <-detached:
		t.Fatalf("the detach returned (%v) while a write was in flight", err)
	default:
	}
	gate.RUnlock()
	if err := <-detached; err != nil {
		t.Fatal(err)
	}
	if h, err := e.meta.VolumeLeaseHolder(ctx, v.ID); err != nil || h != nil {
		t.Fatalf("after the write ended and the detach returned, the lease is %+v (%v)", h, err)
	}
	if err := check(); !errors.Is(err, block.ErrFenced) {
		t.Fatalf("the lease was given up; the stack's fence says %v", err)
	}
	cleanupAll(t, s, alice)
}

// slowFlush is a test layer whose Flush waits for flushGo (flushing says
// one began).
type slowFlush struct{ block.Layer }

// flushing and flushGo are made anew by each run of the test that uses
// them: a run closes flushGo, and under -count=N a later run's flush
// would not wait on it (nor would a stale send on flushing mean that this
// run's flush began).
var flushing, flushGo chan struct{}

func (l slowFlush) Flush() error {
	flushing <- struct{}{}
	<-flushGo
	return l.Layer.Flush()
}

func (l slowFlush) Children() []block.Layer { return []block.Layer{l.Layer} }

func init() {
	registerWrapper("testslowflush", "its flush waits for flushGo", func(c block.Layer) block.Layer { return slowFlush{c} })
}

// TestGiveUpWaitsForClosingFlush: the holder giving its lease up while its
// stack's last user is closing it (the final flush under way) waits for
// that flush, which must not be fenced: the writes it makes durable were
// acknowledged.
func TestGiveUpWaitsForClosingFlush(t *testing.T) {
	flushing, flushGo = make(chan struct{}, 10), make(chan struct{})
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	vv := e.volume(v.ID)
	vv.Stack = json.RawMessage(`{"type":"testslowflush","children":[` + string(vv.Stack) + `]}`)
	h, tok, err := s.leases.acquire(ctx, v.ID)
	if err != nil || h != s.cfg.Node {
		t.Fatalf("acquire: %q %v", h, err)
	}
	l, release, err := s.acquireWriter(vv, tok)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteAt(bytes.Repeat([]byte{7}, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { release(); close(closed) }() // the last reference: the final flush, then close
	<-flushing
	released := make(chan struct{})
	go func() { s.leases.release(ctx, v.ID); close(released) }()
	select {
	case <-released:
		t.Fatal("the lease was given up while the stack's final flush was under way")
	case <-time.After(300 * time.Millisecond):
	}
	close(flushGo)
	<-closed
	<-released
	if h, err := e.meta.VolumeLeaseHolder(ctx, v.ID); err != nil || h != nil {
		t.Fatalf("lease after the release: %+v %v", h, err)
	}
	if got := e.readAt(s, v.ID, 0, 4096); !bytes.Equal(got, bytes.Repeat([]byte{7}, 4096)) {
		t.Fatal("the write acknowledged before the lease was given up is gone")
	}
	cleanupAll(t, s, alice)
}

// TestWriterOpenedAfterLeaseLost: a workflow that took the volume's lease,
// lost it (its node's etcd lease ended) and only then opens the volume's
// stack may not write it — another node holds the lease now — even though
// the stack it opens was never registered while the lease was held.
func TestWriterOpenedAfterLeaseLost(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	a := e.started(Config{Node: uniq("a"), ImageGrace: time.Hour})
	b := e.started(Config{Node: uniq("b"), ImageGrace: time.Hour})
	v, err := a.CreateVolume(ctx, caller("alice"), CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	holder, token, err := a.leases.use(ctx, v.ID) // a workflow on a takes the lease
	if err != nil || holder != a.cfg.Node {
		t.Fatalf("use: %s, %v", holder, err)
	}
	defer a.leases.unuse(context.Background(), v.ID)
	leaseLostTo(t, e, a, b, v.ID)
	if l, release, err := a.acquireWriter(e.volume(v.ID), token); err == nil {
		werr := l.WriteAt(make([]byte, 4096), 0, true)
		release()
		t.Fatalf("a opened the volume as its writer after losing the lease (its write: %v)", werr)
	} else if !errors.Is(err, errLeaseLost) {
		t.Fatalf("a's open: %v, want %v", err, errLeaseLost)
	}
}

// TestServingNodesOneRead: the nodes serving many attachments, as a list
// of them renders their URIs, come from one read of the write leases of
// the list's volumes, not one read per attachment (500 attachments took
// 500 reads, most of a list's time); each answer is what ServingNode
// alone says.
func TestServingNodesOneRead(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	alice := caller("alice")
	const k = 12
	var as []*meta.Attachment
	for i := range k {
		v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		mode := meta.ModeRW
		if i%3 == 2 {
			mode = meta.ModeRO
		}
		a, err := s.Attach(ctx, alice, v.ID, "hv1", mode)
		if err != nil {
			t.Fatal(err)
		}
		as = append(as, a)
	}
	// One rw attachment whose volume's lease nobody holds now (as after
	// a restart): a list names this node for it and takes nothing.
	s.leases.release(ctx, as[0].VolumeID)
	var reads atomic.Int64
	old := leaseHolder
	leaseHolder = func(m *meta.Store, ctx context.Context, vol string) (*meta.VolumeLease, error) {
		reads.Add(1)
		return old(m, ctx, vol)
	}
	t.Cleanup(func() { leaseHolder = old })
	// The list's volumes but one with an rw attachment, read alone.
	var vols []string
	for i, a := range as {
		if i != 1 {
			vols = append(vols, a.VolumeID)
		}
	}
	lctx := WithServingNodes(ctx, vols)
	for _, a := range as {
		node, err := s.ServingNode(lctx, a)
		if err != nil || node != s.cfg.Node {
			t.Errorf("attachment %s (%s): served by %q, %v; want %s", a.ID, a.Mode, node, err, s.cfg.Node)
		}
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("%d attachments: %d reads of one volume's lease holder, want the leases read once for all the list names (and once for the one it does not)", k, n)
	}
	if h, err := s.meta.VolumeLeaseHolder(ctx, as[0].VolumeID); err != nil || h != nil {
		t.Errorf("a list took the unheld lease (a read that writes): %+v, %v", h, err)
	}
	// Asked alone (attachment show), the lease is taken: the URI shown
	// is where the lease is.
	if node, err := s.ServingNode(ctx, as[0]); err != nil || node != s.cfg.Node {
		t.Errorf("attachment %s alone: served by %q, %v; want %s", as[0].ID, node, err, s.cfg.Node)
	}
	if h, err := s.meta.VolumeLeaseHolder(ctx, as[0].VolumeID); err != nil || h == nil || h.Node != s.cfg.Node {
		t.Errorf("the unheld lease was not taken by a show: %+v, %v", h, err)
	}
	for _, a := range as {
		if err := s.Detach(ctx, alice, a.ID); err != nil {
			t.Fatal(err)
		}
	}
	cleanupAll(t, s, alice)
}

// leaseLostTo ends a's etcd lease, waits until a knows it lost vol's write
// lease, and has b take it.
func leaseLostTo(t *testing.T, e *env, a, b *Service, vol string) {
	t.Helper()
	ctx := ctxT(t)
	a.leases.mu.Lock()
	id := a.leases.id
	a.leases.mu.Unlock()
	if err := e.meta.RevokeLease(ctx, id); err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		a.leases.mu.Lock()
		_, held := a.leases.held[vol]
		a.leases.mu.Unlock()
		if !held {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("a never noticed it lost the lease")
		}
	}
	if h, _, err := b.leases.acquire(ctx, vol); err != nil || h != b.cfg.Node {
		t.Fatalf("b acquire: %s, %v", h, err)
	}
}

// writerFence registers the fence of a stack opened on s as vol's writer,
// under the lease s holds now, and returns its check: nil while a write
// through it would be let through.
func writerFence(t *testing.T, s *Service, vol string) func() error {
	t.Helper()
	s.leases.mu.Lock()
	token := s.leases.held[vol]
	s.leases.mu.Unlock()
	if token == 0 {
		t.Fatalf("%s holds no lease of %s", s.cfg.Node, vol)
	}
	f, forget := s.leases.fenceFor(vol, token)
	t.Cleanup(forget)
	return func() error {
		if err := f.Enter(); err != nil {
			return err
		}
		f.Exit()
		return nil
	}
}
