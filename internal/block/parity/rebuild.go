package parity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/basalt-storage/basalt/internal/block"
)

// markFailed takes the legs of le out of service. It returns nil only
// once that is durable (invariant 4) — or they were out durably already —
// so that the caller may acknowledge an update that landed on the other
// legs. A second leg out is never made durable: the layer freezes instead
// (refuses writes and metadata updates until reopened), so that a leg
// that was only briefly unreachable can come back. The caller holds no
// mode lock.
func (l *Layer) markFailed(le *legError) error {
	l.mode.Lock()
	defer l.mode.Unlock()
	return l.markFailedLocked(le)
}

func (l *Layer) markFailedLocked(le *legError) error {
	if l.closed {
		return block.ErrClosed
	}
	// A leg failing (see Layer.failing) is redundant once state says it
	// failed, whatever path below says so; until then it stays failing.
	defer func() {
		for i, st := range l.state {
			if st == legFailed {
				l.failing[i].Store(false)
			}
		}
	}()
	next := slices.Clone(l.state)
	for _, f := range le.legs() {
		if next[f] != legFailed {
			l.log.Error("parity leg failed", "leg", f, "err", le.err)
			next[f] = legFailed
		}
	}
	if slices.Equal(next, l.state) { // a concurrent operation got there first
		for _, f := range le.legs() {
			if l.disk[f] != legFailed && !l.ro {
				return errFrozen
			}
		}
		return nil
	}
	if l.ro {
		l.state = next // nothing is persisted read-only
		return nil
	}
	if p := l.unsettled.Load(); p != nil && p.recover && !l.frozen.Load() {
		// Stripes a full store left unsettled may be inconsistent, and a
		// new epoch would declare every stripe consistent: take the leg
		// out in memory only and freeze, as with two legs out; the next
		// open recovers both.
		l.state = next
		l.frozen.Store(true)
		l.log.Error("parity: a leg failed while a full store kept stripes from being recovered; refusing writes until reopened", "state", string(next))
		return errFrozen
	}
	if out := countOut(next); out == 1 && !l.frozen.Load() {
		f := slices.IndexFunc(next, func(c byte) bool { return c != legOK })
		err := l.flushLegs(f)
		if err == nil {
			return l.switchEpoch(next)
		}
		le2 := asLegError(err)
		if le2 == nil {
			return err
		}
		for _, g := range le2.legs() {
			l.log.Error("parity leg failed", "leg", g, "err", le2.err)
			next[g] = legFailed
		}
	}
	l.state = next
	l.frozen.Store(true)
	l.log.Error("parity: two legs out; refusing writes until reopened with one of them back", "state", string(next))
	return errFrozen
}

func countOut(state []byte) int {
	n := 0
	for _, c := range state {
		if c != legOK {
			n++
		}
	}
	return n
}

// switchEpoch commits a new set of leg states with no update in flight
// and every stripe consistent on the legs it trusts (the caller flushed
// them). The next epoch's intent bits are cleared durably first; the
// superblock write is the commit. The old epoch's intent bits, dirty
// stripes and journal entries are dropped.
func (l *Layer) switchEpoch(next []byte) error {
	e := l.epoch + 1
	for i := l.bm.NextSet(0); i >= 0; i = l.bm.NextSet(i + 1) {
		if i%l.bps == int64(e%2) {
			l.bm.Clear(i)
		}
	}
	if err := l.syncBitmap(); err != nil {
		return err
	}
	if err := l.writeSuper(next, e, l.size.Load()); err != nil {
		// It may have landed (a writeback refused for want of space):
		// the disk may hold the new epoch, whose intent bits updates in
		// the old one would not set. None runs until a superblock write
		// says again what memory does (settle, or this switch retried).
		l.needSettle(false, true, err)
		return err
	}
	if p := l.unsettled.Load(); p != nil && !p.recover {
		l.unsettled.Store(nil) // the superblock is as memory has it now
	}
	old := l.epoch
	l.epoch, l.state, l.disk = e, slices.Clone(next), slices.Clone(next)
	for i := l.bm.NextSet(0); i >= 0; i = l.bm.NextSet(i + 1) {
		if i%l.bps == int64(old%2) {
			l.bm.Clear(i) // reaches the disk with the next sync; ignored until then
		}
	}
	l.mu.Lock()
	clear(l.dirty)
	l.jr.resetPairs()
	l.releasable = nil
	l.pairEvents++
	l.pairCond.Broadcast()
	l.mu.Unlock()
	return nil
}

// rebuilder runs at most one rebuild at a time.
type rebuilder struct {
	mu        sync.Mutex
	cur       *rebuildRun
	observers []block.Progress
	done      atomic.Int64 // stripes rebuilt
	total     atomic.Int64 // stripes to rebuild in all
}

type rebuildRun struct {
	done   chan struct{}
	err    error
	cancel context.CancelFunc
}

func (r *rebuilder) percent() float64 {
	t := r.total.Load()
	if t <= 0 {
		return 0
	}
	return 100 * float64(r.done.Load()) / float64(t)
}

// stop cancels the running rebuild, if any, and waits for it.
func (r *rebuilder) stop() {
	r.mu.Lock()
	cur := r.cur
	r.mu.Unlock()
	if cur != nil {
		cur.cancel()
		<-cur.done
	}
}

// Repair implements block.Repairer. A failed leg is reopened from its spec
// (block.Build with Create=false) or, if that fails (its file is gone),
// created anew; every stripe is marked to rebuild and the leg marked
// rebuilding, durably; then each stripe's chunk for it is reconstructed
// from the other legs, in batches flushed before their rebuild bits are
// cleared, so a rebuild interrupted by a crash or Close resumes at the
// next open. Writes go on meanwhile: a stripe not yet rebuilt is written
// as degraded. Progress is in bytes of the device. Cancelling ctx stops
// the rebuild (it resumes on the next Repair or open).
func (l *Layer) Repair(ctx context.Context, p block.Progress) error {
	if l.ro {
		return block.ErrReadOnly
	}
	if l.frozen.Load() {
		return errFrozen
	}
	if err := l.settle(); err != nil {
		return err
	}
	for {
		need, err := l.prepareRebuild()
		if err != nil || !need {
			return err
		}
		run := l.startRebuild(p)
		select {
		case <-run.done:
			if run.err != nil {
				return run.err
			}
		case <-ctx.Done():
			run.cancel()
			<-run.done
			return ctx.Err()
		}
	}
}

// prepareRebuild brings a failed leg back as a rebuilding one. It reports
// whether a rebuild is needed.
func (l *Layer) prepareRebuild() (bool, error) {
	l.mode.Lock()
	defer l.mode.Unlock()
	if l.closed {
		return false, block.ErrClosed
	}
	if err := l.settleLocked(); err != nil {
		return false, err
	}
	var failed, rebuilding []int
	for i, st := range l.state {
		switch st {
		case legFailed:
			failed = append(failed, i)
		case legRebuilding:
			rebuilding = append(rebuilding, i)
		}
	}
	switch {
	case len(failed)+len(rebuilding) == 0:
		return false, nil
	case len(failed)+len(rebuilding) > 1:
		return false, fmt.Errorf("parity: cannot rebuild with %d legs out (failed %v, rebuilding %v)",
			len(failed)+len(rebuilding), failed, rebuilding)
	case len(rebuilding) == 1:
		return true, nil
	}
	f := failed[0]
	old := l.children[f]
	_, _, placeholder := block.IsFailed(old)
	c, err := l.reopenLeg(f, l.env.ChildSpecs[f])
	if err != nil {
		return false, err
	}
	stripes := l.stripes.Load()
	for s := range stripes {
		l.bm.Set(l.rebuildBit(s))
	}
	next := slices.Clone(l.state)
	next[f] = legRebuilding
	err = l.syncBitmap()
	if err == nil {
		err = l.writeSuper(next, l.epoch, l.size.Load())
	}
	if err != nil {
		c.Close()
		return false, err
	}
	l.children[f], l.state, l.disk = c, next, slices.Clone(next)
	l.rb.total.Store(stripes)
	l.rb.done.Store(0)
	if !placeholder {
		old.Close()
	}
	l.log.Info("parity: rebuilding leg", "leg", f, "stripes", stripes)
	return true, nil
}

// reopenLeg builds leg f from its spec: the existing backing store if it
// opens, else a new one.
func (l *Layer) reopenLeg(f int, spec block.Spec) (block.Layer, error) {
	env := l.env
	env.Create, env.ReadOnly, env.Size = false, false, l.perLeg()
	c, err := block.Build(env, spec)
	if err != nil {
		env.Create = true
		var err2 error
		if c, err2 = block.Build(env, spec); err2 != nil {
			return nil, fmt.Errorf("parity leg %d: reopen: %v; create: %w", f, err, err2)
		}
	}
	fail := func(err error) (block.Layer, error) {
		c.Close()
		return nil, fmt.Errorf("parity leg %d: %w", f, err)
	}
	cc := c.Capabilities()
	if cc.ReadOnly || !cc.Flush || l.legCaps.WriteZeroes && !cc.WriteZeroes || l.legCaps.Extents && !cc.Extents {
		return fail(errors.New("replacement lacks capabilities the other legs have"))
	}
	if c.Size() < l.perLeg() {
		r, ok := c.(block.Resizer)
		if !ok {
			return fail(fmt.Errorf("replacement of %d bytes is too small (%d needed) and cannot grow", c.Size(), l.perLeg()))
		}
		if err := r.Resize(l.perLeg()); err != nil {
			return fail(err)
		}
	}
	return c, nil
}

// startRebuild starts the rebuild in the background unless it runs
// already, and returns the run.
func (l *Layer) startRebuild(p block.Progress) *rebuildRun {
	l.rb.mu.Lock()
	defer l.rb.mu.Unlock()
	if p != nil {
		l.rb.observers = append(l.rb.observers, p)
	}
	if l.rb.cur != nil {
		return l.rb.cur
	}
	ctx, cancel := context.WithCancel(l.ctx)
	run := &rebuildRun{done: make(chan struct{}), cancel: cancel}
	l.rb.cur = run
	go func() {
		err := l.rebuild(ctx)
		if err != nil && ctx.Err() == nil {
			l.log.Error("parity rebuild failed", "err", err)
		}
		l.rb.mu.Lock()
		run.err = err
		l.rb.cur = nil
		l.rb.observers = nil
		l.rb.mu.Unlock()
		cancel()
		close(run.done)
	}()
	return run
}

func (l *Layer) rebuild(ctx context.Context) error {
	// Nothing is reconstructed from stripes a full store left unsettled.
	if err := l.settle(); err != nil {
		l.rebuildStalled.Store(block.StoreRefused(err))
		return err
	}
	l.mode.RLock()
	remaining := int64(0)
	for i := l.bm.NextSet(0); i >= 0; i = l.bm.NextSet(i + 1) {
		if i%l.bps == 2 {
			remaining++
		}
	}
	total := l.stripes.Load()
	l.mode.RUnlock()
	l.rb.total.Store(total)
	l.rb.done.Store(total - remaining)
	var cursor int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := l.rebuildBatch(&cursor)
		if le := asLegError(err); le != nil {
			if ferr := l.markFailed(le); ferr != nil {
				return ferr
			}
			return fmt.Errorf("parity rebuild: %w", err)
		}
		if err != nil {
			// A leg refusing the rebuild's writes for want of space is
			// not failed: the rebuild stops (its progress is kept) and
			// the next Flush that succeeds starts it again.
			l.rebuildStalled.Store(block.StoreRefused(err))
			return err
		}
		l.rb.done.Add(int64(n))
		l.rb.mu.Lock()
		obs := slices.Clone(l.rb.observers)
		l.rb.mu.Unlock()
		for _, p := range obs {
			p(l.rb.done.Load()*l.dsz, l.rb.total.Load()*l.dsz)
		}
		if n == 0 {
			break
		}
	}
	return l.finishRebuild()
}

// rebuildBatch rebuilds the next batch of stripes at or after *cursor:
// with the batch's stripes locked, each one's chunk for the rebuilding
// leg is reconstructed and written, the leg flushed, then the batch's
// rebuild bits cleared and synced (invariant 5).
func (l *Layer) rebuildBatch(cursor *int64) (int, error) {
	l.mode.RLock()
	defer l.mode.RUnlock()
	if l.closed {
		return 0, block.ErrClosed
	}
	f := -1
	for i, st := range l.state {
		switch st {
		case legRebuilding:
			f = i
		case legFailed:
			return 0, fmt.Errorf("parity rebuild: leg %d failed meanwhile: %w", i, errTooManyFailed)
		}
	}
	if f < 0 {
		return 0, errors.New("parity rebuild: no leg is being rebuilt")
	}
	if err := l.failingError(); err != nil {
		return 0, err
	}
	if err := l.unsettledErr(); err != nil {
		return 0, err
	}
	var batch []int64
	for i := l.bm.NextSet(*cursor * l.bps); i >= 0 && len(batch) < l.batchStripes; i = l.bm.NextSet(i + 1) {
		if i%l.bps == 2 {
			batch = append(batch, i/l.bps)
		}
	}
	if len(batch) == 0 {
		return 0, nil
	}
	var slots []int
	for _, s := range batch {
		slots = append(slots, int(s%lockSlots))
	}
	slices.Sort(slots)
	slots = slices.Compact(slots)
	for _, k := range slots {
		l.locks[k].Lock()
	}
	defer func() {
		for _, k := range slots {
			l.locks[k].Unlock()
		}
	}()
	C := l.chunk
	for _, s := range batch {
		shards := make([][]byte, l.n)
		var reads []legOp
		idx := -1
		for i := range l.n {
			leg := l.parityLeg(s)
			if i < l.n-1 {
				leg = l.dataLeg(s, i)
			}
			if leg == f {
				idx = i
				shards[i] = make([]byte, 0, C)
				continue
			}
			shards[i] = make([]byte, C)
			reads = append(reads, readOp(leg, shards[i], s*C))
		}
		if err := l.run(reads); err != nil {
			return 0, err
		}
		if err := l.enc.Reconstruct(shards); err != nil {
			return 0, err
		}
		if err := l.run([]legOp{writeOp(f, shards[idx], s*C, false)}); err != nil {
			return 0, err
		}
	}
	if err := l.run([]legOp{{f, func(c block.Layer) error { return c.Flush() }}}); err != nil {
		return 0, err
	}
	for _, s := range batch {
		l.bm.Clear(l.rebuildBit(s))
	}
	if err := l.syncBitmap(); err != nil {
		// Not durable: writers must go on treating these stripes as not
		// rebuilt (journaling them), as a restart will.
		for _, s := range batch {
			l.bm.Set(l.rebuildBit(s))
		}
		return 0, err
	}
	for _, s := range batch {
		l.untaken.Add(max(0, min(l.dsz, l.size.Load()-s*l.dsz)))
	}
	*cursor = batch[len(batch)-1] + 1
	return len(batch), nil
}

// finishRebuild makes the rebuilt leg ok: a new epoch, which also retires
// the journal entries written while it was missing.
func (l *Layer) finishRebuild() error {
	l.mode.Lock()
	defer l.mode.Unlock()
	if l.closed {
		return block.ErrClosed
	}
	f := slices.Index(l.state, legRebuilding)
	if f < 0 {
		return errors.New("parity rebuild: the leg is no longer rebuilding")
	}
	for i := l.bm.NextSet(0); i >= 0; i = l.bm.NextSet(i + 1) {
		if i%l.bps == 2 {
			return fmt.Errorf("parity rebuild: stripe %d still to rebuild", i/l.bps)
		}
	}
	if err := l.settleLocked(); err != nil {
		return err // a new epoch declares every stripe consistent
	}
	if err := l.flushLegs(-1); err != nil {
		if le := asLegError(err); le != nil {
			if ferr := l.markFailedLocked(le); ferr != nil {
				return ferr
			}
		}
		return err
	}
	next := slices.Clone(l.state)
	next[f] = legOK
	if err := l.switchEpoch(next); err != nil {
		return err
	}
	l.log.Info("parity: leg rebuilt", "leg", f)
	return nil
}
