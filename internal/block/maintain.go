package block

import "context"

// Optional interfaces. A layer implements those that apply to it; the
// volume service finds them by walking the live stack (Walk) — extend,
// scrub and repair reach every layer that can take part, and a stack with
// a layer that cannot (say, a Resizer missing) refuses the operation as a
// whole instead of half-doing it.

// Parent is implemented by every layer with children. Children lists
// every layer below it that holds the layer's data — a layer that hid
// one would hide it from Walk, so from snapshot, extend, repair and scrub.
type Parent interface {
	Children() []Layer
}

// Maintained is implemented by a Parent some of whose children are opened
// read-only in normal use, because nothing may write their data (cow's
// base images: frozen, and shared by every snapshot and clone that needs
// them). Their redundancy still needs upkeep — a snapshot's mirror loses
// a leg like any other — so repair and scrub walk with WalkMaintain,
// which asks such a layer for writable children.
type Maintained interface {
	Parent
	// Maintain calls walk with each child in Children's order, until walk
	// returns false. A child normally opened read-only whose subtree has
	// a Repairer or Scrubber is opened read-write for its call only (and
	// the layer then serves and describes what the call left); the others
	// are passed as they are. It fails if a child cannot be reopened.
	Maintain(ctx context.Context, walk func(Layer) bool) error
}

// Resizer is implemented by layers that can grow. Resize(n) grows the
// layer to at least n bytes (never shrinks), growing its children first;
// on return the new size is durable and Size() >= n. A layer that
// allocates in units may round up (stripe: whole stripes); a layer above
// it keeps its own size, and the volume service presents a volume's
// recorded size whatever its stack's (stacks.go).
type Resizer interface {
	Resize(n int64) error
}

// Progress is told how far a long operation got: done of total units
// (bytes unless documented otherwise).
type Progress func(done, total int64)

// ScrubReport is what a scrub found.
type ScrubReport struct {
	Checked  int64 `json:"checked_bytes"`
	Bad      int64 `json:"bad_blocks"`      // blocks whose data did not match
	Repaired int64 `json:"repaired_blocks"` // of those, rewritten from a good copy
}

// Scrubber is implemented by layers that can verify their data (checksum:
// every block against its checksum, repairing from a redundant child).
type Scrubber interface {
	Scrub(ctx context.Context, p Progress) (ScrubReport, error)
}

// Repairer is implemented by redundant layers (mirror, parity). Repair
// reopens children that failed — creating a replacement for one whose
// backing file is gone — and resynchronises them, returning when the layer
// is ok again. Progress is also visible through Describe while it runs. A
// resync interrupted by a crash resumes when the layer is next opened.
type Repairer interface {
	Repair(ctx context.Context, p Progress) error
}

// ResyncCounter is implemented by Repairers that count what they copy onto
// legs being brought back (by Repair, or by a resync the layer resumed on
// its own when opened). TakeResynced returns the bytes of the device's
// address space resynchronised since its previous call (or since the layer
// was opened) and starts counting anew; a repair job reports the sum as
// RepairReport.ResyncedBytes.
type ResyncCounter interface {
	TakeResynced() int64
}

// RepairReport is what a repair job did.
type RepairReport struct {
	ResyncedBytes int64 `json:"resynced_bytes"`
}

// Copies is implemented by redundant layers whose data can be read from
// each copy separately, so a layer above that can tell good data from bad
// (checksum) can pick a good copy and repair the others.
type Copies interface {
	// NumCopies is the number of independent copies of each byte.
	NumCopies() int
	// ReadCopy reads [off, off+len(p)) as copy i alone provides it.
	ReadCopy(i int, p []byte, off int64) error
	// WriteCopy writes p to copy i only (a repair).
	WriteCopy(i int, p []byte, off int64) error
}

// Keys wraps and unwraps data keys with a key the cluster holds, so no
// plaintext key is ever stored next to the data it protects.
type Keys interface {
	Wrap(key []byte) ([]byte, error)
	Unwrap(wrapped []byte) ([]byte, error)
}

// Walk calls fn for l and every layer below it, parents first, until fn
// returns false. The layers are those serving I/O: some may be read-only
// (see Maintained and WalkMaintain).
func Walk(l Layer, fn func(Layer) bool) bool {
	if !fn(l) {
		return false
	}
	if p, ok := l.(Parent); ok {
		for _, c := range p.Children() {
			if !Walk(c, fn) {
				return false
			}
		}
	}
	return true
}

// WalkMaintain is Walk for repair and scrub: below a Maintained layer it
// visits the children Maintain hands out (read-write for the call) rather
// than Children. It stops when fn returns false, and returns the first
// error of a Maintain.
func WalkMaintain(ctx context.Context, l Layer, fn func(Layer) bool) error {
	_, err := walkMaintain(ctx, l, fn)
	return err
}

func walkMaintain(ctx context.Context, l Layer, fn func(Layer) bool) (bool, error) {
	if !fn(l) {
		return false, nil
	}
	more, werr := true, error(nil)
	visit := func(c Layer) bool {
		more, werr = walkMaintain(ctx, c, fn)
		return more && werr == nil
	}
	switch p := l.(type) {
	case Maintained:
		if err := p.Maintain(ctx, visit); err != nil && werr == nil {
			werr = err
		}
	case Parent:
		for _, c := range p.Children() {
			if !visit(c) {
				break
			}
		}
	}
	return more && werr == nil, werr
}

// HasMaintainer reports whether l or a layer below it is a Repairer or a
// Scrubber: whether a maintenance walk has anything to do there.
func HasMaintainer(l Layer) bool {
	return !Walk(l, func(x Layer) bool {
		_, r := x.(Repairer)
		_, s := x.(Scrubber)
		return !r && !s
	})
}
