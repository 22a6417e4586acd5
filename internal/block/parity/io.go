package parity

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// legError is an I/O failure of a leg (or of several, in one stripe
// update): the operation that gets one marks the legs failed (markFailed)
// and carries on without them.
type legError struct {
	leg  int
	also []int // more legs that failed in the same update
	err  error
}

func (e *legError) Error() string { return fmt.Sprintf("parity leg %d: %v", e.leg, e.err) }
func (e *legError) Unwrap() error { return e.err }
func (e *legError) legs() []int   { return append([]int{e.leg}, e.also...) }

func asLegError(err error) *legError {
	var le *legError
	if errors.As(err, &le) {
		return le
	}
	return nil
}

// spaceError is a leg's refusal of a write or flush for want of space or
// quota (ENOSPC, EDQUOT): the store is full, the leg is not broken, so it
// is not a legError (see "A full store" in the package comment).
type spaceError struct {
	leg int
	err error
}

func (e *spaceError) Error() string { return fmt.Sprintf("parity leg %d: %v", e.leg, e.err) }
func (e *spaceError) Unwrap() error { return e.err }

// legOp is one I/O on one leg.
type legOp struct {
	leg int
	fn  func(c block.Layer) error
}

func readOp(leg int, p []byte, off int64) legOp {
	return legOp{leg, func(c block.Layer) error { return c.ReadAt(p, off) }}
}

func writeOp(leg int, p []byte, off int64, fua bool) legOp {
	return legOp{leg, func(c block.Layer) error {
		if fua && !c.Capabilities().FUA {
			if err := c.WriteAt(p, off, false); err != nil {
				return err
			}
			return c.Flush()
		}
		return c.WriteAt(p, off, fua)
	}}
}

// runAll runs ops, concurrently when there are several, and returns each
// one's error (leg errors as *legError). The caller holds mode.
func (l *Layer) runAll(ops []legOp) []error {
	errs := make([]error, len(ops))
	do := func(i int) {
		op := ops[i]
		// Any error is the leg's failure: one that declared an operation
		// and then refuses it is broken, and a write that reached only
		// some legs is only safe once the others know. Except a refusal
		// for want of space: the store is full, and the stripes it may
		// have left inconsistent wait for settle instead (unsettleOn).
		if err := op.fn(l.children[op.leg]); err != nil {
			if block.StoreRefused(err) {
				errs[i] = &spaceError{leg: op.leg, err: err}
			} else {
				errs[i] = &legError{leg: op.leg, err: err}
			}
		}
	}
	if len(ops) == 1 {
		do(0)
		return errs
	}
	var wg sync.WaitGroup
	for i := range ops {
		wg.Go(func() { do(i) })
	}
	wg.Wait()
	return errs
}

// run is runAll returning the first error.
func (l *Layer) run(ops []legOp) error {
	for _, err := range l.runAll(ops) {
		if err != nil {
			return err
		}
	}
	return nil
}

// writePhase issues a stripe update's writes. landed reports that every
// write succeeded except, at most, those to one leg of a stripe that had
// no missing leg: then the stripe is complete and consistent on the other
// legs (parity was computed from everything beforehand), and the update
// counts as done once that leg is marked failed.
func (l *Layer) writePhase(ops []legOp, healthy bool) (landed bool, err error) {
	var first *legError
	var other error
	for _, e := range l.runAll(ops) {
		le := asLegError(e)
		switch {
		case e == nil:
		case le == nil:
			other = e
		case first == nil:
			first = le
		case first.leg != le.leg && !slices.Contains(first.also, le.leg):
			first.also = append(first.also, le.leg)
		}
	}
	if first == nil {
		return other == nil, other
	}
	// The legs that failed may hold stale chunks of this stripe once its
	// lock is released, until markFailed takes them out: see failing.
	for _, f := range first.legs() {
		l.failing[f].Store(true)
	}
	if other != nil {
		// Another leg refused its write for want of space: its chunk may
		// be stale too, and it stays in service, so the stripe must be
		// unsettled (the caller's unsettleOn finds the refusal in the
		// error) before markFailed starts a new epoch (it freezes then).
		first.err = errors.Join(first.err, other)
	}
	// Two legs failed in one update: the stripe may be inconsistent, and
	// markFailed must see both at once (it freezes the layer).
	return healthy && len(first.also) == 0 && other == nil, first
}

// flushLegs flushes every leg that is not failed, except leg except. A
// flush a leg refuses for want of space may have dropped writes it had
// taken, so every stripe updated since the last flush becomes unsettled.
func (l *Layer) flushLegs(except int) error {
	var ops []legOp
	for i, st := range l.state {
		if st != legFailed && i != except {
			ops = append(ops, legOp{i, func(c block.Layer) error { return c.Flush() }})
		}
	}
	// Every error counts: a refusal for want of space besides a leg's
	// failure still unsettles (and markFailed then freezes rather than
	// start a new epoch). A leg's failure is returned first, for the
	// caller to take the leg out.
	var first error
	for _, err := range l.runAll(ops) {
		if err == nil {
			continue
		}
		l.unsettleOn(err, -1, -1)
		if first == nil || asLegError(first) == nil && asLegError(err) != nil {
			first = err
		}
	}
	return first
}

// unsettleOn records, if err holds a leg's refusal for want of space, that
// stripes [from, to) may be inconsistent on disk — from < 0: every stripe
// updated since the last flush that completed (a refused flush may have
// dropped what the leg had taken) — so that nothing is updated, cleaned
// or reconstructed from them until settle has recovered them. Their
// intent bits are set: an update sets its stripe's before it writes, and
// only a completed flush lets clean clear one. The caller holds mode.
func (l *Layer) unsettleOn(err error, from, to int64) {
	var se *spaceError
	if !errors.As(err, &se) {
		return
	}
	l.mu.Lock()
	if l.unsettledStripes == nil {
		l.unsettledStripes = map[int64]bool{}
	}
	if from < 0 {
		for s := range l.dirty {
			l.unsettledStripes[s] = true
		}
		for s := range l.updating {
			l.unsettledStripes[s] = true
		}
	}
	for s := max(from, 0); s < to; s++ {
		l.unsettledStripes[s] = true
	}
	l.mu.Unlock()
	l.needSettle(true, false, err)
}

// unsettledErr is the error updates are refused with until settle has
// done its work (nil when there is none).
func (l *Layer) unsettledErr() error {
	if p := l.unsettled.Load(); p != nil {
		return fmt.Errorf("parity: no update until stripes a full store left unsettled are recovered: %w", p.err)
	}
	return nil
}

// isUnsettled reports whether stripe s may be inconsistent on disk (its
// missing chunk cannot be reconstructed from it).
func (l *Layer) isUnsettled(s int64) bool {
	if l.unsettled.Load() == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unsettledStripes[s]
}

// lockStripe locks stripe s (and the stripes sharing its lock slot).
func (l *Layer) lockStripe(s int64) *sync.Mutex {
	mu := &l.locks[s%lockSlots]
	mu.Lock()
	return mu
}

// syncBitmap makes every bitmap change so far durable, then frees the
// journal pairs of stripes whose intent bits were cleared before it.
func (l *Layer) syncBitmap() error {
	l.mu.Lock()
	rel := l.releasable
	l.releasable = nil
	l.mu.Unlock()
	if err := l.bm.Sync(); err != nil {
		l.mu.Lock()
		l.releasable = append(l.releasable, rel...)
		l.mu.Unlock()
		return fmt.Errorf("parity bitmap: %w", err)
	}
	if len(rel) > 0 {
		l.mu.Lock()
		l.jr.free = append(l.jr.free, rel...)
		l.pairEvents++
		l.pairCond.Broadcast()
		l.mu.Unlock()
	}
	return nil
}

// beginUpdate and endUpdate bracket the modification of stripe s (its
// lock held): an updating stripe is never cleaned.
func (l *Layer) beginUpdate(s int64) {
	l.mu.Lock()
	l.updating[s]++
	l.mu.Unlock()
}

func (l *Layer) endUpdate(s int64) {
	l.mu.Lock()
	if l.updating[s]--; l.updating[s] == 0 {
		delete(l.updating, s)
	}
	l.dirty[s] = dirtyStripe{l.flushGen, time.Now()}
	l.pairEvents++
	l.pairCond.Broadcast()
	l.mu.Unlock()
}

// ensureIntent makes stripe s's intent bit set and durable. Sync is
// called even when the bit was already set: another writer may have set it
// and not synced yet.
func (l *Layer) ensureIntent(s int64) error {
	l.bm.Set(l.intentBit(s, l.epoch))
	return l.syncBitmap()
}

// preIntent sets the intent bits of a request's stripes with one sync (an
// optimisation: each stripe still calls ensureIntent under its lock) —
// except those missing a data chunk, whose bit must follow their journal
// entry (see needsJournal). Every stripe whose bit it sets is recorded
// dirty at once, so that clean clears the bit even if the request never
// updates the stripe (a stripe before it failed, or this sync did): a bit
// left set would make a crash in which a leg vanishes mark the stripe,
// never modified, lost. Cleaning it before the update begins is harmless:
// the update sets it again (ensureIntent).
func (l *Layer) preIntent(first, last int64) error {
	l.mode.RLock()
	defer l.mode.RUnlock()
	if l.closed {
		return block.ErrClosed
	}
	var set []int64
	for s := first; s <= last; s++ {
		if m, _ := l.missingFor(s); !l.needsJournal(s, m) && l.bm.Set(l.intentBit(s, l.epoch)) {
			set = append(set, s)
		}
	}
	if len(set) == 0 {
		return nil
	}
	l.mu.Lock()
	now := time.Now()
	for _, s := range set {
		l.dirty[s] = dirtyStripe{l.flushGen, now}
	}
	l.mu.Unlock()
	return l.syncBitmap()
}

// defaultCleanDelay: a stripe updated in the interval just before a Flush
// keeps its intent bit through that Flush unless it has been idle this
// long, so a stripe written between every pair of flushes (a database's
// hot block) does not cost a bitmap sync per write, while a stripe written
// once is cleared at the next Flush or the one after.
const defaultCleanDelay = 500 * time.Millisecond

// clean clears the intent bits of stripes whose last update completed
// before flush number g started (their data and parity are durable) and
// that are not being updated — all of them if immediate, else those not
// updated since flush g-1 or idle for l.cleanDelay — and queues their
// journal pairs for release. It reports how many it cleared. The caller
// holds mode.
func (l *Layer) clean(g uint64, immediate bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unsettled.Load() != nil {
		// A stripe a full store left inconsistent keeps its bit until
		// settle has recovered it (which clears every bit itself).
		return 0
	}
	now := time.Now()
	cleared := 0
	for s, d := range l.dirty {
		if d.gen > g || l.updating[s] > 0 {
			continue
		}
		if !immediate && d.gen == g && now.Sub(d.at) < l.cleanDelay {
			continue
		}
		l.bm.Clear(l.intentBit(s, l.epoch))
		delete(l.dirty, s)
		cleared++
		if pu := l.jr.owner[s]; pu != nil {
			delete(l.jr.owner, s)
			l.releasable = append(l.releasable, pu.pair)
		}
	}
	return cleared
}

// acquirePair returns stripe s's journal pair, claiming a free one if it
// has none. With none free it flushes, cleans and syncs (which frees the
// pairs of every stripe not being updated) and, if all pairs belong to
// stripes being updated, waits for one of those to finish. The caller
// holds mode and s's lock; a stripe holding a pair never waits for one,
// so this cannot wait on itself.
func (l *Layer) acquirePair(s int64) (*pairUse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if pu := l.jr.owner[s]; pu != nil {
			return pu, nil
		}
		if k := len(l.jr.free); k > 0 {
			pu := &pairUse{pair: l.jr.free[k-1], last: -1}
			l.jr.free = l.jr.free[:k-1]
			l.jr.owner[s] = pu
			return pu, nil
		}
		ev := l.pairEvents
		l.mu.Unlock()
		err := l.internalFlush()
		l.mu.Lock()
		if err != nil {
			return nil, err
		}
		if len(l.jr.free) > 0 {
			continue
		}
		for l.pairEvents == ev {
			l.pairCond.Wait()
		}
	}
}

// internalFlush flushes the legs and cleans every stripe updated before
// it. As in Flush, no intent bit is cleared while a leg that failed a
// write is not yet out (its stripe is inconsistent on disk until then)
// or the layer is frozen: it answers the failing leg's error, which sends
// the caller through markFailed, or errFrozen. The caller holds mode.
func (l *Layer) internalFlush() error {
	l.mu.Lock()
	g := l.flushGen
	l.flushGen++
	l.mu.Unlock()
	if err := l.flushLegs(-1); err != nil {
		return err
	}
	if err := l.failingError(); err != nil {
		return err
	}
	if l.frozen.Load() {
		return errFrozen
	}
	if err := l.unsettledErr(); err != nil {
		return err // clean frees nothing until settle ran
	}
	l.clean(g, true)
	return l.syncBitmap()
}

// needsJournal reports whether stripe s, with leg m missing, has a data
// chunk that exists only as parity. Its updates write the journal entry
// first and only then set the intent bit, so a stripe whose bit is set
// on disk has its newest entry from the current dirty period: an older
// entry of the stripe may survive in a pair since reused by other
// stripes, and must never be the newest when the bit is set.
func (l *Layer) needsJournal(s int64, m int) bool { return m >= 0 && m != l.parityLeg(s) }

// journalPut records that stripe s's chunk on missing leg m holds data
// (nil: zeroes), durably, before the stripe is modified.
func (l *Layer) journalPut(s int64, m int, data []byte) error {
	pu, err := l.acquirePair(s)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.jr.gen++
	gen := l.jr.gen
	l.mu.Unlock()
	return l.jr.put(pu, gen, l.epoch, s, m, data)
}

// hasEntry reports whether stripe s has a journal entry in this epoch
// that is still its missing chunk's content (it holds a pair, and every
// change of that chunk writes a new entry first).
func (l *Layer) hasEntry(s int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	pu := l.jr.owner[s]
	return pu != nil && pu.last >= 0
}

// piece is the part of a stripe update in one data chunk.
type piece struct {
	d    int   // data chunk
	a, b int64 // columns [a, b) within the chunk
	at   int64 // offset in the source
}

// pieces splits [lo, hi) of a stripe's data into per-chunk pieces.
func (l *Layer) pieces(lo, hi int64) []piece {
	var out []piece
	for x := lo; x < hi; {
		d := int(x / l.chunk)
		a := x % l.chunk
		b := min(l.chunk, a+hi-x)
		out = append(out, piece{d: d, a: a, b: b, at: x - lo})
		x += b - a
	}
	return out
}

// WriteAt implements block.Device.
func (l *Layer) WriteAt(p []byte, off int64, fua bool) error {
	if err := l.inRange(off, int64(len(p))); err != nil {
		return err
	}
	if l.ro {
		return block.ErrReadOnly
	}
	if l.frozen.Load() {
		return errFrozen
	}
	if len(p) == 0 {
		return nil
	}
	if err := l.settle(); err != nil {
		return err
	}
	return l.writeRange(off, int64(len(p)), p, fua)
}

// writeRange writes p (nil: zeroes) to [off, off+n), its stripes
// concurrently (up to stripeWorkers at a time; each takes its own lock). A
// FUA request spanning stripes is written without FUA and the legs
// flushed once at the end: durable on return all the same, with one
// fdatasync per leg instead of one per chunk.
func (l *Layer) writeRange(off, n int64, p []byte, fua bool) error {
	first, last := off/l.dsz, (off+n-1)/l.dsz
	if err := l.preIntent(first, last); err != nil {
		return err
	}
	var zeroes []byte
	if p == nil {
		zeroes = make([]byte, min(n, l.dsz))
	}
	one := func(s int64) error {
		base := s * l.dsz
		lo, hi := max(off, base)-base, min(off+n, base+l.dsz)-base
		var src []byte
		if p != nil {
			src = p[base+lo-off : base+hi-off]
		} else {
			src = zeroes[:hi-lo]
		}
		return l.writeStripe(s, lo, hi, src, fua && first == last)
	}
	if first == last {
		return one(first)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ferr error
		sem  = make(chan struct{}, stripeWorkers)
	)
	for s := first; s <= last; s++ {
		sem <- struct{}{}
		mu.Lock()
		failed := ferr != nil
		mu.Unlock()
		if failed {
			<-sem
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := one(s); err != nil {
				mu.Lock()
				ferr = cmp.Or(ferr, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if ferr != nil {
		return ferr
	}
	if fua {
		return l.flushAll()
	}
	return nil
}

// stripeWorkers bounds the stripes of one request written at once.
const stripeWorkers = 4

// flushAll flushes every leg that is not failed; a leg failing its flush
// is marked failed (which flushes the others).
func (l *Layer) flushAll() error {
	l.mode.RLock()
	if l.closed {
		l.mode.RUnlock()
		return block.ErrClosed
	}
	err := l.flushLegs(-1)
	l.mode.RUnlock()
	if le := asLegError(err); le != nil {
		return l.markFailed(le)
	}
	return err
}

// retry runs op until it succeeds, fails for a reason other than a leg, or
// has seen every leg fail: each leg error marks that leg failed (persisted)
// and op runs again, now treating the leg as missing — unless op reports the
// data landed anyway. With locked, op runs under the mode lock and is
// refused once the layer is closed.
func (l *Layer) retry(locked bool, op func() (landed bool, err error)) error {
	for try := 0; ; try++ {
		var landed bool
		var err error
		if locked {
			l.mode.RLock()
			if l.closed {
				l.mode.RUnlock()
				return block.ErrClosed
			}
			landed, err = op()
			l.mode.RUnlock()
		} else {
			landed, err = op()
		}
		le := asLegError(err)
		if le == nil || try > l.n {
			return err
		}
		if landed && l.landedHook != nil {
			l.landedHook()
		}
		if ferr := l.markFailed(le); ferr != nil {
			return ferr
		}
		if landed {
			return nil
		}
	}
}

// retryUpdate is retry for an update of stripes [from, to) that clears
// the lost marks of the chunks it overwrites whole (covered(s) lists their
// legs) once it is durable. When op reports the update landed although a
// leg failed — its writes (writePhase), or the flush before the marks are
// cleared — op returned before clearing them and retry acknowledges the
// update once that leg is marked failed: the marks are cleared then, with
// the failed leg out (its chunk is reconstructed from the update's), or
// every later read of the acknowledged data would fail.
func (l *Layer) retryUpdate(locked bool, from, to int64, covered func(s int64) []int, op func() (bool, error)) error {
	done := false
	err := l.retry(locked, func() (bool, error) {
		landed, err := op()
		done = err == nil
		return landed, err
	})
	if err != nil || done {
		return err
	}
	return l.retry(true, func() (bool, error) {
		if l.frozen.Load() {
			return false, nil // nothing is persisted now; the marks stay (EIO, never wrong data)
		}
		return false, l.clearLost(from, to, covered, -1, false)
	})
}

// writeStripe applies src to [lo, hi) of stripe s's data, retrying after a
// leg failure (the stripe is then handled as degraded).
func (l *Layer) writeStripe(s, lo, hi int64, src []byte, fua bool) error {
	ps := l.pieces(lo, hi)
	return l.retryUpdate(true, s, s+1, func(s int64) []int { return l.covered(s, ps) },
		func() (bool, error) { return l.updateStripe(s, lo, hi, src, fua) })
}

func (l *Layer) updateStripe(s, lo, hi int64, src []byte, fua bool) (bool, error) {
	mu := l.lockStripe(s)
	defer mu.Unlock()
	l.beginUpdate(s)
	defer l.endUpdate(s)
	if err := l.failingError(); err != nil {
		return false, err
	}
	if err := l.unsettledErr(); err != nil {
		return false, err
	}
	m, cnt := l.missingFor(s)
	if cnt > 1 {
		return false, errTooManyFailed
	}
	if !l.needsJournal(s, m) {
		if err := l.ensureIntent(s); err != nil {
			return false, err
		}
	}
	ps := l.pieces(lo, hi)
	var landed bool
	var err error
	switch {
	case m < 0:
		landed, err = l.writeHealthy(s, lo, hi, ps, src, fua)
	case m == l.parityLeg(s):
		var ops []legOp
		for _, pc := range ps {
			ops = append(ops, writeOp(l.dataLeg(s, pc.d), src[pc.at:pc.at+pc.b-pc.a], s*l.chunk+pc.a, fua))
		}
		landed, err = l.writePhase(ops, false)
	default:
		landed, err = l.writeDegraded(s, m, ps, src, fua)
	}
	if err != nil {
		l.unsettleOn(err, s, s+1)
		return landed, err
	}
	return true, l.clearLost(s, s+1, func(s int64) []int { return l.covered(s, ps) }, m, fua)
}

// covered returns the legs of the data chunks of stripe s that pieces ps
// overwrite entirely: from column 0 to the chunk's end or to the device's
// end, whichever comes first. (The tail of the last stripe past the
// device's end holds no data: no write reaches it, write-zeroes to the end
// zeroes it with the rest of the stripe, and a Resize exposes it as it
// is. In a lost chunk it holds what recovery stood in for the chunk,
// zeroes — as on legs zeroed at creation every tail does — which
// reconstruction, a rebuild and the journal carry on.) The caller holds
// mode.
func (l *Layer) covered(s int64, ps []piece) []int {
	var legs []int
	size := l.size.Load()
	for _, pc := range ps {
		if pc.a == 0 && (pc.b == l.chunk || s*l.dsz+int64(pc.d)*l.chunk+pc.b >= size) {
			legs = append(legs, l.dataLeg(s, pc.d))
		}
	}
	return legs
}

// everyLeg is covered for updates that overwrite whole stripes.
func (l *Layer) everyLeg(int64) []int {
	legs := make([]int, l.n)
	for i := range legs {
		legs[i] = i
	}
	return legs
}

// clearLost clears the lost marks of the chunks of stripes [from, to)
// that an update overwrote entirely (covered(s) lists their legs), once
// the update is durable — a crash before that must still say lost: the
// legs but except are flushed first, unless the update was written with
// FUA. The caller holds mode and the stripes (or, after a leg failed
// under the update, mode only: see retryUpdate).
func (l *Layer) clearLost(from, to int64, covered func(s int64) []int, except int, fua bool) error {
	if l.lost.Load() == 0 {
		return nil
	}
	var bits []int64
	for s := from; s < to; s++ {
		for _, leg := range covered(s) {
			if b := l.lostBit(s, leg); l.bm.Get(b) {
				bits = append(bits, b)
			}
		}
	}
	if len(bits) == 0 {
		return nil
	}
	if !fua {
		if err := l.flushLegs(except); err != nil {
			return err
		}
	}
	for _, b := range bits {
		if l.bm.Clear(b) {
			l.lost.Add(-1)
		}
	}
	return l.syncBitmap()
}

// writeHealthy updates a stripe with every chunk present: a full stripe is
// encoded from the new data alone; otherwise it reads whichever is less —
// the old contents of the written ranges plus the parity (read-modify-
// write: new parity = old parity ⊕ old data ⊕ new data, per column) or the
// unwritten rest of the touched columns (reconstruct-write: parity encoded
// from the columns' full new data). Small writes take the first (2 reads
// whatever n is), writes covering most of a stripe the second.
func (l *Layer) writeHealthy(s, lo, hi int64, ps []piece, src []byte, fua bool) (bool, error) {
	C := l.chunk
	nd := l.n - 1
	if lo == 0 && hi == l.dsz {
		shards := make([][]byte, l.n)
		for d := range nd {
			shards[d] = src[int64(d)*C : int64(d+1)*C]
		}
		shards[nd] = make([]byte, C)
		if err := l.enc.Encode(shards); err != nil {
			return false, err
		}
		ops := make([]legOp, 0, l.n)
		for d := range nd {
			ops = append(ops, writeOp(l.dataLeg(s, d), shards[d], s*C, fua))
		}
		ops = append(ops, writeOp(l.parityLeg(s), shards[nd], s*C, fua))
		return l.writePhase(ops, true)
	}
	ca, cb := hull(ps)
	written, width := hi-lo, cb-ca
	if written+width <= int64(nd)*width-written {
		return l.writeRMW(s, ps, src, fua, true)
	}
	// Reconstruct-write over columns [ca, cb).
	cols := make([][]byte, l.n)
	var reads []legOp
	for d := range nd {
		cols[d] = make([]byte, width)
		a, b := ca, ca // the written part of chunk d
		for _, pc := range ps {
			if pc.d == d {
				a, b = pc.a, pc.b
			}
		}
		leg := l.dataLeg(s, d)
		if a > ca {
			reads = append(reads, readOp(leg, cols[d][:a-ca], s*C+ca))
		}
		if b < cb {
			reads = append(reads, readOp(leg, cols[d][b-ca:], s*C+b))
		}
	}
	if err := l.run(reads); err != nil {
		return false, err
	}
	for _, pc := range ps {
		copy(cols[pc.d][pc.a-ca:], src[pc.at:pc.at+pc.b-pc.a])
	}
	cols[nd] = make([]byte, width)
	if err := l.enc.Encode(cols); err != nil {
		return false, err
	}
	var ops []legOp
	for _, pc := range ps {
		ops = append(ops, writeOp(l.dataLeg(s, pc.d), src[pc.at:pc.at+pc.b-pc.a], s*C+pc.a, fua))
	}
	ops = append(ops, writeOp(l.parityLeg(s), cols[nd], s*C+ca, fua))
	return l.writePhase(ops, true)
}

// hull is the smallest column range covering every piece.
func hull(ps []piece) (int64, int64) {
	ca, cb := ps[0].a, ps[0].b
	for _, pc := range ps[1:] {
		ca, cb = min(ca, pc.a), max(cb, pc.b)
	}
	return ca, cb
}

// writeRMW is read-modify-write: read the old contents of the written
// ranges and the parity over their columns, fold old ⊕ new into the
// parity (reedsolomon Update), write data and parity. Every chunk it
// reads or writes must be present.
func (l *Layer) writeRMW(s int64, ps []piece, src []byte, fua, healthy bool) (bool, error) {
	C := l.chunk
	nd := l.n - 1
	ca, cb := hull(ps)
	par := make([]byte, cb-ca)
	old := make([][]byte, len(ps))
	reads := []legOp{readOp(l.parityLeg(s), par, s*C+ca)}
	for i, pc := range ps {
		old[i] = make([]byte, pc.b-pc.a)
		reads = append(reads, readOp(l.dataLeg(s, pc.d), old[i], s*C+pc.a))
	}
	if err := l.run(reads); err != nil {
		return false, err
	}
	for i, pc := range ps {
		shards := make([][]byte, l.n)
		news := make([][]byte, nd)
		shards[pc.d] = old[i]
		shards[nd] = par[pc.a-ca : pc.b-ca]
		news[pc.d] = src[pc.at : pc.at+pc.b-pc.a]
		if err := l.enc.Update(shards, news); err != nil {
			return false, err
		}
	}
	var ops []legOp
	for _, pc := range ps {
		ops = append(ops, writeOp(l.dataLeg(s, pc.d), src[pc.at:pc.at+pc.b-pc.a], s*C+pc.a, fua))
	}
	ops = append(ops, writeOp(l.parityLeg(s), par, s*C+ca, fua))
	return l.writePhase(ops, healthy)
}

// writeDegraded updates a stripe whose data chunk on leg m is missing.
// The chunk's new content is journaled first (invariant 2). When the
// update does not touch that chunk and the stripe's journal entry is
// current, nothing needs journaling and read-modify-write over the present
// legs does; otherwise the stripe is read whole, the missing chunk
// reconstructed (a lost one too, see below), the update merged, the chunk
// journaled and the parity encoded from all of it.
func (l *Layer) writeDegraded(s int64, m int, ps []piece, src []byte, fua bool) (bool, error) {
	C := l.chunk
	nd := l.n - 1
	dm := l.dataIndex(s, m)
	var cover *piece
	for i := range ps {
		if ps[i].d == dm {
			cover = &ps[i]
		}
	}
	if cover == nil && l.hasEntry(s) {
		if err := l.ensureIntent(s); err != nil {
			return false, err
		}
		return l.writeRMW(s, ps, src, fua, false)
	}
	shards := make([][]byte, l.n)
	for i := range shards {
		shards[i] = make([]byte, C)
	}
	var reads []legOp
	if cover != nil && cover.a == 0 && cover.b == C {
		// The missing chunk is overwritten whole: read only what the
		// update leaves of the present data chunks.
		for d := range nd {
			if d == dm {
				continue
			}
			a, b := int64(0), int64(0)
			for _, pc := range ps {
				if pc.d == d {
					a, b = pc.a, pc.b
				}
			}
			if a == b { // untouched
				a, b = C, C
			}
			leg := l.dataLeg(s, d)
			if a > 0 {
				reads = append(reads, readOp(leg, shards[d][:a], s*C))
			}
			if b < C {
				reads = append(reads, readOp(leg, shards[d][b:], s*C+b))
			}
		}
		if err := l.run(reads); err != nil {
			return false, err
		}
	} else {
		for d := range nd {
			if d != dm {
				reads = append(reads, readOp(l.dataLeg(s, d), shards[d], s*C))
			}
		}
		reads = append(reads, readOp(l.parityLeg(s), shards[nd], s*C))
		if err := l.run(reads); err != nil {
			return false, err
		}
		// A lost chunk is reconstructed too: the stripe is consistent
		// (recovery made it so with zeroes for the chunk), so this gives
		// zeroes and what partial writes put there since — or, when an
		// update that landed although a leg failed overwrote it whole and
		// its mark is about to be cleared (retryUpdate), that update's data,
		// which must not be replaced by zeroes meanwhile.
		shards[dm] = shards[dm][:0]
		if err := l.enc.ReconstructData(shards); err != nil {
			return false, err
		}
	}
	for _, pc := range ps {
		copy(shards[pc.d][pc.a:pc.b], src[pc.at:pc.at+pc.b-pc.a])
	}
	if err := l.journalPut(s, m, shards[dm]); err != nil {
		return false, err
	}
	if err := l.ensureIntent(s); err != nil {
		return false, err
	}
	if err := l.enc.Encode(shards); err != nil {
		return false, err
	}
	var ops []legOp
	for _, pc := range ps {
		if pc.d != dm {
			ops = append(ops, writeOp(l.dataLeg(s, pc.d), src[pc.at:pc.at+pc.b-pc.a], s*C+pc.a, fua))
		}
	}
	ops = append(ops, writeOp(l.parityLeg(s), shards[nd], s*C, fua))
	return l.writePhase(ops, false)
}

// ReadAt implements block.Device. Chunks on valid legs are read directly
// (concurrently, leg by leg); a chunk on a missing leg is reconstructed
// from the rest of its stripe under the stripe's lock.
func (l *Layer) ReadAt(p []byte, off int64) error {
	if err := l.inRange(off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	// Each retry follows a leg newly marked failed; there are n legs.
	return l.retry(true, func() (bool, error) { return false, l.readRange(p, off) })
}

// TryReadAt implements block.NoWaitReader: a read inside one chunk whose
// leg holds it valid, from that leg at once or not at all. Anything else
// (several chunks, a chunk to reconstruct, a leg that fails, the layer
// changing mode) is left to ReadAt.
func (l *Layer) TryReadAt(p []byte, off int64) bool {
	if len(p) == 0 || l.inRange(off, int64(len(p))) != nil || !l.mode.TryRLock() {
		return false
	}
	defer l.mode.RUnlock()
	C := l.chunk
	s, w := off/l.dsz, off%l.dsz
	if l.closed || w%C+int64(len(p)) > C {
		return false
	}
	leg := l.dataLeg(s, int(w/C))
	if !l.legValid(s, leg) || l.isLost(s, leg) {
		return false
	}
	return block.TryReadAt(l.children[leg], p, s*C+w%C)
}

// SpliceTo implements block.Splicer: chunk by chunk, in the volume's
// order, each from the leg that holds it valid, stopping at the first
// chunk that would have to be reconstructed (ReadAt does that) or that
// its leg does not move whole.
func (l *Layer) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	if l.chunk < block.SpliceMinPiece || l.inRange(off, int64(n)) != nil {
		return 0
	}
	if nowait {
		if !l.mode.TryRLock() {
			return 0
		}
	} else {
		l.mode.RLock()
	}
	defer l.mode.RUnlock()
	if l.closed {
		return 0
	}
	C := l.chunk
	moved := 0
	for moved < n {
		s, w := (off+int64(moved))/l.dsz, (off+int64(moved))%l.dsz
		m := min(int64(n-moved), C-w%C)
		leg := l.dataLeg(s, int(w/C))
		if !l.legValid(s, leg) || l.isLost(s, leg) {
			break
		}
		k := block.SpliceTo(l.children[leg], pipe, s*C+w%C, int(m), nowait)
		moved += k
		if int64(k) < m {
			break
		}
	}
	return moved
}

func (l *Layer) readRange(p []byte, off int64) error {
	C := l.chunk
	if s, w := off/l.dsz, off%l.dsz; w%C+int64(len(p)) <= C { // one chunk: the common small read
		leg := l.dataLeg(s, int(w/C))
		if l.legValid(s, leg) && !l.isLost(s, leg) {
			return l.run([]legOp{readOp(leg, p, s*C+w%C)})
		}
	}
	type recon struct {
		s    int64
		d    int
		a, b int64
		buf  []byte
	}
	direct := map[int][]legOp{}
	var rec []recon
	for x, end := off, off+int64(len(p)); x < end; {
		s, w := x/l.dsz, x%l.dsz
		d, a := int(w/C), w%C
		b := min(C, a+end-x)
		buf := p[x-off : x-off+b-a]
		leg := l.dataLeg(s, d)
		if l.isLost(s, leg) {
			return fmt.Errorf("read stripe %d leg %d: %w", s, leg, errLost)
		}
		if !l.legValid(s, leg) {
			rec = append(rec, recon{s, d, a, b, buf})
		} else {
			direct[leg] = append(direct[leg], readOp(leg, buf, s*C+a))
		}
		x += b - a
	}
	if len(direct) > 0 {
		ops := make([]legOp, 0, len(direct))
		for leg, list := range direct {
			ops = append(ops, legOp{leg, func(c block.Layer) error {
				for _, op := range list {
					if err := op.fn(c); err != nil {
						return err
					}
				}
				return nil
			}})
		}
		if err := l.run(ops); err != nil {
			return err
		}
	}
	for _, r := range rec {
		if err := l.readReconstruct(r.s, r.d, r.a, r.b, r.buf); err != nil {
			return err
		}
	}
	return nil
}

// readReconstruct reads columns [a, b) of data chunk d of stripe s, whose
// leg is missing, from the other chunks of the stripe.
func (l *Layer) readReconstruct(s int64, d int, a, b int64, dst []byte) error {
	mu := l.lockStripe(s)
	defer mu.Unlock()
	C := l.chunk
	leg := l.dataLeg(s, d)
	if l.legValid(s, leg) { // rebuilt meanwhile
		return l.run([]legOp{readOp(leg, dst, s*C+a)})
	}
	if _, cnt := l.missingFor(s); cnt > 1 {
		return fmt.Errorf("read stripe %d: %w", s, errTooManyFailed)
	}
	if l.suspect[s] {
		return fmt.Errorf("read stripe %d: its parity was not recovered (read-only or frozen open): %w", s, syscall.EIO)
	}
	if l.isUnsettled(s) {
		return fmt.Errorf("read stripe %d: its parity may not match its data until space is back to recover it: %w", s, syscall.EIO)
	}
	shards := make([][]byte, l.n)
	var reads []legOp
	for i := range l.n {
		if i == d {
			continue
		}
		shards[i] = make([]byte, b-a)
		from := l.parityLeg(s)
		if i < l.n-1 {
			from = l.dataLeg(s, i)
		}
		reads = append(reads, readOp(from, shards[i], s*C+a))
	}
	if err := l.run(reads); err != nil {
		return err
	}
	shards[d] = dst[:0]
	return l.enc.ReconstructData(shards)
}

// WriteZeroes implements block.Device. Whole stripes are zeroed on every
// leg with the legs' write-zeroes (parity of zeroes is zeroes); partial
// stripes at the ends are written with zeroes through the normal path.
// Zeroing up to the end of the device covers the tail of the last stripe.
func (l *Layer) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if err := l.inRange(off, n); err != nil {
		return err
	}
	if l.ro {
		return block.ErrReadOnly
	}
	if l.frozen.Load() {
		return errFrozen
	}
	if n <= 0 {
		return nil
	}
	if f.Fast && !l.caps.FastZero {
		return block.ErrNotSupported
	}
	if err := l.settle(); err != nil {
		return err
	}
	end := off + n
	if end == l.size.Load() {
		end = (end + l.dsz - 1) / l.dsz * l.dsz
	}
	fs, le := (off+l.dsz-1)/l.dsz, end/l.dsz // whole stripes [fs, le)
	if !l.legCaps.WriteZeroes || fs >= le {
		if f.Fast {
			return block.ErrNotSupported
		}
		return l.writeRange(off, n, nil, f.FUA)
	}
	if f.Fast && (off != fs*l.dsz || end != le*l.dsz) {
		return block.ErrNotSupported // not all of it would be fast
	}
	if off < fs*l.dsz {
		if err := l.writeRange(off, fs*l.dsz-off, nil, f.FUA); err != nil {
			return err
		}
	}
	if err := l.zeroStripes(fs, le, f); err != nil {
		return err
	}
	if tail := off + n; tail > le*l.dsz {
		return l.writeRange(le*l.dsz, tail-le*l.dsz, nil, f.FUA)
	}
	return nil
}

// Trim implements block.Device. The legs' trim is advisory (it may keep
// the data), which parity cannot allow — a leg keeping its chunk while
// another dropped its own would break the stripe — so whole stripes are
// zeroed instead (punching holes on file legs) and partial stripes are
// left alone.
func (l *Layer) Trim(off, n int64, fua bool) error {
	if err := l.inRange(off, n); err != nil {
		return err
	}
	if l.ro {
		return block.ErrReadOnly
	}
	if !l.caps.Trim {
		return block.ErrNotSupported
	}
	if l.frozen.Load() {
		return errFrozen
	}
	end := off + n
	if end == l.size.Load() {
		end = (end + l.dsz - 1) / l.dsz * l.dsz
	}
	fs, le := (off+l.dsz-1)/l.dsz, end/l.dsz
	if fs >= le {
		return nil
	}
	if err := l.settle(); err != nil {
		return err
	}
	return l.zeroStripes(fs, le, block.ZeroFlags{FUA: fua})
}

// zeroStripes zeroes whole stripes [from, to): in batches with one
// write-zeroes per leg while every leg is ok (hole punching costs a
// journal commit per call on some file systems), stripe by stripe
// otherwise (degraded stripes need a journal entry each).
func (l *Layer) zeroStripes(from, to int64, f block.ZeroFlags) error {
	if err := l.preIntent(from, to-1); err != nil {
		return err
	}
	for s := from; s < to; {
		e := min(to, s+zeroBatchStripes)
		handled := false
		err := l.retryUpdate(false, s, e, l.everyLeg, func() (bool, error) {
			h, landed, err := l.zeroBatch(s, e, f)
			handled = h || landed && asLegError(err) != nil
			return landed, err
		})
		if err != nil {
			return err
		}
		for t := s; t < e && !handled; t++ {
			if err := l.retryUpdate(true, t, t+1, l.everyLeg, func() (bool, error) { return l.zeroStripe(t, f) }); err != nil {
				return err
			}
		}
		s = e
	}
	return nil
}

// zeroBatchStripes is the stripes per batch of zeroStripes (within lockSlots,
// so a batch's stripes have distinct locks).
const zeroBatchStripes = 256

// zeroBatch zeroes stripes [from, to) with one write-zeroes per leg, all
// of them locked (in slot order, as rebuildBatch does), if every leg is
// ok; handled is false otherwise.
func (l *Layer) zeroBatch(from, to int64, f block.ZeroFlags) (handled, landed bool, err error) {
	l.mode.RLock()
	defer l.mode.RUnlock()
	if l.closed {
		return false, false, block.ErrClosed
	}
	if err := l.failingError(); err != nil {
		return false, false, err
	}
	if err := l.unsettledErr(); err != nil {
		return false, false, err
	}
	for _, st := range l.state {
		if st != legOK {
			return false, false, nil
		}
	}
	var slots []int
	for s := from; s < to; s++ {
		slots = append(slots, int(s%lockSlots))
	}
	slices.Sort(slots)
	for _, k := range slots {
		l.locks[k].Lock()
	}
	defer func() {
		for _, k := range slots {
			l.locks[k].Unlock()
		}
	}()
	for s := from; s < to; s++ {
		l.beginUpdate(s)
		l.bm.Set(l.intentBit(s, l.epoch))
	}
	defer func() {
		for s := from; s < to; s++ {
			l.endUpdate(s)
		}
	}()
	if err := l.syncBitmap(); err != nil {
		return true, false, err
	}
	C := l.chunk
	var ops []legOp
	for leg := range l.n {
		ops = append(ops, zeroOp(leg, from*C, (to-from)*C, f))
	}
	if landed, err := l.writePhase(ops, true); err != nil {
		l.unsettleOn(err, from, to)
		return true, landed, err
	}
	return true, true, l.clearLost(from, to, l.everyLeg, -1, f.FUA)
}

// zeroOp zeroes a leg range; a leg that cannot do it fast is made to do
// it slowly, since every leg must end up zeroed.
func zeroOp(leg int, off, n int64, f block.ZeroFlags) legOp {
	return legOp{leg, func(c block.Layer) error {
		err := c.WriteZeroes(off, n, f)
		if errors.Is(err, block.ErrNotSupported) && f.Fast {
			g := f
			g.Fast = false
			err = c.WriteZeroes(off, n, g)
		}
		return err
	}}
}

func (l *Layer) zeroStripe(s int64, f block.ZeroFlags) (bool, error) {
	mu := l.lockStripe(s)
	defer mu.Unlock()
	l.beginUpdate(s)
	defer l.endUpdate(s)
	if err := l.failingError(); err != nil {
		return false, err
	}
	if err := l.unsettledErr(); err != nil {
		return false, err
	}
	m, cnt := l.missingFor(s)
	if cnt > 1 {
		return false, errTooManyFailed
	}
	if l.needsJournal(s, m) {
		if err := l.journalPut(s, m, nil); err != nil {
			return false, err
		}
	}
	if err := l.ensureIntent(s); err != nil {
		return false, err
	}
	var ops []legOp
	for leg := range l.n {
		if leg != m {
			ops = append(ops, zeroOp(leg, s*l.chunk, l.chunk, f))
		}
	}
	landed, err := l.writePhase(ops, m < 0)
	if err != nil {
		l.unsettleOn(err, s, s+1)
		return landed, err
	}
	return true, l.clearLost(s, s+1, l.everyLeg, m, f.FUA)
}

// Flush implements block.Device: it flushes every leg that is not failed,
// notices legs whose backing store vanished (their Describe says failed),
// then clears the intent bits of stripes that are durable and cold (see
// clean) and syncs the bitmap if it cleared any, so that the set of
// stripes an unclean restart must recover stays small.
func (l *Layer) Flush() error {
	if err := l.settle(); err != nil {
		return err
	}
	l.mode.RLock()
	if l.closed {
		l.mode.RUnlock()
		return block.ErrClosed
	}
	if l.ro {
		l.mode.RUnlock()
		return nil
	}
	l.mu.Lock()
	g := l.flushGen
	l.flushGen++
	l.mu.Unlock()
	err := l.flushLegs(-1)
	if err == nil {
		for i, c := range l.children {
			if l.state[i] != legFailed && c.Describe().State == block.StateFailed {
				err = &legError{leg: i, err: errors.New("its backing store is gone")}
				break
			}
		}
	}
	// A frozen layer may hold inconsistent stripes (an update failed on
	// two legs): their intent bits must stay for the next open.
	// Nor may the bits be cleared while a leg that failed a write is not
	// yet out: its stripe is inconsistent on disk until then.
	if err == nil && !l.frozen.Load() && l.failingError() == nil && l.clean(g, false) > 0 {
		err = l.syncBitmap()
	}
	l.mode.RUnlock()
	if le := asLegError(err); le != nil {
		// markFailed flushes the other legs: what was written is durable.
		return l.markFailed(le)
	}
	if err == nil && l.rebuildStalled.CompareAndSwap(true, false) {
		// A rebuild stopped by a full store; there may be space again.
		l.startRebuild(nil)
	}
	return err
}

// Extents implements block.Device, chunk by chunk (up to 64 pieces per
// call). A piece reads as zero where its leg's chunk does (or, for a
// missing leg, where every other chunk of the stripe does), and is a hole
// only where it is a hole on every leg that is not missing.
func (l *Layer) Extents(off, n int64) ([]block.Extent, error) {
	if err := l.inRange(off, n); err != nil {
		return nil, err
	}
	if !l.caps.Extents {
		if n == 0 {
			return nil, nil // nothing to describe (block.Device)
		}
		return []block.Extent{{Length: n}}, nil
	}
	l.mode.RLock()
	defer l.mode.RUnlock()
	if l.closed {
		return nil, block.ErrClosed
	}
	var out []block.Extent
	healthy := l.healthy()
	for i, end := 0, off+n; off < end && i < 64; i++ {
		s, w := off/l.dsz, off%l.dsz
		if healthy && w == 0 {
			if e, stripes := l.zeroRun(s, (end-off+l.dsz-1)/l.dsz); stripes > 0 {
				e.Length = min(stripes*l.dsz, end-off)
				out = block.AppendExtent(out, e)
				off += e.Length
				continue
			}
		}
		d, a := int(w/l.chunk), w%l.chunk
		b := min(l.chunk, a+end-off)
		e := l.chunkExtent(s, d, a, b)
		out = block.AppendExtent(out, e)
		off += e.Length
	}
	return out, nil
}

// healthy reports whether every leg holds a valid chunk of every stripe
// and none is marked lost, suspect or unsettled: then a stripe reads as
// zeroes where all its legs do, whatever its layout. The caller holds
// mode.
func (l *Layer) healthy() bool {
	for i, st := range l.state {
		if st != legOK || l.failing[i].Load() {
			return false
		}
	}
	return l.lost.Load() == 0 && len(l.suspect) == 0 && l.unsettled.Load() == nil
}

// zeroRun returns how many whole stripes from s on (up to most) read
// as zeroes on every leg, asking each leg once, and their flags (a hole
// only where every leg has one); 0 when some leg holds data at stripe s.
// It lets Extents describe a sparse volume in a few calls per run of
// stripes rather than a few per chunk (64 chunks a call: 786,432 calls of
// four leg questions each for 3 TiB, which a copy-on-write layer above
// walks at every open). The caller holds mode and checked healthy.
func (l *Layer) zeroRun(s, most int64) (block.Extent, int64) {
	flags := block.Extent{Hole: true, Zero: true}
	lim := most * l.chunk
	for _, c := range l.children {
		ex, err := c.Extents(s*l.chunk, lim)
		if err != nil || len(ex) == 0 || ex[0].Length <= 0 || !ex[0].Zero {
			return block.Extent{}, 0
		}
		lim = min(lim, ex[0].Length)
		flags.Hole = flags.Hole && ex[0].Hole
	}
	return flags, lim / l.chunk
}

func (l *Layer) chunkExtent(s int64, d int, a, b int64) block.Extent {
	data := block.Extent{Length: b - a}
	leg := l.dataLeg(s, d)
	m, cnt := l.missingFor(s)
	if cnt > 1 || l.isLost(s, leg) || leg == m && (l.suspect[s] || l.isUnsettled(s)) {
		return data
	}
	first := func(i int, length int64) (block.Extent, bool) {
		ex, err := l.children[i].Extents(s*l.chunk+a, length)
		if err != nil || len(ex) == 0 || ex[0].Length <= 0 {
			return block.Extent{}, false
		}
		e := ex[0]
		e.Length = min(e.Length, length)
		return e, true
	}
	var e block.Extent
	if leg != m {
		var ok bool
		if e, ok = first(leg, b-a); !ok {
			return data
		}
	} else {
		e = block.Extent{Length: b - a, Hole: true, Zero: true}
	}
	for i := range l.n {
		if i == leg || i == m || !e.Hole && leg != m {
			continue
		}
		o, ok := first(i, e.Length)
		if !ok {
			return data
		}
		if leg == m && !o.Zero {
			return data
		}
		if o.Hole || leg == m {
			e.Length = o.Length
		}
		e.Hole = e.Hole && o.Hole
	}
	return e
}
