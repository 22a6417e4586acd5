package volume

// Write leases: a volume with read-write attachments is written by exactly
// one node, the holder of its lease (meta/leases.go), which serves its rw
// attachments over NBD.
//
// Safety: the holder stops writing before any other node can take over.
// The node renews its etcd lease (TTL leaseTTL) every leaseRenew; after a
// renewal sent at time t succeeds, the leader keeps the lease at least
// until t + leaseTTL (it can only extend it: a new leader restarts every
// lease's TTL), so another node can create the volume's lease key — the
// takeover — only after that. The holder writes only until
// t + leaseTTL − leaseMargin (monotonic clock), checked at the bottom of
// the stack before every write (block.Env.Fence). A partitioned holder
// therefore fences itself at least leaseMargin before a takeover is even
// possible; the margin covers clock rate differences and a write that
// passed the check just before.
//
// Handover: the lease key leaves its holder only (a) by the holder's own
// doing — the volume's last rw attachment detached through it or a
// handover, each after it waited out the writes in flight (NBD's, which
// hold the volume's gate), flushed, fenced itself, and waited out the
// writes its stacks' fences had let through (a resync's, a job's: giveUp);
// a clean stop (its etcd lease revoked) — or
// (b) with the holder's etcd lease, which etcd ends no earlier than
// leaseTTL after the last renewal the holder sent, so at least
// leaseMargin after the holder fenced itself. No other node deletes the
// key: one through which the volume's last rw attachment is detached only
// marks it released (meta.ReleaseVolumeLease). The holder, seeing the
// mark, fences its stacks for good, closes the volume's rw connections,
// and then deletes the key (handOver): the handover is immediate. A holder
// cut off from etcd never sees the mark and keeps writing while its lease
// is valid; its key stays until its etcd lease expires. A node asked for
// a released lease another node holds is refused (CodeWriteLeaseHandover)
// until then.
//
// Invariant: while a node may still write a volume as its lease holder
// (its fence lets writes through), the volume's lease key exists, so no
// other node can take the lease.
//
// Liveness: every node watches lease keys; when one vanishes (the holder
// died or was cut off, or handed it over), a node takes over if the volume
// still has rw attachments, so `attachment show` names a live node about
// leaseTTL after the death. A holder that lost a lease drops its open
// stack (its in-memory state may be stale) and closes the volume's NBD
// connections; clients reconnect to the new holder. A holder that hears of
// a mark retries its handover until it succeeds: otherwise, renewing its
// etcd lease, it would keep the key for ever.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

const (
	leaseTTL    = 5 * time.Second
	leaseRenew  = time.Second
	leaseMargin = 1500 * time.Millisecond
)

// Error codes of write leases. Stable: add, never rename.
const (
	// CodeServedElsewhere: the attachment is served by another node,
	// its volume's writer (409): a rw attachment's, or an ro one's of a
	// multiattach volume (ServingNode).
	CodeServedElsewhere = "ServedByAnotherNode"
	// CodeWriteLeaseHandover: the volume's write lease was released
	// through another node than its holder, which may still write it
	// until it hands the lease over or its lease expires (503; retry).
	CodeWriteLeaseHandover = "WriteLeaseHandover"
)

type leases struct {
	s *Service

	mu    sync.Mutex
	id    int64     // the node's etcd lease (0: none yet)
	valid time.Time // writes allowed before this (monotonic)
	held  map[string]int64
	// changing serialises, per volume, this node's changes of the
	// volume's lease key (acquire, release, handOver): a handover must
	// not delete a key an acquisition here has just made its own again.
	changing keyed[sync.Mutex]
	// fences of the stacks open on this node, by volume: a lost lease
	// fences them for good.
	fences map[string][]*stackFence
	lost   []func(vol string)
	// elsewhere are called when another node takes a volume's lease.
	elsewhere []func(vol string)
	// keyMade, if set (by tests), is called as an acquisition here has
	// made the lease key its own, before it records the lease as held.
	keyMade func(vol string)
	// users counts, by volume, the workflows running here on the
	// volume's lease (use: jobs, freezes, extends): while one runs, the
	// lease is not given up.
	users map[string]int
}

// stackFence is one open stack's fence, or (with cancel) a workflow's
// watch on the lease (watchLoss).
type stackFence struct {
	lost   atomic.Bool
	cancel context.CancelCauseFunc
	// inflight counts a stack's writes its fence let through and that
	// are not done yet (leaseFence).
	inflight atomic.Int64
}

// errLeaseLost is why a workflow's context ends when this node loses the
// volume's write lease under it.
var errLeaseLost = errors.New("this node lost the volume's write lease (another node may write it now); start the job again")

// watchLoss cancels (errLeaseLost) the context of a workflow running on
// vol's lease here as soon as the lease is lost; stop forgets the watch.
// A job fails at its next write anyway (the fence), but one that only
// reads — a scrub — would go on over a stack another node may change.
func (l *leases) watchLoss(vol string, cancel context.CancelCauseFunc) (stop func()) {
	f := &stackFence{cancel: cancel}
	l.mu.Lock()
	_, held := l.held[vol]
	if held {
		l.fences[vol] = append(l.fences[vol], f)
	}
	l.mu.Unlock()
	if !held {
		cancel(errLeaseLost) // lost already, since use
	}
	return func() { l.forget(vol, f) }
}

func newLeases(s *Service) *leases {
	return &leases{s: s, held: map[string]int64{}, fences: map[string][]*stackFence{}, users: map[string]int{}}
}

// lockChange locks the mutex that serialises this node's changes of vol's
// lease key, and returns its unlock.
func (l *leases) lockChange(vol string) (unlock func()) {
	return lockKey(&l.changing, vol)
}

// onLost registers fn, called (without locks held) when a lease is lost.
func (l *leases) onLost(fn func(vol string)) {
	l.mu.Lock()
	l.lost = append(l.lost, fn)
	l.mu.Unlock()
}

// onElsewhere registers fn, called (without locks held) when another
// node takes a volume's lease (as the watch reports it: also for every
// lease held elsewhere when the watch starts).
func (l *leases) onElsewhere(fn func(vol string)) {
	l.mu.Lock()
	l.elsewhere = append(l.elsewhere, fn)
	l.mu.Unlock()
}

// run keeps the node's etcd lease renewed, takes over volumes whose
// holder went away and hands over those released elsewhere, until ctx
// ends.
func (l *leases) run(ctx context.Context) {
	go l.s.meta.WatchVolumeLeases(ctx, func(ev meta.VolumeLeaseEvent) {
		switch {
		case ev.Lease == nil:
			go l.takeOver(ctx, ev.Volume, ev.Rev)
		case ev.Lease.Released && ev.Lease.Node == l.s.cfg.Node:
			go l.handOver(ctx, ev.Volume)
		case !ev.Lease.Released && ev.Lease.Node != l.s.cfg.Node:
			l.mu.Lock()
			fns := l.elsewhere
			l.mu.Unlock()
			for _, fn := range fns {
				fn(ev.Volume)
			}
		}
	})
	t := time.NewTicker(leaseRenew)
	defer t.Stop()
	for {
		l.renew(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// stop revokes the node's etcd lease, so that other nodes take its volumes
// over at once. Call it after the volumes' stacks are flushed and closed.
func (l *leases) stop() {
	l.mu.Lock()
	id := l.id
	l.id, l.valid = 0, time.Time{}
	clear(l.held)
	for _, fs := range l.fences { // a straggler opened or closing now writes nothing
		for _, f := range fs {
			f.lost.Store(true)
		}
	}
	clear(l.fences)
	l.mu.Unlock()
	if id != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		l.s.meta.RevokeLease(ctx, id)
		cancel()
	}
}

func (l *leases) renew(ctx context.Context) {
	l.mu.Lock()
	id := l.id
	l.mu.Unlock()
	if id == 0 {
		sent := time.Now()
		nid, err := l.s.meta.GrantLease(ctx, leaseTTL)
		if err != nil {
			return
		}
		l.mu.Lock()
		l.id, l.valid = nid, sent.Add(leaseTTL-leaseMargin)
		l.mu.Unlock()
		return
	}
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, leaseRenew)
	err := l.s.meta.RenewLease(rctx, id)
	cancel()
	switch {
	case err == nil:
		l.mu.Lock()
		if l.id == id {
			l.valid = sent.Add(leaseTTL - leaseMargin)
		}
		l.mu.Unlock()
	case errors.Is(err, meta.ErrLeaseGone):
		l.dropAll("the node's lease expired")
	}
	// Other errors (no quorum, partition): valid runs out by itself.
}

// dropAll forgets every held lease (the etcd lease is gone).
func (l *leases) dropAll(why string) {
	l.mu.Lock()
	l.id, l.valid = 0, time.Time{}
	var vols []string
	for v := range l.held {
		vols = append(vols, v)
	}
	l.mu.Unlock()
	for _, v := range vols {
		l.lose(v, why)
	}
}

// lose records that vol's lease is no longer this node's: the stacks open
// on it are fenced for good, and the onLost callbacks run.
func (l *leases) lose(vol, why string) {
	l.s.logFor("volume", vol).Warn("write lease lost; writes fenced", "why", why)
	l.fenceAll(vol)
}

// giveUp stops this node writing vol before it deletes its own lease key.
// It takes the volume's write gate, whose read side every write and flush
// through NBD holds (gated): those under way end, later ones wait. Then
// the live stack is flushed — what was acknowledged here is durable for
// the next holder — and fenced for good (the onLost callbacks drop it and
// close the volume's rw connections), so the writes that waited fail.
// Without the wait, a write stalled in the file system (an NFS server that
// does not answer for a while) could land after the next holder's first
// write. The caller holds vol's lockChange; no one holding the gate waits
// for that lock (workflows take use before the gate).
func (l *leases) giveUp(vol string) {
	defer l.s.closeGate(vol)()
	l.s.flushLive(vol)
	for _, f := range l.fenceAll(vol) {
		// Writes no gate holds (a mirror's resync, a job's copy) that
		// passed the fence before it closed.
		f.drain(l.s.logFor("volume", vol))
	}
}

// fenceAll fences the stacks open on vol for good, forgets the lease and
// runs the onLost callbacks. It returns the fences.
func (l *leases) fenceAll(vol string) []*stackFence {
	l.mu.Lock()
	delete(l.held, vol)
	fences := l.fences[vol]
	for _, f := range fences {
		f.lost.Store(true)
	}
	delete(l.fences, vol)
	fns := l.lost
	l.mu.Unlock()
	for _, f := range fences {
		if f.cancel != nil {
			f.cancel(errLeaseLost)
		}
	}
	for _, fn := range fns {
		fn(vol)
	}
	return fences
}

// fenceFor makes the block.Env.Fence of a stack of vol opened on this
// node by a workflow that took vol's lease with token, and the function
// that forgets it when the stack closes. Such a stack writes only while
// the lease is held here under that token and is valid: opening it
// writes already (a mirror resynchronises the regions its intent map
// marks, its close syncs that map), and a workflow that lost the lease
// before it opened the stack — its fence registered after the loss
// fenced the others — must not write the volume another node may hold
// by then, not even until acquireWriter's check refuses it. Once the
// lease is lost the stack never writes again; giving it up waits for
// the writes the fence let through (giveUp).
func (l *leases) fenceFor(vol string, token int64) (block.Fence, func()) {
	f := &leaseFence{l: l, vol: vol, token: token, stackFence: &stackFence{}}
	l.mu.Lock()
	l.fences[vol] = append(l.fences[vol], f.stackFence)
	l.mu.Unlock()
	return f, func() { l.forget(vol, f.stackFence) }
}

// leaseFence is a stack's fence (fenceFor).
type leaseFence struct {
	l     *leases
	vol   string
	token int64
	*stackFence
}

// Enter implements block.Fence. Counted before the check, and the check
// after: giveUp marks the fence lost before it looks at the count, so a
// write either sees the mark or is waited for.
func (f *leaseFence) Enter() error {
	f.inflight.Add(1)
	if err := f.check(); err != nil {
		f.inflight.Add(-1)
		return err
	}
	return nil
}

// Exit implements block.Fence.
func (f *leaseFence) Exit() { f.inflight.Add(-1) }

func (f *leaseFence) check() error {
	if f.lost.Load() {
		return block.ErrFenced
	}
	f.l.mu.Lock()
	cur, held := f.l.held[f.vol]
	valid := time.Now().Before(f.l.valid)
	f.l.mu.Unlock()
	if held && !valid {
		return block.ErrFenced // cut off: a takeover may be near
	}
	if cur != f.token {
		// The lease the stack was opened under is lost: for good (a
		// lease taken again here has another token).
		f.lost.Store(true)
		return block.ErrFenced
	}
	return nil
}

// drain waits until no write the fence let through is under way.
func (f *stackFence) drain(log *slog.Logger) {
	warned := false
	for start := time.Now(); f.inflight.Load() > 0; time.Sleep(time.Millisecond) {
		if !warned && time.Since(start) > 5*time.Second {
			log.Warn("giving the write lease up waits for a write still under way in the file system")
			warned = true
		}
	}
}

// forget drops fence f of vol.
func (l *leases) forget(vol string, f *stackFence) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fences[vol] = slices.DeleteFunc(l.fences[vol], func(x *stackFence) bool { return x == f })
	if len(l.fences[vol]) == 0 {
		delete(l.fences, vol)
	}
}

// acquire makes this node vol's writer if no other node is, and returns
// the holder's name and, held here, the lease's token (see writes). A
// lease another node holds but was released through a third is refused
// with CodeWriteLeaseHandover: its holder may still write.
func (l *leases) acquire(ctx context.Context, vol string) (string, int64, error) {
	defer l.lockChange(vol)()
	return l.acquireLocked(ctx, vol)
}

// acquireLocked is acquire with vol's lockChange held.
func (l *leases) acquireLocked(ctx context.Context, vol string) (string, int64, error) {
	l.mu.Lock()
	id := l.id
	ok := id != 0 && time.Now().Before(l.valid)
	l.mu.Unlock()
	if !ok {
		return "", 0, errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable, "this node holds no valid lease of the metadata cluster (no quorum?); it cannot take volume writes now")
	}
	got, err := l.s.meta.AcquireVolumeLease(ctx, vol, l.s.cfg.Node, id)
	var prev *meta.PreviousLeaseError
	if errors.As(err, &prev) {
		// This node restarted within the TTL: its previous run is dead
		// (node names are unique), so its leases go now rather than when
		// they expire.
		l.s.logFor("volume", vol).Info("revoking the write leases of this node's previous run")
		if err := l.s.meta.RevokeLease(ctx, prev.Lease); err != nil {
			return "", 0, err
		}
		got, err = l.s.meta.AcquireVolumeLease(ctx, vol, l.s.cfg.Node, id)
	}
	if err != nil {
		return "", 0, err
	}
	if got.Node != l.s.cfg.Node && got.Released {
		return "", 0, errs.New(errs.KindUnavailable, CodeWriteLeaseHandover,
			"the write lease of volume %s was released, but its holder, node %s, may still write the volume: the lease passes on as soon as that node hands it over, or within %v if it cannot be reached; retry",
			vol, got.Node, leaseTTL)
	}
	if got.Node != l.s.cfg.Node {
		return got.Node, 0, nil
	}
	if l.keyMade != nil {
		l.keyMade(vol)
	}
	l.mu.Lock()
	_, had := l.held[vol]
	if l.id != id {
		// The etcd lease the key was made on ended meanwhile (dropAll,
		// stop), and the key with it: another node may hold the volume
		// now. Recorded as held, the lease would pass this node's fence
		// on the next etcd lease's validity.
		l.mu.Unlock()
		return "", 0, errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"this node's lease of the metadata cluster ended while it took the write lease of volume %s; retry", vol)
	}
	l.held[vol] = got.Token
	l.mu.Unlock()
	if !had {
		l.s.logFor("volume", vol).Info("write lease acquired", "token", got.Token)
		l.s.failPassedSnapshots(ctx, vol)
	}
	return got.Node, got.Token, nil
}

// writes checks that this node may still write vol as the workflow that
// took vol's lease with token: the lease is still held here under that
// token (not lost, nor lost and taken again since) and valid. A workflow
// that opens the volume's stack after taking the lease checks it once
// the stack is open (acquireWriter): a stack opened after the lease was
// lost has a fence that knows no lease to lose — it holds the token
// (fenceFor), so that the open itself writes nothing then.
func (l *leases) writes(vol string, token int64) error {
	l.mu.Lock()
	held, ok := l.held[vol]
	valid := time.Now().Before(l.valid)
	l.mu.Unlock()
	if token == 0 || !ok || held != token || !valid {
		return fmt.Errorf("volume %s: %w", vol, errLeaseLost)
	}
	return nil
}

// acquireWriter is acquire (of v's live stack) for a workflow that took
// v's write lease with token and writes the stack: the lease is checked
// once the stack is open, so that from then on losing it fences the
// stack. A stack open read-only is refused: with StoreReadOnly when the
// store's file system was read-only at its open, with NotSupportedByType
// when a layer of the volume's type serves it read-only.
func (s *Service) acquireWriter(v *meta.Volume, token int64) (block.Layer, func(), error) {
	l, release, err := s.acquireAs(v, token)
	if err != nil {
		return nil, nil, err
	}
	if l.Capabilities().ReadOnly {
		release()
		if x, ok := l.(*exact); !ok || !x.storeRO {
			return nil, nil, errs.Invalid(errs.CodeNotSupportedByType,
				"volume %s (type %s) cannot be written: its layer stack serves it read-only", v.ID, v.Type)
		}
		if s.store.Check() == nil {
			// Opened while the store was read-only, it stays so while
			// anything uses it (docs/nbd.md).
			return nil, nil, errs.New(errs.KindUnavailable, errs.CodeStoreReadOnly,
				"volume %s is open read-only on this node: it was opened while the store's file system was read-only, and stays so until its current users (NBD connections, jobs) let go; the store is writable again", v.ID)
		}
		return nil, nil, errs.New(errs.KindUnavailable, errs.CodeStoreReadOnly,
			"volume %s is open read-only on this node, the store's file system being read-only (remounted read-only after an error?); nothing can write it until the file system is writable again", v.ID)
	}
	if err := s.leases.writes(v.ID, token); err != nil {
		release()
		return nil, nil, err
	}
	return l, release, nil
}

// use makes this node vol's writer for a job, as acquire, and returns the
// holder's name and the lease's token; held here, the lease stays here until the job's unuse,
// whatever rw attachments come and go meanwhile. A job must write a volume
// only as its lease holder: without the lease, another node could take it
// for an rw attachment and write the volume's files at the same time.
func (l *leases) use(ctx context.Context, vol string) (string, int64, error) {
	defer l.lockChange(vol)()
	holder, token, err := l.acquireLocked(ctx, vol)
	if err == nil && holder == l.s.cfg.Node {
		l.mu.Lock()
		l.users[vol]++
		l.mu.Unlock()
	}
	return holder, token, err
}

// asWriter takes vol's write lease for a workflow that changes its live
// stack here and must not be handed on (a delegated or resumed snapshot's
// freeze, an extend), and returns the function that ends that use and the
// lease's token (acquireWriter); another
// node writing the volume now is VolumeBusy. Take it before the volume's
// gate: a holder giving the lease up waits for the gate holding the
// volume's change lock, which use takes.
func (s *Service) asWriter(ctx context.Context, vol string) (func(), int64, error) {
	holder, token, err := s.useLease(ctx, vol)
	if err != nil {
		return nil, 0, err
	}
	if holder != s.cfg.Node {
		return nil, 0, errs.Conflict(errs.CodeVolumeBusy, "volume %s is written by node %s now, which must run this; retry", vol, holder)
	}
	return func() { s.leases.unuse(context.Background(), vol) }, token, nil
}

// unuse ends a job's use of vol's lease; with no job left on it, the lease
// is given up unless the volume has an rw attachment.
func (l *leases) unuse(ctx context.Context, vol string) {
	defer l.lockChange(vol)()
	l.mu.Lock()
	l.users[vol]--
	left := l.users[vol]
	if left == 0 {
		delete(l.users, vol)
	}
	_, held := l.held[vol]
	l.mu.Unlock()
	if left > 0 || !held {
		return // still used, or lost meanwhile (and maybe another node's now)
	}
	v, err := l.s.meta.Volume(ctx, vol)
	if err == nil && hasRW(ctx, l.s, v) || err != nil && !errs.IsCode(err, errs.CodeNotFound) {
		return // needed (or unknown: keep it; the next detach decides)
	}
	l.releaseLocked(ctx, vol)
}

// heldVolumes returns the volumes whose lease this node holds.
func (l *leases) heldVolumes() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	vols := make([]string, 0, len(l.held))
	for v := range l.held {
		vols = append(vols, v)
	}
	return vols
}

// inUse reports whether a workflow here runs on vol's lease.
func (l *leases) inUse(vol string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.users[vol] > 0
}

// release gives vol's lease up: its last rw attachment is gone. Held
// here, the key goes as soon as this node has stopped writing (giveUp),
// unless a job here still uses it (its unuse gives it up); held by another
// node, it is only marked released, and that node hands it over
// (handOver) or loses it with its etcd lease.
func (l *leases) release(ctx context.Context, vol string) {
	defer l.lockChange(vol)()
	l.mu.Lock()
	_, held := l.held[vol]
	busy := held && l.users[vol] > 0
	l.mu.Unlock()
	if busy {
		return
	}
	l.releaseLocked(ctx, vol)
}

// releaseLocked is release with vol's lockChange held.
func (l *leases) releaseLocked(ctx context.Context, vol string) {
	l.mu.Lock()
	_, held := l.held[vol]
	id := l.id
	l.mu.Unlock()
	if held {
		l.giveUp(vol)
	}
	if err := l.s.meta.ReleaseVolumeLease(ctx, vol, l.s.cfg.Node, id); err != nil {
		l.s.logFor("volume", vol).Warn("release write lease", "err", err)
	}
}

// handOver gives up vol's lease, which another node marked released: the
// stacks open here are fenced for good and the rw connections closed
// before the key is deleted, so no write from here follows the next
// holder's first. It retries (every leaseRenew) until the key is gone or
// no longer marked, or ctx ends.
func (l *leases) handOver(ctx context.Context, vol string) {
	for {
		err := l.handOverOnce(ctx, vol)
		if err == nil {
			return
		}
		l.s.logFor("volume", vol).Warn("write lease handover failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(leaseRenew):
		}
	}
}

func (l *leases) handOverOnce(ctx context.Context, vol string) error {
	defer l.lockChange(vol)()
	h, err := l.s.meta.VolumeLeaseHolder(ctx, vol)
	if err != nil {
		return err
	}
	if h == nil || h.Node != l.s.cfg.Node || !h.Released {
		return nil // gone already, or made this node's again by acquire
	}
	if l.inUse(vol) {
		// A job here still writes the volume: keep the lease (taking it
		// again clears the mark); the job's unuse gives it up.
		_, _, err := l.acquireLocked(ctx, vol)
		return err
	}
	l.s.logFor("volume", vol).Info("write lease released through another node: the volume has no rw attachment left")
	l.giveUp(vol)
	l.mu.Lock()
	id := l.id
	l.mu.Unlock()
	return l.s.meta.ReleaseVolumeLease(ctx, vol, l.s.cfg.Node, id)
}

// takeOver acquires vol's lease after its holder lost it (its key was
// deleted at revision rev), if the volume still has rw attachments. A short
// random delay spreads the race.
func (l *leases) takeOver(ctx context.Context, vol string, rev int64) {
	l.mu.Lock()
	token, mine := l.held[vol]
	l.mu.Unlock()
	if mine && token > rev {
		// The key deleted is an older one (a previous run's, revoked at
		// start): ours was created after it and still stands.
		return
	}
	if mine {
		// Our own key vanished, and not by our release (which forgets
		// it first): our etcd lease expired (the renewal loop will
		// notice). Stop writing.
		l.lose(vol, "its lease key was deleted")
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Duration(rand.IntN(300)) * time.Millisecond):
	}
	v, err := l.s.meta.Volume(ctx, vol)
	if err != nil {
		return
	}
	if v.Job != nil || v.Status == meta.StatusExtending || v.Status == meta.StatusCreating || len(v.Snapshotting) > 0 {
		// A workflow of a node that is gone may have waited for the key
		// to go (orphans.go).
		l.s.lookForOrphans()
	}
	if !hasRW(ctx, l.s, v) {
		return
	}
	holder, _, err := l.acquire(ctx, vol)
	if err == nil && holder == l.s.cfg.Node {
		l.s.logFor("volume", vol).Info("took over the volume's write lease")
		l.s.adoptJob(ctx, vol)
	}
}

// hasRW reports whether volume v has an rw attachment. An attachment that
// cannot be read counts as one: the lease is kept (or taken) rather than
// dropped under an rw attachment's connections.
func hasRW(ctx context.Context, s *Service, v *meta.Volume) bool {
	for _, id := range v.Attachments {
		a, err := s.meta.Attachment(ctx, id)
		if err == nil && a.Mode == meta.ModeRW || err != nil && !errs.IsCode(err, errs.CodeNotFound) {
			return true
		}
	}
	return false
}

// leaseHolder reads a volume's lease holder (tests count the reads).
var leaseHolder = (*meta.Store).VolumeLeaseHolder

// servingNodes is a request's one read of its volumes' write-lease
// holders (WithServingNodes).
type servingNodes struct {
	vols    []string
	once    sync.Once
	holders map[string]*meta.VolumeLease // by volume of vols; nil: the read failed, ask per volume
}

type servingNodesKey struct{}

// WithServingNodes returns a context in which ServingNode finds the
// write-lease holders of volumes vols in one read of them all, made at
// its first call, instead of one read per attachment: for a request that
// renders the URIs of many attachments (a list, or a page of one). The
// holders are as of that read, a moment within the request like each of
// the reads it replaces; a lease nobody held then is not taken
// (servingNode). A volume not in vols is read on its own.
func WithServingNodes(ctx context.Context, vols []string) context.Context {
	return context.WithValue(ctx, servingNodesKey{}, &servingNodes{vols: vols})
}

// holder returns vol's lease holder, nil if none: from ctx's shared read
// (WithServingNodes), else read now.
func (l *leases) holder(ctx context.Context, vol string) (*meta.VolumeLease, error) {
	if sn, ok := ctx.Value(servingNodesKey{}).(*servingNodes); ok {
		sn.once.Do(func() {
			if hs, err := l.s.meta.VolumeLeaseHolders(ctx, sn.vols); err == nil {
				sn.holders = hs
			}
		})
		if h, ok := sn.holders[vol]; ok {
			return h, nil
		}
	}
	return leaseHolder(l.s.meta, ctx, vol)
}

// servingNode returns the node that serves vol's rw attachments, taking
// the lease here when nobody holds it (or this node holds it released),
// so that the URI a client is shown keeps working: it connects where the
// lease is. Within a list (WithServingNodes) an unheld lease is not taken:
// the URI names this node, which takes the lease when a client connects
// (export.go). Otherwise the first list after a restart — whose stop gave
// every lease up — would write one lease per rw attachment, and gather
// them all on the node that happened to be asked.
func (l *leases) servingNode(ctx context.Context, vol string) (string, error) {
	h, err := l.holder(ctx, vol)
	if err != nil {
		return "", err
	}
	if h != nil && !h.Released {
		return h.Node, nil
	}
	if _, listing := ctx.Value(servingNodesKey{}).(*servingNodes); listing {
		return l.s.cfg.Node, nil
	}
	holder, _, err := l.acquire(ctx, vol)
	return holder, err
}
