package nbd

import (
	"sync/atomic"
	"time"
)

const (
	// writeNowMax: writes up to this size without FUA are run by the
	// reader itself (writeNow).
	writeNowMax = 128 << 10
	// writeNowSlow: a write still running after this is not just a copy
	// into the page cache (dirty-page throttling, a file system writing
	// through to the network); the watchdog then hands the reader's role
	// on, and writes run in goroutines of their own for writeNowBypass.
	writeNowSlow   = time.Millisecond
	writeNowBypass = 100 * time.Millisecond
)

// watchdog guards the reader while it runs a write itself: if the write
// takes longer than writeNowSlow, the watchdog starts a new reader, so
// requests behind a slow write are not held up for longer than that.
// Exactly one goroutine holds the reader's role: the reader and the
// watchdog settle it by one compare-and-swap on state.
type watchdog struct {
	timer       *time.Timer
	state       atomic.Int32 // watchIdle, watchArmed or watchFired
	bypassUntil atomic.Int64 // on since()'s clock
}

const (
	watchIdle  = iota
	watchArmed // the reader is inside a write
	watchFired // the write was slow; a new reader has the role
)

var epoch = time.Now()

// since is a monotonic clock.
func since() int64 { return int64(time.Since(epoch)) }

// newWatchdog returns a disarmed watchdog that calls handOver, to start
// a new reader, when a write is slow.
func newWatchdog(handOver func()) *watchdog {
	w := &watchdog{}
	w.timer = time.AfterFunc(time.Hour, func() {
		if w.state.CompareAndSwap(watchArmed, watchFired) {
			w.bypassUntil.Store(since() + int64(writeNowBypass))
			handOver()
		}
	})
	w.timer.Stop()
	return w
}

// start arms the watchdog for one write.
func (w *watchdog) start() {
	w.state.Store(watchArmed)
	w.timer.Reset(writeNowSlow)
}

// stop disarms the watchdog after the write; false means it fired and
// the caller no longer holds the reader's role.
func (w *watchdog) stop() bool {
	w.timer.Stop()
	return w.state.CompareAndSwap(watchArmed, watchIdle)
}

// writeNow reports whether the reader should run a write itself.
// Why: a file system takes the file's lock for a buffered write (ext4
// and XFS hold i_rwsem exclusively), so concurrent small writes to one
// file queue in the kernel anyway, and the waiting costs CPU — spinning
// on the lock, waking, switching. Run by the reader, one after another,
// a 4 KiB write costs about a third less CPU (34–38 → 23–24 µs), no
// goroutine is started, and replies go out in batches (bench/RESULTS.md,
// 2026-11-25).
func (c *conn) writeNow(req request) bool {
	return req.length <= writeNowMax && req.flags&cflagFUA == 0 && since() >= c.watch.bypassUntil.Load()
}

// runWrite runs a write in the reader goroutine, its reply queued to be
// flushed before the reader next waits. It reports whether the caller
// still holds the reader's role: false if the write was slow and the
// watchdog has started a new reader.
func (c *conn) runWrite(req request, payload []byte, cost int64) bool {
	defer putBuf(payload)
	c.watch.start()
	r := c.write(req, payload, cost)
	if !c.watch.stop() {
		c.send(r)
		return false
	}
	c.answer(r, false)
	c.pending = true
	return true
}
