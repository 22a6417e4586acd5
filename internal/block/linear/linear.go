// Package linear is the `linear` layer: its children concatenated, the
// first child's bytes first. With one child and an offset/length it is a
// partition of that child.
//
// Params: {"offset": N, "length": N} — optional, only with one child: the
// window of the child to expose (default: all of it).
//
// Every operation is split at child boundaries and sent to the children
// it covers; Flush goes to every child.
package linear

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"

	"github.com/basalt-storage/basalt/internal/block"
)

func init() {
	block.Register(block.Type{
		Name: "linear", Doc: "concatenation of its children, or a window (partition) of one child",
		Params:      Params{},
		MinChildren: 1, MaxChildren: -1, New: New, ChildSize: childSize,
	})
}

// childSize: every child is created with the stack's size. It refuses
// the parameters New would refuse whatever the child's size: it runs
// before the children are created, and a failure after that would leave
// their files behind. (Whether a window fits is left to New: a child may
// hold more than it was created with, as a stripe rounds up.)
func childSize(raw json.RawMessage, size int64, n int) (int64, error) {
	if _, err := parse(raw, n); err != nil {
		return 0, err
	}
	return size, nil
}

// parse decodes the parameters and checks them against the number of
// children and for a window that fits no child.
func parse(raw json.RawMessage, n int) (Params, error) {
	var p Params
	if err := block.DecodeParams(raw, &p); err != nil {
		return p, err
	}
	if p.window() && n != 1 {
		return p, errors.New("offset and length need exactly one child")
	}
	if p.window() && (p.Offset < 0 || p.Length <= 0) {
		return p, fmt.Errorf("window %d+%d: offset must be at least 0 and length positive", p.Offset, p.Length)
	}
	return p, nil
}

// window reports whether the parameters give a window (a partition).
func (p Params) window() bool { return p.Offset != 0 || p.Length != 0 }

// fits checks that the window lies in a child of cs bytes.
func (p Params) fits(cs int64) error {
	if p.Offset < 0 || p.Length <= 0 || p.Offset > cs || p.Length > cs-p.Offset {
		return fmt.Errorf("window %d+%d does not fit the child's %d bytes", p.Offset, p.Length, cs)
	}
	return nil
}

// Params are the linear layer's parameters.
type Params struct {
	Offset int64 `json:"offset,omitempty"`
	Length int64 `json:"length,omitempty"`
}

// Layer is a linear layer.
type Layer struct {
	children []block.Layer
	starts   []int64 // logical start of each child's range
	base     []int64 // offset inside each child where its range begins
	size     int64
	caps     block.Capabilities
	params   json.RawMessage
	closed   atomic.Bool
}

// New builds a linear layer.
func New(_ block.Env, raw json.RawMessage, children []block.Layer) (block.Layer, error) {
	p, err := parse(raw, len(children))
	if err != nil {
		return nil, err
	}
	l := &Layer{children: children, caps: block.Combine(children), params: raw}
	if p.window() {
		if err := p.fits(children[0].Size()); err != nil {
			return nil, err
		}
		l.starts, l.base, l.size = []int64{0}, []int64{p.Offset}, p.Length
		return l, nil
	}
	for i, c := range children {
		// Refused rather than summed into a wrapped size.
		if cs := c.Size(); cs < 0 || cs > block.MaxSize-l.size {
			return nil, fmt.Errorf("linear child %d: %d bytes after %d exceed the largest device size, %d bytes",
				i, cs, l.size, int64(block.MaxSize))
		}
		l.starts = append(l.starts, l.size)
		l.base = append(l.base, 0)
		l.size += c.Size()
	}
	return l, nil
}

// check refuses a request reaching beyond the end: split cuts a request
// at the end, so its tail would otherwise be dropped and the request
// acknowledged whole (a partition's child goes on beyond its window).
func (l *Layer) check(off, n int64) error {
	if err := block.CheckRange(off, n, l.size); err != nil {
		return fmt.Errorf("linear: %w", err)
	}
	return nil
}

// writable refuses a change when the layer declares itself read-only (a
// child is): the children that are not would otherwise take their part of
// it, and a device that says it is read-only would change.
func (l *Layer) writable() error {
	if l.caps.ReadOnly {
		return fmt.Errorf("linear: %w", block.ErrReadOnly)
	}
	return nil
}

// childErr says which child failed.
func childErr(i int, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("linear child %d: %w", i, err)
}

// piece is the part of a request that falls on one child.
type piece struct {
	child    int
	off, len int64 // in the child
	at       int64 // offset within the request
}

// split maps [off, off+n), which check accepted, to per-child pieces;
// empty children get none.
func (l *Layer) split(off, n int64) []piece {
	i := sort.Search(len(l.starts), func(i int) bool { return l.starts[i] > off }) - 1
	var out []piece
	at := int64(0)
	for n > 0 && i < len(l.children) {
		end := l.size
		if i+1 < len(l.starts) {
			end = l.starts[i+1]
		}
		m := min(n, end-off)
		if m > 0 {
			out = append(out, piece{child: i, off: l.base[i] + off - l.starts[i], len: m, at: at})
		}
		off, n, at, i = off+m, n-m, at+m, i+1
	}
	return out
}

// Size implements block.Device.
func (l *Layer) Size() int64 { return l.size }

// Capabilities implements block.Device.
func (l *Layer) Capabilities() block.Capabilities { return l.caps }

// ReadAt implements block.Device.
func (l *Layer) ReadAt(p []byte, off int64) error {
	if err := l.check(off, int64(len(p))); err != nil {
		return err
	}
	for _, pc := range l.split(off, int64(len(p))) {
		if err := l.children[pc.child].ReadAt(p[pc.at:pc.at+pc.len], pc.off); err != nil {
			return childErr(pc.child, err)
		}
	}
	return nil
}

// TryReadAt implements block.NoWaitReader: each piece's child at once or
// not at all.
func (l *Layer) TryReadAt(p []byte, off int64) bool {
	if l.check(off, int64(len(p))) != nil {
		return false
	}
	for _, pc := range l.split(off, int64(len(p))) {
		if !block.TryReadAt(l.children[pc.child], p[pc.at:pc.at+pc.len], pc.off) {
			return false
		}
	}
	return true
}

// SpliceTo implements block.Splicer: piece by piece, each from its child,
// stopping at the first piece the child does not move whole.
func (l *Layer) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	return l.splicePieces(off, n, func(c block.Layer, coff int64, m int) int {
		return block.SpliceTo(c, pipe, coff, m, nowait)
	})
}

// SpliceFrom implements block.SpliceWriter: piece by piece, each into its
// child, stopping at the first piece the child does not take whole.
func (l *Layer) SpliceFrom(pipe int, off int64, n int) int {
	if l.writable() != nil {
		return 0 // the caller's WriteAt reports it
	}
	return l.splicePieces(off, n, func(c block.Layer, coff int64, m int) int {
		return block.SpliceFrom(c, pipe, coff, m)
	})
}

// splicePieces runs move on each child's piece of [off, off+n), in order,
// until one moves less than its whole piece, and returns the bytes moved.
func (l *Layer) splicePieces(off int64, n int, move func(c block.Layer, coff int64, m int) int) int {
	if l.check(off, int64(n)) != nil {
		return 0
	}
	moved := 0
	for _, pc := range l.split(off, int64(n)) {
		k := move(l.children[pc.child], pc.off, int(pc.len))
		moved += k
		if int64(k) < pc.len {
			break
		}
	}
	return moved
}

// WriteAt implements block.Device.
func (l *Layer) WriteAt(p []byte, off int64, fua bool) error {
	if err := l.writable(); err != nil {
		return err
	}
	if err := l.check(off, int64(len(p))); err != nil {
		return err
	}
	for _, pc := range l.split(off, int64(len(p))) {
		if err := l.children[pc.child].WriteAt(p[pc.at:pc.at+pc.len], pc.off, fua); err != nil {
			return childErr(pc.child, err)
		}
	}
	return nil
}

// WriteZeroes implements block.Device. With ZeroFlags.Fast it fails with
// block.ErrNotSupported before zeroing anything unless every child the
// range covers has FastZero.
func (l *Layer) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if !l.caps.WriteZeroes {
		return block.ErrNotSupported
	}
	if err := l.writable(); err != nil {
		return err
	}
	if err := l.check(off, n); err != nil {
		return err
	}
	pcs := l.split(off, n)
	if f.Fast {
		// Fail at once, before any child has zeroed its part, if one
		// would refuse a fast zero.
		for _, pc := range pcs {
			if !l.children[pc.child].Capabilities().FastZero {
				return block.ErrNotSupported
			}
		}
	}
	for _, pc := range pcs {
		if err := l.children[pc.child].WriteZeroes(pc.off, pc.len, f); err != nil {
			return childErr(pc.child, err)
		}
	}
	return nil
}

// Trim implements block.Device.
func (l *Layer) Trim(off, n int64, fua bool) error {
	if !l.caps.Trim {
		return block.ErrNotSupported
	}
	if err := l.writable(); err != nil {
		return err
	}
	if err := l.check(off, n); err != nil {
		return err
	}
	for _, pc := range l.split(off, n) {
		if err := l.children[pc.child].Trim(pc.off, pc.len, fua); err != nil {
			return childErr(pc.child, err)
		}
	}
	return nil
}

// Flush implements block.Device: every child.
func (l *Layer) Flush() error {
	if !l.caps.Flush {
		return block.ErrNotSupported
	}
	var first error
	for i, c := range l.children {
		if err := c.Flush(); err != nil && first == nil {
			first = childErr(i, err)
		}
	}
	return first
}

// Extents implements block.Device, child by child. Each child's extents
// are cut to its piece, as stripe and checksum cut theirs: one that
// reached past it would shift every extent after it.
func (l *Layer) Extents(off, n int64) ([]block.Extent, error) {
	if err := l.check(off, n); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil // nothing to describe (block.Device)
	}
	if !l.caps.Extents {
		return []block.Extent{{Length: n}}, nil
	}
	var out []block.Extent
	for _, pc := range l.split(off, n) {
		ex, err := l.children[pc.child].Extents(pc.off, pc.len)
		if err != nil {
			return nil, childErr(pc.child, err)
		}
		covered := int64(0)
		for _, e := range ex {
			e.Length = min(e.Length, pc.len-covered)
			if e.Length <= 0 {
				break
			}
			out = block.AppendExtent(out, e)
			covered += e.Length
		}
		if covered < pc.len {
			break // the child answered short; the caller asks again
		}
	}
	return out, nil
}

// Close implements block.Device: it closes every child, once however often
// it is called (a child's Close need not be idempotent).
func (l *Layer) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	return block.CloseAll(l.children)
}

// Describe implements block.Layer.
func (l *Layer) Describe() block.Node {
	return block.Node{Type: "linear", Params: l.params, State: block.Worst(block.Describe(l.children)), Children: block.Describe(l.children)}
}

// Children implements block.Parent. Linear does not implement Resizer: a
// concatenation or a partition has a fixed layout.
func (l *Layer) Children() []block.Layer { return l.children }
