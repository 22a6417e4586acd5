package cow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/bitmap"
	"github.com/basalt-storage/basalt/internal/block/superblock"
)

// ErrChainChanged: a Collapse found the chain not as its caller saw it —
// the image is not (or no longer) the top's parent (a snapshot or a
// flatten came between): the caller decides again.
var ErrChainChanged = errors.New("the volume's chain changed (a snapshot or a flatten)")

// ErrFrozenOpen: the image a Collapse would make writable is still open
// read-write in the volume whose snapshot froze it (that volume was
// flattened off it, but its stack, here or on another node, is not closed
// yet): the caller tries again later.
var ErrFrozenOpen = errors.New("the volume whose snapshot froze the image still has it open read-write")

// Collapse tuning: passes over the chunks written meanwhile go on until at
// most collapseCommitBelow remain (or collapseMaxPasses were made); those
// are copied at the commit, with the volume's I/O held.
const (
	collapseBatch       = 1024
	collapseCommitBelow = 64
	collapseMaxPasses   = 8
)

// Collapse merges image id, the parent of the volume's top, with the top
// ("commit down"): the chunks the top holds are copied into the parent,
// which becomes the top, and the old top leaves the chain (Depth drops by
// one; Collect removes it once nothing names it). It frees what only a
// deleted snapshot's image held: the chunks the volume overwrote since.
// The copy goes that way because the top usually holds few chunks (the
// writes since the snapshot) and the parent many.
//
// The caller guarantees that the parent is referenced by nothing but this
// volume's top: no snapshot record names it, no other image has it as
// parent. Collapse refuses an id that is not the top's parent; called
// again for an id that is the top already (a collapse that completed) it
// does nothing.
//
// Writes go on meanwhile; chunks they change are copied again, in passes,
// the last with I/O held. Crash safety: until the commit, the parent's
// device is written only at chunks it does not hold, or holds while the
// top's persisted allocation bit overrides it, so every read returns what
// it did, after a crash too, and a rerun simply starts over. The commit,
// with I/O held: flush the top (its data and pending allocation bits),
// copy the chunks the last pass left, flush the parent's stack, set its
// allocation bits for every chunk the top holds, record the volume's size
// in its image.sb, then write cow.sb naming it as the top: the one atomic
// switch. Each write before the switch changes only what the top
// overrides. A failed cow.sb write breaks the layer, as a failed snapshot
// commit does, but the layer goes on with into (the old top may be in no
// chain on disk, and collected): writes fail until cow.sb is rewritten
// naming into (the next write or flush tries) or the volume is reopened.
//
// The parent keeps its tag and the image it froze, so a repeated Snapshot
// of the snapshot that created the parent still returns that snapshot's
// image (the parent's parent), as before. The tag of the snapshot that
// created the old top leaves with it: that snapshot was deleted (its image
// is the parent being collapsed), so nothing repeats it.
func (l *Layer) Collapse(ctx context.Context, id string, progress block.Progress) error {
	if l.env.ReadOnly {
		return block.ErrReadOnly
	}
	if err := l.brokenErr(); err != nil {
		return err
	}
	l.chainMu.RLock()
	top := l.top
	var into *image
	if top.meta.Parent == id && top.depth > 1 {
		into = l.byDepth[top.depth-1]
	}
	l.chainMu.RUnlock()
	if top.meta.ID == id {
		return nil
	}
	if into == nil || into.meta.ID != id {
		return fmt.Errorf("collapse %s: not the parent of the top image %s (whose parent is %q): %w", id, top.meta.ID, top.meta.Parent, ErrChainChanged)
	}
	d := &dirtySet{chunks: map[int64]struct{}{}}
	if !l.dirty.CompareAndSwap(nil, d) {
		return fmt.Errorf("collapse %s: another collapse is running", id)
	}
	defer l.dirty.Store(nil)
	c := &collapse{l: l, top: top, into: into, dirty: d}
	defer c.close()
	if err := c.open(); err != nil {
		return fmt.Errorf("collapse %s: %w", id, err)
	}
	if err := c.firstPass(ctx, progress); err != nil {
		return fmt.Errorf("collapse %s: %w", id, err)
	}
	for i := 0; i < collapseMaxPasses && d.len() > collapseCommitBelow; i++ {
		if err := c.dirtyPass(ctx); err != nil {
			return fmt.Errorf("collapse %s: %w", id, err)
		}
	}
	if err := c.commit(); err != nil {
		return fmt.Errorf("collapse %s: %w", id, err)
	}
	return nil
}

// dirtySet is the chunks the top took or changed while a collapse runs:
// the write path marks them (touched) after the change, still holding
// chainMu shared, so a chunk a pass takes out of the set is copied after
// the change, and the commit, holding chainMu exclusively, sees every
// change.
type dirtySet struct {
	mu     sync.Mutex
	chunks map[int64]struct{}
}

func (d *dirtySet) mark(from, to int64) {
	d.mu.Lock()
	for c := from; c <= to; c++ {
		d.chunks[c] = struct{}{}
	}
	d.mu.Unlock()
}

func (d *dirtySet) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.chunks)
}

// take empties the set and returns what it held, in order.
func (d *dirtySet) take() []int64 {
	d.mu.Lock()
	set := d.chunks
	d.chunks = map[int64]struct{}{}
	d.mu.Unlock()
	out := make([]int64, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// touched records, while a collapse runs, that the top's content of
// [off, off+n) may have changed. The caller holds chainMu shared.
func (l *Layer) touched(off, n int64) {
	if d := l.dirty.Load(); d != nil && n > 0 {
		d.mark(off/l.chunk, (off+n-1)/l.chunk)
	}
}

// collapse is one run of Collapse.
type collapse struct {
	l     *Layer
	top   *image // the top when the collapse began
	into  *image // its parent, which becomes the top
	dirty *dirtySet
	sb    *superblock.Block // into's image.sb, read-write
	alloc *bitmap.Bitmap    // into's allocation map as persisted, read-write
	buf   []byte
}

// open makes into writable: its stack is rebuilt read-write and swapped in
// for the read-only one (one instance of a stack at a time: a mirror or
// parity layer must see every write to its legs), and its superblock and
// allocation map are opened. A collapse that fails later leaves the stack
// read-write; nothing but a collapse writes it.
func (c *collapse) open() error {
	l, into := c.l, c.into
	dir := l.imageDir(into.meta.ID)
	l.chainMu.RLock()
	rw := !into.dev.Capabilities().ReadOnly
	kept := block.HasMaintainer(into.dev) // it keeps metadata of its own
	l.chainMu.RUnlock()
	if !rw {
		// The volume whose snapshot froze into may still have the
		// read-write instance it wrote as its top (it was flattened off
		// into since, so into has no other child). A second read-write
		// instance beside it would have its metadata overwritten — a
		// mirror's write-intent map when that volume closes — so, as
		// maintainers do (maintain.go), wait until that one is closed.
		// An image is frozen only as its volume's top, and into is no
		// volume's top, so no holder can appear after the probe.
		if kept {
			held, err := isFrozenOpen(dir)
			if err != nil {
				return fmt.Errorf("image %s: probe for a frozen read-write instance: %w", into.meta.ID, err)
			}
			if held {
				return fmt.Errorf("image %s: %w", into.meta.ID, ErrFrozenOpen)
			}
		}
		env := l.env
		env.Dir, env.Size, env.Create, env.Base, env.ReadOnly = dir, into.meta.Size, false, "", false
		dev, err := block.Build(env, into.meta.Spec)
		if err != nil {
			return fmt.Errorf("open image %s read-write: %w", into.meta.ID, err)
		}
		l.chainMu.Lock()
		if err := c.check(); err != nil {
			l.chainMu.Unlock()
			dev.Close()
			return err
		}
		old := into.dev
		into.dev, into.rw = dev, true
		l.chainMu.Unlock()
		if err := old.Close(); err != nil {
			c.log().Warn("closing an image's read-only stack", "image", into.meta.ID, "err", err)
		}
	}
	f, err := l.env.OpenMeta(filepath.Join(dir, imgFile))
	if err != nil {
		return fmt.Errorf("image %s: %w", into.meta.ID, err)
	}
	sb, payload, err := superblock.OpenFile(f)
	if err != nil {
		f.Close()
		return fmt.Errorf("image %s: %w", into.meta.ID, err)
	}
	c.sb = sb
	if _, err := decodeImageMeta(payload, into.meta.ID); err != nil {
		return err
	}
	if c.alloc, err = l.openMap(dir, into.meta); err != nil {
		return fmt.Errorf("image %s: %w", into.meta.ID, err)
	}
	c.buf = make([]byte, l.chunk)
	return nil
}

// close closes what a collapse that did not commit left open.
func (c *collapse) close() {
	if c.sb != nil {
		c.sb.Close()
	}
	if c.alloc != nil {
		c.alloc.Close()
	}
}

func (c *collapse) log() *slog.Logger { return c.l.logger() }

// check reports whether the chain is still the one the collapse began on;
// a snapshot (a new top) or a flatten (no parent) ends it. The caller
// holds chainMu.
func (c *collapse) check() error {
	l := c.l
	if l.top != c.top || c.top.meta.Parent != c.into.meta.ID || l.byDepth[c.top.depth-1] != c.into {
		return fmt.Errorf("%w meanwhile; run the collapse again", ErrChainChanged)
	}
	return nil
}

// classify sorts chunks for a pass, the caller holding chainMu shared:
// it returns those to copy now and marks dirty again those that must wait.
// A chunk the top holds is copied unless into holds it too and the top's
// allocation bit is not set yet (a write's bit waits for a flush): until
// the top's bit is persisted, into's copy is what a crash would read, so
// it must not change. A chunk no image holds reads from the top's device,
// so into's copy is read by nobody before the commit.
func (c *collapse) classify(ks []int64) []int64 {
	l := c.l
	t := c.top.depth
	var out []int64
	for _, k := range ks {
		if k >= l.owner.Len() {
			continue
		}
		switch o := l.owner.Load(k); {
		case o == 0:
			out = append(out, k)
		case o == t:
			if k < c.alloc.Len() && c.alloc.Get(k) && !c.top.alloc.Get(k) {
				c.dirty.mark(k, k)
				continue
			}
			out = append(out, k)
		}
	}
	return out
}

// firstPass copies every chunk the top holds, and every chunk no image
// holds where the top's or into's device has data (they read from the
// top's device, and will from into's).
func (c *collapse) firstPass(ctx context.Context, progress block.Progress) error {
	l := c.l
	for from := int64(0); ; from += collapseBatch {
		if err := ctx.Err(); err != nil {
			return err
		}
		l.chainMu.RLock()
		if err := c.check(); err != nil {
			l.chainMu.RUnlock()
			return err
		}
		total := l.owner.Len()
		if from >= total {
			l.chainMu.RUnlock()
			if progress != nil {
				progress(total, total)
			}
			return nil
		}
		to := min(from+collapseBatch, total)
		var ks []int64
		for k, o := range l.owner.held(from, to) {
			if o == c.top.depth {
				ks = append(ks, k)
			}
		}
		unheld, err := c.unheldData(from, to)
		if err == nil {
			ks = c.classify(append(ks, unheld...))
			// Bits set in the top's map so far are persisted when this
			// returns: classify's test holds for what it let through.
			err = c.top.alloc.Sync()
		}
		l.chainMu.RUnlock()
		if err != nil {
			return err
		}
		for _, k := range ks {
			if err := c.copyShared(k); err != nil {
				return err
			}
		}
		if progress != nil {
			progress(to, total)
		}
	}
}

// unheldData lists the chunks in [from, to) that no image holds and that
// the top's or into's device reports data in. The caller holds chainMu
// shared.
func (c *collapse) unheldData(from, to int64) ([]int64, error) {
	l := c.l
	var out []int64
	seen := map[int64]bool{}
	for k, end := range l.owner.unheld(from, to) {
		off, n := k*l.chunk, min(end*l.chunk, l.size)-k*l.chunk
		for _, dev := range []block.Device{c.top.dev, c.into.dev} {
			err := dataIn(dev, off, min(n, dev.Size()-off), func(at, m int64) {
				for j := at / l.chunk; j*l.chunk < at+m; j++ {
					if !seen[j] {
						seen[j] = true
						out = append(out, j)
					}
				}
			})
			if err != nil {
				return nil, err
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// dataIn calls fn for the parts of [off, off+n) that dev does not report
// as zero (all of it when dev cannot tell).
func dataIn(dev block.Device, off, n int64, fn func(off, n int64)) error {
	if n <= 0 {
		return nil
	}
	if !dev.Capabilities().Extents {
		fn(off, n)
		return nil
	}
	for end := off + n; off < end; {
		ex, err := dev.Extents(off, end-off)
		if err != nil {
			return fmt.Errorf("extents at %d: %w", off, err)
		}
		for _, e := range ex {
			m := min(e.Length, end-off)
			if !e.Zero {
				fn(off, m)
			}
			off += m
		}
	}
	return nil
}

// dirtyPass copies the chunks written since the previous pass.
func (c *collapse) dirtyPass(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l := c.l
	l.chainMu.RLock()
	err := c.check()
	var ks []int64
	if err == nil {
		ks = c.classify(c.dirty.take())
		err = c.top.alloc.Sync()
	}
	l.chainMu.RUnlock()
	if err != nil {
		return err
	}
	for _, k := range ks {
		if err := c.copyShared(k); err != nil {
			return err
		}
	}
	return nil
}

// copyShared is copyChunk under chainMu held shared, on the chain the
// collapse began on.
func (c *collapse) copyShared(k int64) error {
	c.l.chainMu.RLock()
	defer c.l.chainMu.RUnlock()
	if err := c.check(); err != nil {
		return err
	}
	return c.copyChunk(k)
}

// copyChunk copies chunk k as the top's device holds it into into's
// device (an all-zero chunk as a write of zeroes, which may leave a hole).
// The caller holds chainMu.
func (c *collapse) copyChunk(k int64) error {
	l := c.l
	start := k * l.chunk
	if start >= l.size {
		return nil
	}
	if err := c.fit(); err != nil {
		return err
	}
	buf := c.buf[:min(l.chunk, l.size-start)]
	if err := c.top.dev.ReadAt(buf, start); err != nil {
		return fmt.Errorf("read chunk %d of image %s: %w", k, c.top.meta.ID, err)
	}
	var err error
	if !slices.ContainsFunc(buf, func(b byte) bool { return b != 0 }) && c.into.dev.Capabilities().WriteZeroes {
		err = c.into.dev.WriteZeroes(start, int64(len(buf)), block.ZeroFlags{})
	} else {
		err = c.into.dev.WriteAt(buf, start, false)
	}
	if err != nil {
		return fmt.Errorf("write chunk %d into image %s: %w", k, c.into.meta.ID, err)
	}
	return nil
}

// fit grows into's stack to the volume's size if the volume was extended
// after into was frozen. The caller holds chainMu (Resize then waits).
func (c *collapse) fit() error {
	l := c.l
	if c.into.dev.Size() >= l.size {
		return nil
	}
	r, ok := c.into.dev.(block.Resizer)
	if !ok {
		return fmt.Errorf("image %s: its %s layer cannot grow to the volume's %d bytes", c.into.meta.ID, c.into.dev.Describe().Type, l.size)
	}
	if err := r.Resize(l.size); err != nil {
		return fmt.Errorf("image %s: grow to %d bytes: %w", c.into.meta.ID, l.size, err)
	}
	return nil
}

// commit copies what the last pass left, makes into the top and drops
// the old top, holding chainMu exclusively.
func (c *collapse) commit() error {
	l := c.l
	l.chainMu.Lock()
	defer l.chainMu.Unlock()
	if err := c.check(); err != nil {
		return err
	}
	// The top's data and pending allocation bits first: from here every
	// chunk it holds has its bit persisted, so it overrides into
	// wherever into changes below.
	if err := l.flush(); err != nil {
		return err
	}
	for _, k := range c.dirty.take() {
		if k >= l.owner.Len() {
			continue
		}
		if o := l.owner.Load(k); o == 0 || o == c.top.depth {
			if err := c.copyChunk(k); err != nil {
				return err
			}
		}
	}
	if err := c.fit(); err != nil {
		return err
	}
	if err := c.into.dev.Flush(); err != nil {
		return fmt.Errorf("flush image %s: %w", c.into.meta.ID, err)
	}
	n := chunks(l.size, l.chunk)
	if err := c.alloc.Grow(n); err != nil {
		return fmt.Errorf("image %s: allocation map: %w", c.into.meta.ID, err)
	}
	for k, o := range l.owner.held(0, l.owner.Len()) {
		if o == c.top.depth {
			c.alloc.Set(k)
		}
	}
	if err := c.alloc.Sync(); err != nil {
		return fmt.Errorf("image %s: allocation map: %w", c.into.meta.ID, err)
	}
	m := c.into.meta
	if m.Size != l.size {
		m.Size = l.size
		b, _ := json.Marshal(m)
		if err := c.sb.Write(b); err != nil {
			return fmt.Errorf("image %s: %w", m.ID, err)
		}
	}
	b, _ := json.Marshal(volMeta{Version: version, Top: m.ID})
	werr := l.vsb.Write(b)
	// Committed, or (werr) landed or not, unknown. Either way into holds
	// all the volume's data now and the layer goes on with it: cow.sb
	// naming into may have landed, and then the old top is in no chain,
	// so a collection may remove it at any moment — going back to it
	// would write into removed files and name them in cow.sb. Nothing
	// more is acknowledged until cow.sb names into again (brokenErr) or
	// a reopen reads which image is the top; either chain reads the same.
	old := c.top
	for k, o := range l.owner.held(0, l.owner.Len()) {
		if o == old.depth {
			l.owner.Store(k, c.into.depth)
		}
	}
	c.into.meta, c.into.sb, c.into.alloc = m, c.sb, c.alloc
	c.sb, c.alloc = nil, nil
	l.byDepth[old.depth] = nil
	l.byDepth = l.byDepth[:old.depth]
	l.top = c.into
	l.all = slices.DeleteFunc(l.all, func(im *image) bool { return im == old })
	var unfreeze error
	if old.frozen != nil { // frozen once, made the top again by an earlier collapse
		unfreeze = old.frozen.Close()
	}
	if err := errors.Join(old.dev.Close(), old.alloc.Close(), old.sb.Close(), unfreeze); err != nil {
		c.log().Warn("closing the collapsed image", "image", old.meta.ID, "err", err)
	}
	if werr != nil {
		err := fmt.Errorf("%s: %w", volFile, werr)
		l.breakCommit(err, m.ID)
		return err
	}
	return nil
}
