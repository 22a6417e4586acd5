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
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"golang.org/x/time/rate"
)

func init() {
	block.Register(block.Type{
		Name: "throttle", Doc: "IOPS and bandwidth limits (QoS)",
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
		if err := l.ops.Wait(l.ctx); err != nil {
			return l.waitErr(err)
		}
	}
	if l.bytes != nil {
		n = l.spend(n)
	}
	for l.bytes != nil && n > 0 {
		m := min(n, int64(l.burst))
		if err := l.bytes.WaitN(l.ctx, int(m)); err != nil {
			return l.waitErr(err)
		}
		n -= m
	}
	return nil
}

// waitErr is the error of a wait for tokens: ErrClosed once Close ended it.
func (l *Layer) waitErr(err error) error {
	if l.ctx.Err() != nil {
		return block.ErrClosed
	}
	return err
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
	if err := l.wait(int64(len(p))); err != nil {
		return err
	}
	return l.child.ReadAt(p, off)
}

// TryReadAt implements block.NoWaitReader: when the limits allow the read
// now and the child answers it at once. Tokens taken for a read the child
// cannot answer at once are given back (ReadAt takes them again).
func (l *Layer) TryReadAt(p []byte, off int64) bool {
	h, ok := l.takeNow(len(p))
	ok = ok && block.TryReadAt(l.child, p, off)
	if !ok {
		h.cancel()
	}
	return ok
}

// takeNow reserves one operation and n bytes for now; ok only if the
// limits allow them without waiting. What it reserved is returned either
// way, to be cancelled if unused.
func (l *Layer) takeNow(n int) (h held, ok bool) {
	h.at = time.Now()
	take := func(lim *rate.Limiter, n int) bool {
		r := lim.ReserveN(h.at, n)
		if !r.OK() {
			return false
		}
		h.rs = append(h.rs, r)
		return r.DelayFrom(h.at) == 0
	}
	ok = (l.ops == nil || take(l.ops, 1)) &&
		(l.bytes == nil || n == 0 || n <= l.burst && take(l.bytes, n))
	return h, ok
}

// held is what takeNow reserved, and when.
type held struct {
	at time.Time
	rs []*rate.Reservation
}

// cancel gives the tokens back. It cancels as of the reservations' own
// time: a limiter gives back nothing for a reservation whose time to act
// has passed.
func (h held) cancel() {
	for _, r := range h.rs {
		r.CancelAt(h.at)
	}
}

// SpliceTo implements block.Splicer: the child's, once the limits allow
// the read — at once with nowait, else after waiting as ReadAt does. A
// read the child moves only in part is charged twice for its operation:
// here, and by the ReadAt of the rest; the bytes it did not move are
// credited (the child may be a Splicer that moves nothing, as a stripe of
// small units is).
func (l *Layer) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	if _, ok := l.child.(block.Splicer); !ok || n <= 0 {
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
	h, ok := l.takeNow(n)
	k := 0
	if ok {
		k = block.SpliceTo(l.child, pipe, off, n, true)
	}
	if k == 0 {
		h.cancel() // the caller's ReadAt takes them again
	} else {
		l.refund(int64(n - k))
	}
	return k
}

// SpliceFrom implements block.SpliceWriter: the child's, after waiting
// for the limits as WriteAt does. Like a read spliced in part, a write
// the child takes in part pays for its operation twice, and the bytes it
// did not take are credited.
func (l *Layer) SpliceFrom(pipe int, off int64, n int) int {
	if _, ok := l.child.(block.SpliceWriter); !ok || n <= 0 || l.wait(int64(n)) != nil {
		return 0
	}
	k := block.SpliceFrom(l.child, pipe, off, n)
	l.refund(int64(n - k))
	return k
}

// WriteAt implements block.Device.
func (l *Layer) WriteAt(p []byte, off int64, fua bool) error {
	if err := l.wait(int64(len(p))); err != nil {
		return err
	}
	return l.child.WriteAt(p, off, fua)
}

// WriteZeroes implements block.Device.
func (l *Layer) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if err := l.wait(0); err != nil {
		return err
	}
	return l.child.WriteZeroes(off, n, f)
}

// Trim implements block.Device.
func (l *Layer) Trim(off, n int64, fua bool) error {
	if err := l.wait(0); err != nil {
		return err
	}
	return l.child.Trim(off, n, fua)
}

// Flush implements block.Device (not throttled).
func (l *Layer) Flush() error { return l.child.Flush() }

// Extents implements block.Device (not throttled).
func (l *Layer) Extents(off, n int64) ([]block.Extent, error) { return l.child.Extents(off, n) }

// Close implements block.Device; requests still waiting for tokens end
// with block.ErrClosed.
func (l *Layer) Close() error {
	l.cancel()
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
