package mirror

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// usableFor is usable for a request of n bytes at off, which must lie
// inside the device (block.Device).
func (l *Layer) usableFor(off, n int64) error {
	if err := l.usable(); err != nil {
		return err
	}
	if err := block.CheckRange(off, n, l.Size()); err != nil {
		return fmt.Errorf("mirror: %w", err)
	}
	return nil
}

// ReadAt implements block.Device: one ok leg serves the read (the resync
// source when the range has regions not yet resynchronised since open); a
// leg that fails is marked failed and the read goes to another.
func (l *Layer) ReadAt(p []byte, off int64) error {
	if err := l.usableFor(off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	return l.withReader(off, int64(len(p)), "read", func(d block.Layer) error { return d.ReadAt(p, off) })
}

// Extents implements block.Device, answered by the leg a read would use.
func (l *Layer) Extents(off, n int64) ([]block.Extent, error) {
	if err := l.usableFor(off, n); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil // nothing to describe (block.Device)
	}
	if !l.caps.Extents {
		return nil, block.ErrNotSupported
	}
	var out []block.Extent
	err := l.withReader(off, n, "extents", func(d block.Layer) error {
		var err error
		out, err = d.Extents(off, n)
		return err
	})
	return out, err
}

func (l *Layer) withReader(off, n int64, what string, fn func(block.Layer) error) error {
	for {
		t := l.pickReader(off, n)
		err := fn(t.dev)
		if err == nil {
			t.refs.Done()
			return nil
		}
		failed := l.failLeg(t.i, t.dev, err)
		t.refs.Done()
		if !failed {
			return fmt.Errorf("mirror: %s %d+%d on leg %d, the last healthy one: %w", what, off, n, t.i, err)
		}
		if perr := l.persist(); perr != nil {
			return fmt.Errorf("mirror: %s %d+%d: leg %d failed (%v), and %w", what, off, n, t.i, err, perr)
		}
	}
}

// TryReadAt implements block.NoWaitReader: the leg a read would use, at
// once or not at all. Only an answered read moves the round robin on:
// otherwise ReadAt picks the same leg, and meets whatever kept it from
// answering — an error fails that leg over, as if TryReadAt had not been
// tried (else a broken leg could go unnoticed by reads, their retries
// always landing on the next leg).
func (l *Layer) TryReadAt(p []byte, off int64) bool {
	if len(p) == 0 || l.usableFor(off, int64(len(p))) != nil || !l.mu.TryLock() {
		return false
	}
	t := l.pickReaderLocked(off, int64(len(p)), false)
	l.mu.Unlock()
	defer t.refs.Done()
	if !block.TryReadAt(t.dev, p, off) {
		return false
	}
	l.rr.Add(1)
	return true
}

// SpliceTo implements block.Splicer: from the leg a read would use, as
// TryReadAt does, and moving the round robin on only when that leg moved
// every byte. What it did not move the caller reads with ReadAt, which
// picks the same leg and meets whatever stopped the splice: an error
// fails that leg over.
func (l *Layer) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	if n == 0 || l.usableFor(off, int64(n)) != nil {
		return 0
	}
	if nowait {
		if !l.mu.TryLock() {
			return 0
		}
	} else {
		l.mu.Lock()
	}
	t := l.pickReaderLocked(off, int64(n), false)
	l.mu.Unlock()
	defer t.refs.Done()
	k := block.SpliceTo(t.dev, pipe, off, n, nowait)
	if k == n {
		l.rr.Add(1)
	}
	return k
}

// pickReader chooses the leg for a read of [off, off+n) and references it.
func (l *Layer) pickReader(off, n int64) target {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pickReaderLocked(off, n, true)
}

// pickReaderLocked is pickReader with l.mu held; without advance it
// leaves the round robin where it is.
func (l *Layer) pickReaderLocked(off, n int64, advance bool) target {
	if l.unsynced > 0 {
		for r := off >> l.shift; r <= (off+n-1)>>l.shift; r++ {
			if rs := l.dirty[r]; rs != nil && rs.unsynced {
				return l.acquireLocked(l.sourceLocked())
			}
		}
	}
	var oks []int
	for i, lg := range l.legs {
		if lg.state == legOK {
			oks = append(oks, i)
		}
	}
	next := l.rr.Load() + 1
	if advance {
		next = l.rr.Add(1)
	}
	return l.acquireLocked(oks[next%uint64(len(oks))])
}

// WriteAt implements block.Device.
func (l *Layer) WriteAt(p []byte, off int64, fua bool) error {
	if len(p) == 0 && fua {
		return l.Flush()
	}
	return l.mutate("write", off, int64(len(p)), fua, func(d block.Layer) error { return d.WriteAt(p, off, fua) }, nil)
}

// WriteZeroes implements block.Device. With Fast, when some legs zero
// quickly and others refuse, the refusing legs are zeroed the slow way:
// the legs must not be left different.
func (l *Layer) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if !l.caps.WriteZeroes {
		return block.ErrNotSupported
	}
	if f.Fast && !l.caps.FastZero {
		return block.ErrNotSupported
	}
	var slow func(block.Layer) error
	if f.Fast {
		sf := f
		sf.Fast = false
		slow = func(d block.Layer) error { return d.WriteZeroes(off, n, sf) }
	}
	return l.mutate("zero", off, n, f.FUA, func(d block.Layer) error { return d.WriteZeroes(off, n, f) }, slow)
}

// Trim implements block.Device as WriteZeroes on every leg (holes
// allowed), so legs agree on what a trimmed range reads as.
func (l *Layer) Trim(off, n int64, fua bool) error {
	if !l.caps.Trim {
		return block.ErrNotSupported
	}
	return l.mutate("trim", off, n, fua, func(d block.Layer) error {
		return d.WriteZeroes(off, n, block.ZeroFlags{FUA: fua})
	}, nil)
}

// mutate runs a modifying operation on every leg taking writes, under the
// range lock and the write-intent protocol (package comment, invariant 1).
// slow, if set, retries legs that answered ErrNotSupported (fast zeroes).
// fua says the operation syncs the legs (see Layer.syncs).
func (l *Layer) mutate(what string, off, n int64, fua bool, op, slow func(block.Layer) error) error {
	if err := l.usableFor(off, n); err != nil {
		return err
	}
	if l.caps.ReadOnly {
		return block.ErrReadOnly
	}
	if n <= 0 {
		return nil
	}
	lk := l.locks.lock(off, off+n)
	defer l.locks.unlock(lk)
	r0, r1 := off>>l.shift, (off+n-1)>>l.shift
	ts, err := l.begin(r0, r1)
	if err != nil {
		return fmt.Errorf("mirror: %s %d+%d: %w", what, off, n, err)
	}
	defer l.end(r0, r1)
	if fua {
		l.syncs.RLock()
		defer l.syncs.RUnlock()
	}
	errs := onEach(ts, op)
	if slow != nil {
		unsup := 0
		for _, e := range errs {
			if errors.Is(e, block.ErrNotSupported) {
				unsup++
			}
		}
		if unsup == len(ts) {
			release(ts)
			return block.ErrNotSupported // nothing changed anywhere
		}
		for k, e := range errs {
			if errors.Is(e, block.ErrNotSupported) {
				errs[k] = slow(ts[k].dev)
			}
		}
	}
	regions := func() []int64 {
		rs := make([]int64, 0, r1-r0+1)
		for r := r0; r <= r1; r++ {
			rs = append(rs, r)
		}
		return rs
	}
	if fua && slices.ContainsFunc(errs, block.StoreRefused) {
		// Its sync may have been told of a writeback that dropped
		// other writes than its own — users' writes the leg took since
		// its last flush, a rebuild's copies — as a refused flush may:
		// every region with its intent bit set may differ now (nil),
		// and the copies are forgotten (diverged).
		regions = nil
	}
	return l.finish(ts, errs, fmt.Sprintf("%s %d+%d", what, off, n), regions)
}

// begin makes the intent bits of regions r0..r1 durable (sharing Syncs
// with concurrent writers), records the regions as stale for failed legs,
// and references the legs to write.
func (l *Layer) begin(r0, r1 int64) ([]target, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var need uint64
	for r := r0; r <= r1; r++ {
		rs := l.dirty[r]
		if rs == nil {
			l.setGen++
			rs = &regionState{gen: l.setGen}
			l.dirty[r] = rs
			l.intent.Set(r)
		}
		rs.inflight++
		if rs.gen > l.syncedGen {
			need = max(need, rs.gen)
		}
	}
	for l.syncedGen < need {
		if l.syncing {
			l.cond.Wait()
			continue
		}
		l.syncing = true
		upTo := l.setGen
		l.mu.Unlock()
		err := l.intent.Sync()
		l.mu.Lock()
		l.syncing = false
		l.cond.Broadcast()
		if err != nil {
			l.endLocked(r0, r1)
			return nil, fmt.Errorf("write-intent map: %w", err)
		}
		l.syncedGen = max(l.syncedGen, upTo)
	}
	// Legs chosen after the wait, in the same critical section as their
	// stale bits, so a leg changing state meanwhile is seen consistently.
	for _, lg := range l.legs {
		if lg.state == legFailed {
			for r := r0; r <= r1; r++ {
				lg.stale.Set(r)
			}
		}
	}
	return l.receiversLocked(), nil
}

func (l *Layer) end(r0, r1 int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLocked(r0, r1)
}

func (l *Layer) endLocked(r0, r1 int64) {
	for r := r0; r <= r1; r++ {
		rs := l.dirty[r]
		rs.inflight--
		rs.epoch = max(rs.epoch, l.epoch)
		rs.last = now()
	}
}

// onEach runs fn on every target's device concurrently.
func onEach(ts []target, fn func(block.Layer) error) []error {
	errs := make([]error, len(ts))
	if len(ts) == 1 {
		errs[0] = fn(ts[0].dev)
		return errs
	}
	var wg sync.WaitGroup
	for k := 1; k < len(ts); k++ {
		wg.Go(func() { errs[k] = fn(ts[k].dev) })
	}
	errs[0] = fn(ts[0].dev)
	wg.Wait()
	return errs
}

// finish fails the legs that returned errors, makes that durable, releases
// the references and decides the operation's outcome: success when a leg
// that took it is ok now (a leg ok when chosen may have failed meanwhile,
// and one that was rebuilding may have turned ok). A leg that refused the
// operation for want of space is not failed (see "A full store" in the
// package comment): the operation fails with that error, and the regions
// it touched (regions lists them; nil: every region with its intent bit
// set) are marked diverged.
func (l *Layer) finish(ts []target, errs []error, what string, regions func() []int64) error {
	failed := false
	var first, full error
	for k, t := range ts {
		if errs[k] == nil {
			continue
		}
		if first == nil {
			first = fmt.Errorf("leg %d: %w", t.i, errs[k])
		}
		if block.StoreRefused(errs[k]) {
			if full == nil {
				full = fmt.Errorf("leg %d: %w", t.i, errs[k])
			}
			continue
		}
		if l.failLeg(t.i, t.dev, errs[k]) {
			failed = true
		}
	}
	if full != nil {
		var rs []int64
		if regions != nil {
			rs = regions()
		}
		l.diverged(rs)
	}
	took := false
	var diverged []target
	l.mu.Lock()
	for k, t := range ts {
		if errs[k] != nil {
			continue
		}
		if lg := l.legs[t.i]; lg.dev == t.dev && lg.state == legOK {
			took = true
		} else if lg.dev == t.dev && lg.state == legRebuilding {
			diverged = append(diverged, t)
		}
	}
	// A leg another operation failed may have been skipped here while
	// that operation still records the failure (or failed to): the
	// failure must be durable before this is acknowledged (invariant 3),
	// or a restart could resync from the leg that missed it.
	failed = failed || l.persisted != l.stateVer
	l.mu.Unlock()
	if !took && full == nil {
		// A rebuilding leg that took it now holds data no ok leg has,
		// outside its stale map. Fail it. (After a refusal for want of
		// space diverged made the regions stale for it instead.)
		for _, t := range diverged {
			if l.failLeg(t.i, t.dev, errors.New("diverged from the ok legs on a failed write")) {
				failed = true
			}
		}
	}
	release(ts)
	if failed {
		if err := l.persist(); err != nil {
			return fmt.Errorf("mirror: %s: %w", what, err)
		}
	}
	if full != nil {
		// Not acknowledged even if an ok leg took it: the leg that
		// refused it is in service, and would be read as current.
		return fmt.Errorf("mirror: %s: %w", what, full)
	}
	if !took {
		if first == nil {
			first = errors.New("every leg that took it has failed")
		}
		return fmt.Errorf("mirror: %s: no healthy leg took it: %w", what, first)
	}
	return nil
}

// Flush implements block.Device: every leg taking writes flushes; then
// intent bits of regions quiet since the previous flush are cleared.
func (l *Layer) Flush() error {
	if err := l.usable(); err != nil {
		return err
	}
	if !l.caps.Flush {
		return block.ErrNotSupported
	}
	return l.flushAll(false)
}

// flushAll flushes every receiving leg. final (Close) clears every intent
// bit whose writes completed before the flush; otherwise only bits whose
// last write completed before the previous flush started and at least
// clearDelay ago (hysteresis: a region written again soon keeps its bit,
// saving a metadata sync per return).
func (l *Layer) flushAll(final bool) error {
	l.mu.Lock()
	e := l.epoch
	l.epoch++
	ver := l.legsVer
	ts := l.receiversLocked()
	l.mu.Unlock()
	if !l.caps.Flush { // legs without flush: nothing is ever durable to clear for
		release(ts)
		return nil
	}
	l.syncs.RLock()
	errs := onEach(ts, func(d block.Layer) error { return d.Flush() })
	// A flush refused for want of space may have dropped writes the leg
	// had taken (a writeback that found no space): every region written
	// since the last flush may differ now.
	err := l.finish(ts, errs, "flush", nil)
	l.syncs.RUnlock()
	if err != nil {
		return err
	}
	for _, err := range errs {
		if err != nil {
			return nil // a leg failed: leave the intent map alone this time
		}
	}
	if l.readOnly {
		return nil
	}
	if err := l.clearIntent(e, ver, final); err != nil {
		// The data is durable; only the map could not be trimmed.
		l.log.Warn("mirror: could not clear write-intent bits", "err", err)
	}
	if !final {
		l.kickResync()
	}
	return nil
}

// diverged records that the legs may differ in regions (nil: every region
// whose intent bit is set) after an operation some leg refused for want of
// space: with more than one ok leg they become unsynced — read from the
// source leg only, until a resync copies them across, their intent bits
// kept until then (invariant 1) — and every leg that is not ok gets them
// stale (invariant 2). The regions' intent bits are set: the operation set
// them before it began, or they are the set ones.
func (l *Layer) diverged(regions []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if regions == nil {
		for r := range l.dirty {
			regions = append(regions, r)
		}
		l.dropCopiesLocked()
	}
	oks := 0
	for _, lg := range l.legs {
		if lg.state == legOK {
			oks++
		}
	}
	for _, r := range regions {
		rs := l.dirty[r]
		if rs == nil {
			continue
		}
		rs.refusals++
		if oks > 1 && !rs.unsynced {
			rs.unsynced = true
			l.unsynced++
		}
		for _, lg := range l.legs {
			if lg.state != legOK {
				lg.stale.Set(r)
				// A rebuild that copied r already must not clear this
				// bit as its copy's: the leg missed what came after.
				delete(lg.copied, r)
			}
		}
	}
}

// dropCopiesLocked forgets the copies rebuilds made since their last
// checkpoint: a refused flush (or FUA write) may have dropped them (they
// set no intent bit), and the rebuild's own flush before its checkpoint
// may then succeed. The legs' stale bits for them stay, to be copied
// again.
func (l *Layer) dropCopiesLocked() {
	for _, lg := range l.legs {
		if lg.state != legOK {
			lg.dropCopiesLocked()
		}
	}
}

// dropCopiesLocked forgets the leg's copies, also one under way.
func (lg *leg) dropCopiesLocked() {
	lg.copied = nil
	lg.drops++
}

// clearIntent clears the intent bits a flush that started at epoch e and
// saw leg version ver made redundant (invariant 1). Stale maps are synced
// first (invariant 2); the cleared bits reach the disk with the next
// intent Sync (a setter's or Close's). Besides, a region must have been
// quiet for clearDelay (except at Close).
func (l *Layer) clearIntent(e, ver uint64, final bool) error {
	l.mu.Lock()
	if l.legsVer != ver || l.persisted != l.stateVer || len(l.dirty) == 0 {
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	// A leg's writeback that found no space is reported to one sync only:
	// this flush's may have succeeded while a concurrent flush or FUA
	// write was told of writes the leg dropped. Wait for the syncs under
	// way to record their refusals (diverged: the regions turn unsynced,
	// or stale) before anything is cleared.
	l.syncs.Lock()
	//lint:ignore SA2001 a barrier: nothing to guard
	l.syncs.Unlock()
	l.mu.Lock()
	var stale []int
	for i, lg := range l.legs {
		if lg.state != legOK {
			stale = append(stale, i)
		}
	}
	l.mu.Unlock()
	for _, i := range stale {
		if err := l.legs[i].stale.Sync(); err != nil {
			return fmt.Errorf("leg %d stale map: %w", i, err)
		}
	}
	quietSince := now() - l.clearDelay.Load()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.legsVer != ver {
		return nil
	}
	for r, rs := range l.dirty {
		if rs.inflight == 0 && !rs.unsynced && (rs.epoch < e && rs.last <= quietSince || final && rs.epoch <= e) {
			delete(l.dirty, r)
			l.intent.Clear(r)
		}
	}
	return nil
}

// longAgo marks a region with no write since open: clearable at once.
const longAgo = math.MinInt64 / 2

// start is the origin of now.
var start = time.Now()

// now is monotonic nanoseconds.
func now() int64 { return int64(time.Since(start)) }

// ReadCopy implements block.Copies: leg i alone (it must be ok).
func (l *Layer) ReadCopy(i int, p []byte, off int64) error {
	if err := l.usable(); err != nil {
		return err
	}
	if i < 0 || i >= len(l.legs) {
		return fmt.Errorf("mirror: no copy %d (of %d)", i, len(l.legs))
	}
	l.mu.Lock()
	if st := l.legs[i].state; st != legOK {
		l.mu.Unlock()
		return fmt.Errorf("mirror: copy %d is %s", i, st)
	}
	t := l.acquireLocked(i)
	l.mu.Unlock()
	err := t.dev.ReadAt(p, off)
	if err != nil {
		failed := l.failLeg(i, t.dev, err)
		t.refs.Done()
		if failed {
			if perr := l.persist(); perr != nil {
				return fmt.Errorf("mirror: copy %d read %d+%d: %w (and %v)", i, off, len(p), err, perr)
			}
		}
		return fmt.Errorf("mirror: copy %d read %d+%d: %w", i, off, len(p), err)
	}
	t.refs.Done()
	return nil
}

// WriteCopy implements block.Copies: a repair of leg i only. It takes the
// range lock (no resync or write interleaves) but sets no intent bit: a
// crash mid-repair leaves the copy as bad as before, for the layer above
// to find again.
func (l *Layer) WriteCopy(i int, p []byte, off int64) error {
	if err := l.usable(); err != nil {
		return err
	}
	if l.caps.ReadOnly {
		return block.ErrReadOnly
	}
	if i < 0 || i >= len(l.legs) {
		return fmt.Errorf("mirror: no copy %d (of %d)", i, len(l.legs))
	}
	if len(p) == 0 {
		return nil
	}
	lk := l.locks.lock(off, off+int64(len(p)))
	defer l.locks.unlock(lk)
	l.mu.Lock()
	if st := l.legs[i].state; st == legFailed {
		l.mu.Unlock()
		return fmt.Errorf("mirror: copy %d is failed", i)
	}
	t := l.acquireLocked(i)
	l.mu.Unlock()
	err := t.dev.WriteAt(p, off, false)
	if err == nil || block.StoreRefused(err) {
		// Refused for want of space, the copy is as bad as before (and
		// no worse than a crash mid-repair leaves it); the leg is fine.
		t.refs.Done()
		if err != nil {
			return fmt.Errorf("mirror: copy %d write %d+%d: %w", i, off, len(p), err)
		}
		return nil
	}
	failed := l.failLeg(i, t.dev, err)
	t.refs.Done()
	if failed {
		if perr := l.persist(); perr != nil {
			return fmt.Errorf("mirror: copy %d write %d+%d: %w (and %v)", i, off, len(p), err, perr)
		}
	}
	return fmt.Errorf("mirror: copy %d write %d+%d: %w", i, off, len(p), err)
}
