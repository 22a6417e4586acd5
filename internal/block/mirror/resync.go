package mirror

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/basalt-storage/basalt/internal/block"
)

func (l *Layer) needsResync() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unsynced > 0 {
		return true
	}
	for _, lg := range l.legs {
		if lg.state == legRebuilding {
			return true
		}
	}
	return false
}

// startBackground resynchronises what the last session left unfinished:
// regions dirty at a crash, and rebuilds interrupted by a crash or Close —
// and, started by kickResync, regions a leg refused a write to for want
// of space.
func (l *Layer) startBackground() {
	l.bg.Go(func() {
		defer l.kicked.Store(false)
		if beforeResync != nil {
			beforeResync()
		}
		select {
		case l.work <- struct{}{}:
		case <-l.bgCtx.Done():
			return
		}
		defer func() { <-l.work }()
		if err := l.resync(l.bgCtx, nil); err != nil {
			switch {
			case l.bgCtx.Err() != nil:
			case block.StoreRefused(err):
				// Left for later: the next flush that succeeds tries again.
				l.log.Info("mirror resync stopped: the store is full; it resumes after a flush", "err", err)
			default:
				l.log.Warn("mirror resync stopped", "err", err)
			}
			return
		}
		// Make the copies durable and let the intent bits go.
		if err := l.flushAll(false); err != nil {
			l.log.Warn("mirror flush after resync", "err", err)
		}
	})
}

// kickResync starts a background resync if regions wait for one (a leg
// refused a write or flush for want of space) and none is queued or
// running. Flush calls it when it succeeded: there may be space again.
func (l *Layer) kickResync() {
	l.mu.Lock()
	waiting := l.unsynced > 0
	l.mu.Unlock()
	if !waiting || l.bgCtx.Err() != nil || !l.kicked.CompareAndSwap(false, true) {
		return
	}
	l.startBackground()
}

// Repair implements block.Repairer. Each pass fails legs whose backing
// vanished while open, reopens failed legs from their specs (creating a
// replacement when the backing is gone), and copies what they miss. A
// second pass handles a vanished leg that was the only healthy copy until
// the first pass rebuilt another. Cancelling ctx (or Close) stops the
// copy; it resumes when the layer is next opened.
func (l *Layer) Repair(ctx context.Context, p block.Progress) error {
	if err := l.usable(); err != nil {
		return err
	}
	if l.readOnly {
		return block.ErrReadOnly
	}
	select {
	case l.work <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-l.bgCtx.Done(): // closing: Close holds l.work for good
		return block.ErrClosed
	}
	defer func() { <-l.work }()
	if err := l.usable(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.bgCtx, cancel)()

	var problems []error
	for pass := 0; pass <= len(l.legs); pass++ {
		problems = nil
		progress := false
		for i := range l.legs {
			l.mu.Lock()
			st, dev := l.legs[i].state, l.legs[i].dev
			l.mu.Unlock()
			if st == legFailed || dev.Describe().State != block.StateFailed {
				continue
			}
			if l.failLeg(i, dev, errors.New("its backing vanished while open")) {
				progress = true
			} else {
				problems = append(problems, fmt.Errorf("leg %d: its backing is gone and it is the only healthy copy", i))
			}
		}
		if err := l.persist(); err != nil {
			return fmt.Errorf("mirror repair: %w", err)
		}
		for i := range l.legs {
			l.mu.Lock()
			st := l.legs[i].state
			l.mu.Unlock()
			if st != legFailed {
				continue
			}
			if err := l.reopenLeg(i); err != nil {
				problems = append(problems, fmt.Errorf("leg %d: %w", i, err))
				continue
			}
			progress = true
		}
		if err := l.resync(ctx, p); err != nil {
			return fmt.Errorf("mirror repair: %w", err)
		}
		if len(problems) == 0 && l.allOK() {
			return nil
		}
		if !progress {
			break
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("mirror repair: %w", errors.Join(problems...))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Errorf("mirror repair: legs are %v", l.states())
}

func (l *Layer) allOK() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, lg := range l.legs {
		if lg.state != legOK {
			return false
		}
	}
	return true
}

// reopenLeg replaces failed leg i's device with a fresh build of its spec
// and marks it rebuilding (invariant 4).
func (l *Layer) reopenLeg(i int) error {
	l.structMu.Lock()
	defer l.structMu.Unlock()
	l.mu.Lock()
	lg := l.legs[i]
	if lg.state != legFailed {
		l.mu.Unlock()
		return nil
	}
	old, refs, spec := lg.dev, lg.refs, lg.spec
	l.mu.Unlock()
	refs.Wait() // failed: nobody takes new references, so this ends
	if err := old.Close(); err != nil {
		l.log.Warn("mirror: closing failed leg", "leg", i, "err", err)
	}
	fail := func(err error) error {
		l.mu.Lock()
		lg.dev, lg.refs = block.Failed(l.env, spec, err), &sync.WaitGroup{}
		l.legsVer++
		l.mu.Unlock()
		return err
	}
	env := l.env
	env.Create, env.Size = false, l.size.Load()
	dev, err := block.Build(env, spec)
	if err != nil {
		l.log.Info("mirror leg cannot be reopened; creating a replacement", "leg", i, "err", err)
		// Durably all stale before the blank replacement exists: a crash
		// after creating it must not find a stale map that calls it clean.
		l.mu.Lock()
		lg.stale.SetRange(0, l.nreg)
		l.mu.Unlock()
		if serr := lg.stale.Sync(); serr != nil {
			return fail(fmt.Errorf("marking every region stale: %w", serr))
		}
		env.Create = true
		var cerr error
		if dev, cerr = block.Build(env, spec); cerr != nil {
			return fail(fmt.Errorf("reopen: %v; create a replacement: %w", err, cerr))
		}
	}
	if err := growLeg(dev, l.size.Load()); err != nil {
		dev.Close()
		return fail(fmt.Errorf("grow to the mirror's size: %w", err))
	}
	l.mu.Lock()
	lg.dev, lg.refs = dev, &sync.WaitGroup{}
	l.setStateLocked(lg, legRebuilding)
	l.mu.Unlock()
	l.log.Info("mirror leg reopened; rebuilding", "leg", i)
	return l.persist()
}

// resync copies regions left dirty by a crash across the ok legs, then the
// stale regions of rebuilding legs. Callers hold l.work.
func (l *Layer) resync(ctx context.Context, p block.Progress) error {
	l.mu.Lock()
	var dirty []int64
	for r, rs := range l.dirty {
		if rs.unsynced {
			dirty = append(dirty, r)
		}
	}
	gens := map[int]uint64{} // rebuilding legs, and the state generation they must keep
	for i, lg := range l.legs {
		if lg.state == legRebuilding {
			gens[i] = lg.gen
		}
	}
	l.mu.Unlock()
	if len(dirty) == 0 && len(gens) == 0 {
		return nil
	}
	slices.Sort(dirty)
	total := int64(0)
	for _, r := range dirty {
		_, n := l.regionRange(r)
		total += n
	}
	for r := l.nextStale(0, gens); r >= 0; r = l.nextStale(r+1, gens) {
		_, n := l.regionRange(r)
		total += n
	}
	l.progDone.Store(0)
	l.progTotal.Store(total)
	l.resyncing.Store(true)
	defer l.resyncing.Store(false)
	report := func(n int64) {
		d := l.progDone.Add(n)
		if p != nil {
			p(d, total)
		}
	}
	buf := make([]byte, min(l.region, 1<<20))
	for _, r := range dirty {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := l.syncRegion(r, buf); err != nil {
			return err
		}
		_, n := l.regionRange(r)
		report(n)
	}
	if len(gens) == 0 {
		return nil
	}
	return l.rebuild(ctx, gens, buf, report)
}

// nextStale is the first region at or after from that some leg in gens
// (still rebuilding in the same generation) has stale, or -1.
func (l *Layer) nextStale(from int64, gens map[int]uint64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	best := int64(-1)
	for i, g := range gens {
		lg := l.legs[i]
		if lg.state != legRebuilding || lg.gen != g {
			continue
		}
		if r := lg.stale.NextSet(from); r >= 0 && (best < 0 || r < best) {
			best = r
		}
	}
	return best
}

// syncRegion copies a region dirty at open from the source leg to the
// other ok legs, under the region's range lock.
func (l *Layer) syncRegion(r int64, buf []byte) error {
	off, n := l.regionRange(r)
	lk := l.locks.lock(off, off+n)
	defer l.locks.unlock(lk)
	for {
		l.mu.Lock()
		rs := l.dirty[r]
		if rs == nil || !rs.unsynced {
			l.mu.Unlock()
			return nil
		}
		src := l.acquireLocked(l.sourceLocked())
		var dsts []target
		for i, lg := range l.legs {
			if i != src.i && lg.state == legOK {
				dsts = append(dsts, l.acquireLocked(i))
			}
		}
		refusals := rs.refusals
		l.mu.Unlock()
		failed, srcErr, full := l.copyTo(src, dsts, off, n, buf)
		srcFailed := false
		if srcErr != nil {
			srcFailed = l.failLeg(src.i, src.dev, srcErr)
			failed = failed || srcFailed
		}
		src.refs.Done()
		if srcErr == nil && full == nil {
			l.mu.Lock()
			// A flush (or FUA write) a leg refused meanwhile may have
			// dropped the copy: the region stays unsynced, copied again
			// by the resync the next flush that succeeds starts.
			if rs.refusals == refusals && rs.unsynced {
				rs.unsynced = false
				l.unsynced--
				// Clearable by the next flush: it starts after this copy.
				rs.epoch = max(rs.epoch, l.epoch-1)
			}
			l.mu.Unlock()
		}
		if failed {
			if err := l.persist(); err != nil {
				return err
			}
		}
		if srcErr == nil && full != nil {
			// Still unsynced: copied again once there is space.
			return fmt.Errorf("resync region %d: %w", r, full)
		}
		if srcErr == nil {
			return nil
		}
		if !srcFailed {
			return fmt.Errorf("resync region %d: reading leg %d, the last healthy one: %w", r, src.i, srcErr)
		}
	}
}

// rebuild copies the stale regions of the legs in gens, checkpointing
// every checkpointEvery regions, and marks legs with nothing stale left ok.
func (l *Layer) rebuild(ctx context.Context, gens map[int]uint64, buf []byte, report func(int64)) error {
	pending := map[int][]int64{} // copied, not yet cleared in the stale map
	var count int64
	var stop error
	for r := l.nextStale(0, gens); r >= 0; r = l.nextStale(r+1, gens) {
		if stop = ctx.Err(); stop != nil {
			break
		}
		done, err := l.rebuildRegion(r, gens, buf)
		if err != nil {
			stop = err
			break
		}
		for _, i := range done {
			pending[i] = append(pending[i], r)
		}
		_, n := l.regionRange(r)
		report(n)
		if count++; count%max(1, l.checkpointEvery.Load()) == 0 {
			if stop = l.checkpoint(gens, pending); stop != nil {
				break
			}
		}
	}
	// Keep what was copied, also when stopping early.
	if err := l.checkpoint(gens, pending); err != nil && stop == nil {
		stop = err
	}
	if stop != nil {
		return stop
	}
	l.mu.Lock()
	var healed []int
	for i, g := range gens {
		lg := l.legs[i]
		if lg.state == legRebuilding && lg.gen == g && lg.stale.NextSet(0) < 0 {
			l.setStateLocked(lg, legOK)
			healed = append(healed, i)
		}
	}
	l.mu.Unlock()
	if err := l.persist(); err != nil {
		return err
	}
	for _, i := range healed {
		l.log.Info("mirror leg rebuilt", "leg", i)
	}
	return nil
}

// rebuildRegion copies region r from the source to every rebuilding leg in
// gens that has it stale, under the region's range lock, and returns the
// legs it reached.
func (l *Layer) rebuildRegion(r int64, gens map[int]uint64, buf []byte) ([]int, error) {
	off, n := l.regionRange(r)
	lk := l.locks.lock(off, off+n)
	defer l.locks.unlock(lk)
	for {
		l.mu.Lock()
		src := l.acquireLocked(l.sourceLocked())
		var dsts []target
		drops := map[int]uint64{}
		for i, g := range gens {
			lg := l.legs[i]
			if lg.state == legRebuilding && lg.gen == g && lg.stale.Get(r) {
				dsts = append(dsts, l.acquireLocked(i))
				drops[i] = lg.drops
			}
		}
		l.mu.Unlock()
		if len(dsts) == 0 {
			src.refs.Done()
			return nil, nil
		}
		ids := make([]int, len(dsts))
		for k, t := range dsts {
			ids[k] = t.i
		}
		failed, srcErr, full := l.copyTo(src, dsts, off, n, buf)
		srcFailed := false
		if srcErr != nil {
			srcFailed = l.failLeg(src.i, src.dev, srcErr)
			failed = failed || srcFailed
		}
		src.refs.Done()
		if failed {
			if err := l.persist(); err != nil {
				return nil, err
			}
		}
		if srcErr == nil && full != nil {
			// The region stays stale; the rebuild resumes with it.
			return nil, fmt.Errorf("rebuild region %d: %w", r, full)
		}
		if srcErr == nil {
			// Legs that failed meanwhile changed generation; checkpoint
			// skips them. Recorded under the range lock, so a write the
			// leg refuses after this copy (diverged) comes after it. A
			// flush (or FUA write) refused during the copy may have
			// dropped part of it: not recorded, the region stays stale.
			l.mu.Lock()
			for _, i := range ids {
				if lg := l.legs[i]; lg.state == legRebuilding && lg.gen == gens[i] && lg.drops == drops[i] {
					if lg.copied == nil {
						lg.copied = map[int64]bool{}
					}
					lg.copied[r] = true
				}
			}
			l.mu.Unlock()
			return ids, nil
		}
		if !srcFailed {
			return nil, fmt.Errorf("rebuild region %d: reading leg %d, the last healthy one: %w", r, src.i, srcErr)
		}
	}
}

// copyTo copies [off, off+n) from src to dsts, fails destinations that
// error and releases them. It returns whether a leg was failed (the caller
// persists), src's error (the caller handles it) and the error of a
// destination that refused the copy for want of space (not failed: the
// caller leaves the region to copy later).
func (l *Layer) copyTo(src target, dsts []target, off, n int64, buf []byte) (bool, error, error) {
	devs := make([]block.Layer, len(dsts))
	for k, t := range dsts {
		devs[k] = t.dev
	}
	dstErrs, srcErr := l.copyRange(src.dev, devs, off, n, buf)
	failed := false
	var full error
	for k, e := range dstErrs {
		switch {
		case e == nil:
		case block.StoreRefused(e):
			if full == nil {
				full = fmt.Errorf("leg %d: %w", dsts[k].i, e)
			}
		case l.failLeg(dsts[k].i, dsts[k].dev, e):
			failed = true
		}
	}
	release(dsts)
	if srcErr == nil && full == nil && len(dsts) > 0 {
		l.copied.Add(n)
		l.untaken.Add(n)
	}
	return failed, srcErr, full
}

// copyRange copies [off, off+n) from src to each dst, keeping holes: zero
// extents of src become WriteZeroes on the destinations (so a rebuilt leg
// stays as sparse as its source).
func (l *Layer) copyRange(src block.Layer, dsts []block.Layer, off, n int64, buf []byte) ([]error, error) {
	dstErrs := make([]error, len(dsts))
	useExtents := l.caps.Extents && l.caps.WriteZeroes
	end := off + n
	for off < end {
		exts := []block.Extent{{Length: end - off}}
		if useExtents {
			e, err := src.Extents(off, end-off)
			if err != nil {
				return dstErrs, fmt.Errorf("extents %d+%d: %w", off, end-off, err)
			}
			if len(e) > 0 {
				exts = e
			}
		}
		for _, e := range exts {
			ln := min(e.Length, end-off)
			if ln <= 0 {
				break
			}
			if e.Zero {
				for k, d := range dsts {
					if dstErrs[k] == nil {
						dstErrs[k] = d.WriteZeroes(off, ln, block.ZeroFlags{})
					}
				}
			} else {
				for done := int64(0); done < ln; {
					m := min(ln-done, int64(len(buf)))
					if err := src.ReadAt(buf[:m], off+done); err != nil {
						return dstErrs, err
					}
					for k, d := range dsts {
						if dstErrs[k] == nil {
							dstErrs[k] = d.WriteAt(buf[:m], off+done, false)
						}
					}
					done += m
				}
			}
			off += ln
		}
	}
	return dstErrs, nil
}

// checkpoint makes copied regions durable on their legs, then clears and
// syncs their stale bits (invariant 4). A leg that changed generation
// (failed meanwhile) keeps its bits.
func (l *Layer) checkpoint(gens map[int]uint64, pending map[int][]int64) error {
	for i, rs := range pending {
		delete(pending, i)
		if len(rs) == 0 {
			continue
		}
		l.mu.Lock()
		lg := l.legs[i]
		if lg.state != legRebuilding || lg.gen != gens[i] {
			l.mu.Unlock()
			continue
		}
		t := l.acquireLocked(i)
		l.mu.Unlock()
		l.syncs.Lock() // until the bits are cleared: see Layer.syncs
		if l.caps.Flush {
			if err := t.dev.Flush(); err != nil {
				if block.StoreRefused(err) {
					// The leg is fine; its copies are not known durable,
					// so their stale bits stay, for the rebuild to resume.
					// Its writeback may also have dropped users' writes
					// it had taken since its last flush, and the file
					// reports that to this sync only (the users' next
					// flush of it succeeds): their regions, every one
					// with its intent bit set, become stale for it before
					// a flush can let those bits go.
					l.mu.Lock()
					if lg.dev == t.dev && lg.state != legOK {
						for r := range l.dirty {
							lg.stale.Set(r)
						}
						lg.dropCopiesLocked()
					}
					l.mu.Unlock()
					l.syncs.Unlock()
					t.refs.Done()
					return fmt.Errorf("leg %d: %w", i, err)
				}
				failed := l.failLeg(i, t.dev, err)
				l.syncs.Unlock()
				t.refs.Done()
				if failed {
					if perr := l.persist(); perr != nil {
						return perr
					}
				}
				continue
			}
		}
		t.refs.Done()
		l.mu.Lock()
		if lg.state == legRebuilding && lg.gen == gens[i] {
			for _, r := range rs {
				// Not copied since it was last made stale: keep it.
				if lg.copied[r] {
					lg.stale.Clear(r)
					delete(lg.copied, r)
				}
			}
		}
		l.mu.Unlock()
		l.syncs.Unlock()
		if err := lg.stale.Sync(); err != nil {
			return fmt.Errorf("leg %d stale map: %w", i, err)
		}
	}
	return nil
}
