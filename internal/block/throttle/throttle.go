// Package throttle is the `throttle` layer: quality of service for the one
// child below it, by token buckets on operations and on bytes.
//
// Params: {"iops": N, "bps": BYTES} — either may be 0 (unlimited). Reads,
// writes, write-zeroes and trims each take one operation token; reads and
// writes also take their length in byte tokens. Flush and extents are
// not throttled (they carry no data and a guest waiting on a flush must
// not be starved). Bursts: one second of operations; a tenth of a second of
// bytes, but at least 1 MiB.
package throttle

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"golang.org/x/time/rate"
)

func init() {
	block.Register(block.Type{
		Name: "throttle", Doc: "IOPS and bandwidth limits (QoS)",
		Params:      Params{},
		MinChildren: 1, MaxChildren: 1, New: New,
	})
}

// Params are the throttle layer's parameters.
type Params struct {
	IOPS int64 `json:"iops,omitempty"`
	BPS  int64 `json:"bps,omitempty"`
}

// Layer is a throttle layer.
type Layer struct {
	child block.Layer
	ops   *rate.Limiter // nil: unlimited
	bytes *rate.Limiter
	burst int
	// mu orders the reservations of both limiters by time (reserve).
	mu sync.Mutex
	// credit is byte tokens paid for by splices that moved less than
	// they paid for: the caller reads or writes the rest with ReadAt or
	// WriteAt, which pay for it again, so the next reads and writes
	// spend the credit before they wait (at most a burst is kept).
	credit atomic.Int64
	// ctx ends at Close: requests waiting for tokens then end with
	// block.ErrClosed instead of waiting out their turn (with low
	// limits, for hours) only to be refused by the closed child.
	ctx    context.Context
	cancel context.CancelFunc
	closed atomic.Bool // the child is closed (Close closes it once)
	params json.RawMessage
}

// New builds a throttle layer.
func New(_ block.Env, raw json.RawMessage, children []block.Layer) (block.Layer, error) {
	var p Params
	if err := block.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.IOPS < 0 || p.BPS < 0 {
		return nil, fmt.Errorf("iops and bps must not be negative")
	}
	l := &Layer{child: children[0], params: raw}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	if p.IOPS > 0 {
		l.ops = rate.NewLimiter(rate.Limit(p.IOPS), int(p.IOPS))
	}
	if p.BPS > 0 {
		l.burst = int(max(p.BPS/10, 1<<20))
		l.bytes = rate.NewLimiter(rate.Limit(p.BPS), l.burst)
	}
	return l, nil
}

// wait takes one operation token and n byte tokens (from the credit
// first).
func (l *Layer) wait(n int64) error {
	if l.ops != nil {
		if err := l.take(l.ops, 1); err != nil {
			return err
		}
	}
	if l.bytes != nil {
		n = l.spend(n)
	}
	for l.bytes != nil && n > 0 {
		m := min(n, int64(l.burst))
		if err := l.take(l.bytes, int(m)); err != nil {
			return err
		}
		n -= m
	}
	return nil
}

// take waits for n tokens of lim, at most its burst. Close ends the wait
// with block.ErrClosed.
func (l *Layer) take(lim *rate.Limiter, n int) error {
	if l.ctx.Err() != nil {
		return block.ErrClosed
	}
	d := l.reserve(lim, n)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-l.ctx.Done():
		return block.ErrClosed
	}
}

// reserve takes n tokens of lim, at most its burst, and returns how long
// the caller must wait before using them. A rate.Limiter trusts the time
// it is given: a time before that of its last reservation winds its clock
// back, and it counts the refill in between a second time. Its own Wait
// reads the clock before taking its lock, so requests contending for the
// lock (a few goroutines trying reads without waiting were enough) gave
// it such times, and raised the rate several times over. Here the clock
// is read, and the tokens taken, under one lock.
func (l *Layer) reserve(lim *rate.Limiter, n int) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	return lim.ReserveN(now, n).DelayFrom(now)
}

// spend takes up to n bytes from the credit and returns what is left to
// pay.
func (l *Layer) spend(n int64) int64 {
	for {
		c := l.credit.Load()
		if c <= 0 || n <= 0 {
			return n
		}
		m := min(c, n)
		if l.credit.CompareAndSwap(c, c-m) {
			return n - m
		}
	}
}

// refund credits m bytes a splice paid for but did not move.
func (l *Layer) refund(m int64) {
	for l.bytes != nil && m > 0 {
		c := l.credit.Load()
		if l.credit.CompareAndSwap(c, min(c+m, int64(l.burst))) {
			return
		}
	}
}

// Size implements block.Device.
func (l *Layer) Size() int64 { return l.child.Size() }

// Capabilities implements block.Device: the child's, unchanged.
func (l *Layer) Capabilities() block.Capabilities { return l.child.Capabilities() }

// ReadAt implements block.Device.
func (l *Layer) ReadAt(p []byte, off int64) error {
	if err := l.inRange(off, int64(len(p))); err != nil {
		return err
	}
	if err := l.wait(int64(len(p))); err != nil {
		return err
	}
	return l.child.ReadAt(p, off)
}

// TryReadAt implements block.NoWaitReader: when the limits allow the read
// now and the child answers it at once. It takes the tokens only once the
// child has answered; a read the child cannot answer at once costs nothing
// (ReadAt pays for it).
func (l *Layer) TryReadAt(p []byte, off int64) bool {
	if l.inRange(off, int64(len(p))) != nil || !l.allowsNow(len(p)) || !block.TryReadAt(l.child, p, off) {
		return false
	}
	l.charge(len(p))
	return true
}

// allowsNow reports whether the limits allow one operation of n bytes now,
// without taking anything: tokens reserved first, to be given back when
// the child cannot answer, came back only as of the reservation's own time
// — which under concurrent requests wound the limiter's clock back (the
// rate rose), or, when a later reservation had counted on them, not at all
// (readers then waited out tokens nobody used, for minutes).
func (l *Layer) allowsNow(n int) bool {
	now := time.Now()
	return (l.ops == nil || l.ops.TokensAt(now) >= 1) &&
		(l.bytes == nil || n == 0 || n <= l.burst && l.bytes.TokensAt(now) >= float64(n))
}

// charge takes one operation and n bytes, at most a burst, for a request
// served without waiting. Another may have taken the tokens allowsNow saw
// meanwhile: then the limiter goes into debt, which the requests after it
// pay, so the rates still hold.
func (l *Layer) charge(n int) {
	if l.ops != nil {
		l.reserve(l.ops, 1)
	}
	if l.bytes != nil && n > 0 {
		l.reserve(l.bytes, n)
	}
}

// SpliceTo implements block.Splicer: the child's, once the limits allow
// the read — at once with nowait, else after waiting as ReadAt does. A
// read the child moves only in part is charged twice for its operation:
// here, and by the ReadAt of the rest; its bytes once: with nowait only
// those moved are charged, else those the child did not move are credited
// (the child may be a Splicer that moves nothing, as a stripe of small
// units is).
func (l *Layer) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	if _, ok := l.child.(block.Splicer); !ok || n <= 0 || l.inRange(off, int64(n)) != nil {
		return 0
	}
	if !nowait {
		if l.wait(int64(n)) != nil {
			return 0
		}
		k := block.SpliceTo(l.child, pipe, off, n, false)
		l.refund(int64(n - k))
		return k
	}
	if !l.allowsNow(n) {
		return 0
	}
	k := block.SpliceTo(l.child, pipe, off, n, true)
	if k > 0 {
		l.charge(k) // the caller's ReadAt pays for the rest
	}
	return k
}

// SpliceFrom implements block.SpliceWriter: the child's, after waiting
// for the limits as WriteAt does. Like a read spliced in part, a write
// the child takes in part pays for its operation twice, and the bytes it
// did not take are credited.
func (l *Layer) SpliceFrom(pipe int, off int64, n int) int {
	if _, ok := l.child.(block.SpliceWriter); !ok || n <= 0 || l.inRange(off, int64(n)) != nil || l.wait(int64(n)) != nil {
		return 0
	}
	k := block.SpliceFrom(l.child, pipe, off, n)
	l.refund(int64(n - k))
	return k
}

// WriteAt implements block.Device.
func (l *Layer) WriteAt(p []byte, off int64, fua bool) error {
	if err := l.inRange(off, int64(len(p))); err != nil {
		return err
	}
	if err := l.wait(int64(len(p))); err != nil {
		return err
	}
	return l.child.WriteAt(p, off, fua)
}

// WriteZeroes implements block.Device.
func (l *Layer) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if err := l.inRange(off, n); err != nil {
		return err
	}
	if err := l.wait(0); err != nil {
		return err
	}
	return l.child.WriteZeroes(off, n, f)
}

// Trim implements block.Device.
func (l *Layer) Trim(off, n int64, fua bool) error {
	if err := l.inRange(off, n); err != nil {
		return err
	}
	if err := l.wait(0); err != nil {
		return err
	}
	return l.child.Trim(off, n, fua)
}

// Flush implements block.Device (not throttled).
func (l *Layer) Flush() error { return l.child.Flush() }

// Extents implements block.Device (not throttled).
func (l *Layer) Extents(off, n int64) ([]block.Extent, error) {
	if err := l.inRange(off, n); err != nil {
		return nil, err
	}
	return l.child.Extents(off, n)
}

// inRange refuses a request that does not lie inside the device
// (block.Device) before it waits for tokens: the child would refuse it
// too, but only after the caller had waited its turn for nothing.
func (l *Layer) inRange(off, n int64) error {
	if err := block.CheckRange(off, n, l.Size()); err != nil {
		return fmt.Errorf("throttle: %w", err)
	}
	return nil
}

// Close implements block.Device; requests still waiting for tokens end
// with block.ErrClosed. It closes the child once however often it is
// called (a child's Close need not be idempotent).
func (l *Layer) Close() error {
	l.cancel()
	if l.closed.Swap(true) {
		return nil
	}
	return l.child.Close()
}

// Describe implements block.Layer.
func (l *Layer) Describe() block.Node {
	kid := l.child.Describe()
	return block.Node{Type: "throttle", Params: l.params, State: kid.State, Children: []block.Node{kid}}
}

// Children implements block.Parent.
func (l *Layer) Children() []block.Layer { return []block.Layer{l.child} }

// Resize implements block.Resizer by growing the child.
func (l *Layer) Resize(n int64) error {
	r, ok := l.child.(block.Resizer)
	if !ok {
		return fmt.Errorf("throttle child (%s) cannot grow", l.child.Describe().Type)
	}
	return r.Resize(n)
}
