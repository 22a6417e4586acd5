package checksum

import (
	"errors"
	"fmt"

	"github.com/basalt-storage/basalt/internal/block"
)

// ReadAt implements block.Device: every block is verified; on an error p
// is cleared, so no unverified byte is ever handed out.
func (l *Layer) ReadAt(p []byte, off int64) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	err := l.check(off, int64(len(p)))
	if err == nil {
		err = forGroups(off, int64(len(p)), func(g, off, n, at int64) error {
			return l.readGroup(g, off, p[at:at+n])
		})
	}
	if err != nil {
		clear(p)
	}
	return err
}

// TryReadAt implements block.NoWaitReader: whole blocks whose tables are
// in memory, read from the child at once and verified. A partial block, a
// table to load, a lock held is left to ReadAt. A block that does not
// verify is repaired at once (rare, and it writes): see tryReadGroup.
func (l *Layer) TryReadAt(p []byte, off int64) bool {
	if len(p) == 0 || !l.mu.TryRLock() {
		return false
	}
	defer l.mu.RUnlock()
	if l.check(off, int64(len(p))) != nil {
		return false
	}
	return forGroups(off, int64(len(p)), func(g, off, n, at int64) error {
		if !l.tryReadGroup(g, off, p[at:at+n]) {
			return errNotNow
		}
		return nil
	}) == nil
}

// errNotNow stops TryReadAt's walk over the groups.
var errNotNow = errors.New("not at once")

func (l *Layer) tryReadGroup(g, off int64, p []byte) bool {
	s := l.spanOf(off, int64(len(p)))
	if s.start != off || s.stop != off+int64(len(p)) {
		return false
	}
	st := l.groups[g]
	if !st.mu.TryRLock() {
		return false
	}
	t := l.cachedTable(g)
	if st.stale || t == nil || !block.TryReadAt(l.child, p, dataOff(off)) {
		st.mu.RUnlock()
		return false
	}
	bad := verify(t, s, p)
	st.mu.RUnlock()
	// A block that does not verify is repaired now, as ReadAt would: left
	// to ReadAt, its read could be served by a good copy (a mirror takes
	// turns between legs) and the bad one would stay as it is.
	return len(bad) == 0 || l.repairBad(g, off, p, bad) == nil
}

// readGroup reads [off, off+len(p)) of group g.
func (l *Layer) readGroup(g, off int64, p []byte) error {
	st := l.groups[g]
	if err := l.lockShared(g, st); err != nil {
		return err
	}
	bad, err := l.readVerify(g, off, p)
	st.mu.RUnlock()
	if err != nil || len(bad) == 0 {
		return err
	}
	if err := l.repairBad(g, off, p, bad); err != nil {
		l.corruptReads.Add(1)
		return err
	}
	return nil
}

// repairBad repairs the blocks of group g that failed to verify in a read
// of [off, off+len(p)) and copies what verifies now into p. Repair
// rewrites data or tables: it needs the group to itself. A write may have
// replaced a block meanwhile; repairBlock reads it afresh, so it serves
// whatever verifies now.
func (l *Layer) repairBad(g, off int64, p []byte, bad []int64) error {
	st := l.groups[g]
	st.mu.Lock()
	defer st.mu.Unlock()
	end := off + int64(len(p))
	for _, b := range bad {
		_, data, _, err := l.repairBlock(g, b, true)
		if err != nil {
			return err
		}
		lo, hi := max(b*BlockSize, off), min(b*BlockSize+int64(len(data)), end)
		copy(p[lo-off:hi-off], data[lo-b*BlockSize:])
	}
	return nil
}

// readVerify reads [off, off+len(p)) of group g and verifies it; the
// caller holds the group lock. Blocks that fail are returned (their bytes
// in p are cleared) for repairBlock to deal with.
func (l *Layer) readVerify(g, off int64, p []byte) (bad []int64, err error) {
	s := l.spanOf(off, int64(len(p)))
	t, err := l.loadTable(g)
	if err != nil {
		return nil, err
	}
	direct := s.start == off && s.stop == off+int64(len(p))
	buf := p
	if !direct {
		buf = make([]byte, s.stop-s.start)
	}
	if err := l.child.ReadAt(buf, dataOff(s.start)); err != nil {
		return nil, fmt.Errorf("checksum: read %d+%d: %w", s.start, len(buf), err)
	}
	bad = verify(t, s, buf)
	if !direct {
		copy(p, buf[off-s.start:])
	}
	return bad, nil
}

// verify checks buf, the bytes of span s, against table t: it returns the
// blocks that do not match and clears their bytes in buf.
func verify(t *table, s span, buf []byte) (bad []int64) {
	for b := s.b0; b < s.b1; b++ {
		lo := (b - s.b0) * BlockSize
		hi := min(lo+BlockSize, int64(len(buf)))
		if entryOf(buf[lo:hi]) != t[b%TableEntries] {
			bad = append(bad, b)
			clear(buf[lo:hi])
		}
	}
	return bad
}

// readBlock reads block b of group g, verified (repairing it if it can);
// the caller holds the group lock exclusively. dst is BlockSize or the
// short last block's length.
func (l *Layer) readBlock(g, b int64, dst []byte) error {
	t, err := l.loadTable(g)
	if err != nil {
		return err
	}
	if err := l.child.ReadAt(dst, dataOff(b*BlockSize)); err != nil {
		return fmt.Errorf("checksum: read block at %d: %w", b*BlockSize, err)
	}
	if entryOf(dst) == t[b%TableEntries] {
		return nil
	}
	_, data, _, err := l.repairBlock(g, b, true)
	if err != nil {
		clear(dst)
		return err
	}
	copy(dst, data)
	return nil
}

// writeOp is the common frame of the operations that write: layout lock,
// read-only and range checks, flush gate.
func (l *Layer) writeOp(off, n int64, fn func(g, off, n, at int64) error) error {
	if l.readOnly {
		return block.ErrReadOnly
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if err := l.check(off, n); err != nil {
		return err
	}
	l.gate.RLock()
	defer l.gate.RUnlock()
	return forGroups(off, n, fn)
}

// WriteAt implements block.Device.
func (l *Layer) WriteAt(p []byte, off int64, fua bool) error {
	return l.writeOp(off, int64(len(p)), func(g, off, n, at int64) error {
		return l.writeGroup(g, off, p[at:at+n], fua)
	})
}

// writeGroup writes p at off inside group g: data, then table.
func (l *Layer) writeGroup(g, off int64, p []byte, fua bool) error {
	end := off + int64(len(p))
	s := l.spanOf(off, int64(len(p)))
	aligned := s.start == off && s.stop == end
	// Whole blocks: their entries are computed before the group is locked,
	// so writers to one group overlap their CRCs with each other's I/O.
	var entries []uint32
	if aligned {
		entries = make([]uint32, s.b1-s.b0)
		for b := s.b0; b < s.b1; b++ {
			lo := (b - s.b0) * BlockSize
			entries[b-s.b0] = entryOf(p[lo:min(lo+BlockSize, int64(len(p)))])
		}
	}
	st := l.groups[g]
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := l.reconcileStale(g, st); err != nil {
		return err
	}
	buf := p
	if !aligned {
		// Read-modify-write of the edge blocks, verified first so that a
		// corrupt block is not laundered into one with a valid checksum.
		buf = make([]byte, s.stop-s.start)
		if off != s.start {
			if err := l.readBlock(g, s.b0, buf[:min(BlockSize, len(buf))]); err != nil {
				return err
			}
		}
		if last := s.b1 - 1; end != s.stop && (last != s.b0 || off == s.start) {
			if err := l.readBlock(g, last, buf[(last-s.b0)*BlockSize:]); err != nil {
				return err
			}
		}
		copy(buf[off-s.start:], p)
	}
	if !aligned {
		entries = make([]uint32, s.b1-s.b0)
		for b := s.b0; b < s.b1; b++ {
			lo := (b - s.b0) * BlockSize
			entries[b-s.b0] = entryOf(buf[lo:min(lo+BlockSize, int64(len(buf)))])
		}
	}
	// Load the table only now: repairing an edge block may have fixed it.
	t, err := l.loadTable(g)
	if err != nil {
		return err
	}
	if err := l.markInFlux(g, st); err != nil {
		return err
	}
	if err := l.childWrite(buf, dataOff(s.start), fua); err != nil {
		l.markStale(st, s.b0, s.b1)
		return fmt.Errorf("checksum: write %d+%d: %w", s.start, len(buf), err)
	}
	if err := l.setEntries(g, t, s.b0, entries, fua); err != nil {
		l.markStale(st, s.b0, s.b1)
		return err
	}
	l.forgetBad(s.b0, s.b1)
	return nil
}

// WriteZeroes implements block.Device.
func (l *Layer) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if f.Fast && !l.caps.FastZero {
		return block.ErrNotSupported
	}
	return l.writeOp(off, n, func(g, off, n, _ int64) error {
		return l.zeroGroup(g, off, n, f, false)
	})
}

// Trim implements block.Device. Trim is advisory: whole blocks are
// zeroed through the child's WriteZeroes (holes allowed, so the child may
// deallocate them) with their entries set to 0; partial blocks, and
// everything when the child cannot zero, are left as they are.
func (l *Layer) Trim(off, n int64, fua bool) error {
	return l.writeOp(off, n, func(g, off, n, _ int64) error {
		if !l.cc.WriteZeroes {
			return nil
		}
		return l.zeroGroup(g, off, n, block.ZeroFlags{FUA: fua}, true)
	})
}

// zeroGroup zeroes [off, off+n) inside group g: whole blocks in the
// child, entries to 0; partial blocks by read-modify-write unless trim.
func (l *Layer) zeroGroup(g, off, n int64, f block.ZeroFlags, trim bool) error {
	end := off + n
	s := l.spanOf(off, n)
	// Whole blocks [w0, w1); the short last block is whole when the range
	// reaches the end of the device.
	w0 := (off + BlockSize - 1) / BlockSize
	w1 := end / BlockSize
	if end == l.size {
		w1 = s.b1
	}
	if trim && w0 >= w1 {
		return nil
	}
	st := l.groups[g]
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := l.reconcileStale(g, st); err != nil {
		return err
	}
	// Edge blocks first: reading them verified may repair the table.
	type edge struct {
		b    int64
		data []byte
	}
	var edges []edge
	if !trim {
		for b := s.b0; b < s.b1; b++ {
			if b >= w0 && b < w1 {
				b = w1 - 1 // skip the whole blocks
				continue
			}
			data := make([]byte, l.blockLen(b))
			if err := l.readBlock(g, b, data); err != nil {
				return err
			}
			lo, hi := max(off, b*BlockSize)-b*BlockSize, min(end, b*BlockSize+int64(len(data)))-b*BlockSize
			clear(data[lo:hi])
			edges = append(edges, edge{b, data})
		}
	}
	t, err := l.loadTable(g)
	if err != nil {
		return err
	}
	nt := *t
	if err := l.markInFlux(g, st); err != nil {
		return err
	}
	// The blocks a failure from here on may leave changed (markStale).
	t0, t1 := s.b0, s.b1
	if trim {
		t0, t1 = w0, w1
	}
	if w0 < w1 {
		zs, ze := w0*BlockSize, min(w1*BlockSize, l.size)
		var err error
		if l.cc.WriteZeroes {
			zf := f
			if f.FUA && !l.cc.FUA {
				// The child has no FUA (it would refuse the flag): the
				// table's write below, with FUA, flushes it (childWrite),
				// which makes these zeroes durable too.
				zf.FUA = false
			}
			err = l.child.WriteZeroes(dataOff(zs), ze-zs, zf)
			if errors.Is(err, block.ErrNotSupported) && f.Fast {
				return err // nothing was done
			}
		} else {
			err = l.writeZeroBuffers(dataOff(zs), ze-zs, f.FUA)
		}
		if err != nil {
			l.markStale(st, t0, t1)
			return fmt.Errorf("checksum: zero %d+%d: %w", zs, ze-zs, err)
		}
		for b := w0; b < w1; b++ {
			nt[b%TableEntries] = 0
		}
	}
	for _, e := range edges {
		if err := l.childWrite(e.data, dataOff(e.b*BlockSize), f.FUA); err != nil {
			l.markStale(st, t0, t1)
			return fmt.Errorf("checksum: write block at %d: %w", e.b*BlockSize, err)
		}
		nt[e.b%TableEntries] = entryOf(e.data)
	}
	if err := l.storeTable(g, &nt, f.FUA); err != nil {
		l.markStale(st, t0, t1)
		return err
	}
	if trim {
		l.forgetBad(w0, w1)
	} else {
		l.forgetBad(s.b0, s.b1)
	}
	return nil
}

// writeZeroBuffers writes zeroes to the child (one that cannot zero).
func (l *Layer) writeZeroBuffers(off, n int64, fua bool) error {
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		m := min(n, int64(len(buf)))
		if err := l.childWrite(buf[:m], off, fua); err != nil {
			return err
		}
		off, n = off+m, n-m
	}
	return nil
}

// Flush implements block.Device: reconcile the groups failed writes left
// stale, write the dirty tables back (I5), flush the child, then take out
// of flux every group whose writes all started before (I2).
func (l *Layer) Flush() error {
	if l.closed.Load() {
		return block.ErrClosed
	}
	if !l.caps.Flush {
		return block.ErrNotSupported
	}
	if l.readOnly {
		return nil
	}
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	l.gate.Lock()
	e := l.epoch.Add(1) // writes from now on are of epoch e
	l.gate.Unlock()
	// Every table dirtied in an older epoch is written here, before the
	// child flush; tables of epoch e written along with them are of
	// groups whose bits stay.
	l.mu.RLock()
	err := l.settleStale()
	if err == nil {
		err = l.writeBackAll()
	}
	l.mu.RUnlock()
	if err != nil {
		return fmt.Errorf("checksum: flush: %w", err)
	}
	if err := l.child.Flush(); err != nil {
		return fmt.Errorf("checksum: flush: %w", err)
	}
	l.mu.RLock()
	changed := false
	for g := l.bm.NextSet(0); g >= 0 && g < int64(len(l.groups)); g = l.bm.NextSet(g + 1) {
		st := l.groups[g]
		st.mu.Lock()
		if st.epoch < e && !st.stale {
			l.bm.Clear(g)
			st.marked = false
			changed = true
		}
		st.mu.Unlock()
	}
	l.mu.RUnlock()
	if !changed {
		return nil
	}
	if err := l.bm.Sync(); err != nil {
		// The data is durable; only the bits could not be cleared, which
		// at worst costs a reconcile on the next open.
		return fmt.Errorf("checksum: flush: clear in-flux map: %w", err)
	}
	return nil
}

// Extents implements block.Device: the child's extents of the data
// blocks, group by group (up to 64 groups; the caller asks again).
func (l *Layer) Extents(off, n int64) ([]block.Extent, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if err := l.check(off, n); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil // nothing to describe (block.Device)
	}
	if !l.cc.Extents {
		return []block.Extent{{Length: n}}, nil
	}
	var out []block.Extent
	for i := 0; n > 0 && i < 64; i++ {
		g := off / GroupData
		m := min(n, (g+1)*GroupData-off)
		ex, got, err := l.groupExtents(g, off, m)
		if err != nil {
			return nil, fmt.Errorf("checksum: extents: %w", err)
		}
		for _, e := range ex {
			out = block.AppendExtent(out, e)
		}
		if got < m {
			break
		}
		off, n = off+m, n-m
	}
	if len(out) == 0 {
		return []block.Extent{{Length: n}}, nil
	}
	return out, nil
}

// groupExtents is the child's description of [off, off+n) inside group
// g, got bytes of it, except that a block the child calls zero or
// unallocated but whose entry says it holds other than zeroes is data:
// its data was lost below (a file punched or truncated behind our back, a
// file system that lost blocks), and reading it fails verification — a
// client that skips reading what block status calls zero (qemu-img
// convert, nbdcopy) would take zeroes for it instead of an error. Under
// the group lock shared, so a write's data and entry are seen together.
func (l *Layer) groupExtents(g, off, n int64) (out []block.Extent, got int64, err error) {
	st := l.groups[g]
	if err := l.lockShared(g, st); err != nil {
		return nil, 0, err
	}
	defer st.mu.RUnlock()
	ex, err := l.child.Extents(dataOff(off), n)
	if err != nil {
		return nil, 0, err
	}
	var t *table
	pos := off
	for _, e := range ex {
		e.Length = min(e.Length, off+n-pos)
		if e.Length <= 0 {
			break
		}
		if !e.Zero && !e.Hole {
			out = block.AppendExtent(out, e)
			pos += e.Length
			continue
		}
		if t == nil {
			if t, err = l.loadTable(g); err != nil {
				return nil, 0, err
			}
		}
		for end := pos + e.Length; pos < end; {
			b := pos / BlockSize
			stop := min(end, (b+1)*BlockSize)
			piece := e
			piece.Length = stop - pos
			if t[b-g*TableEntries] != 0 {
				piece.Hole, piece.Zero = false, false
			}
			out = block.AppendExtent(out, piece)
			pos = stop
		}
	}
	return out, pos - off, nil
}

// Resize implements block.Resizer. The groups whose layout changes (a
// partial last group and the new ones) are put in flux first; the child
// grows, the grown range is zeroed (so new blocks verify as zeroes,
// whatever the child grew with, and a short last block's tail stays zero
// as its checksum assumes), the child is flushed, the bits cleared.
func (l *Layer) Resize(n int64) error {
	if l.readOnly {
		return block.ErrReadOnly
	}
	r, ok := l.child.(block.Resizer)
	if !ok {
		return fmt.Errorf("checksum: child (%s) cannot grow", l.child.Describe().Type)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed.Load() {
		return block.ErrClosed
	}
	old := l.size
	if n < old {
		return fmt.Errorf("checksum: cannot shrink from %d to %d bytes", old, n)
	}
	if n == old {
		return nil
	}
	// What follows reads and rewrites tables in the child; no I/O runs
	// (l.mu is held exclusively), so the tables can be written back now.
	// Their bits are cleared by the next Flush, which covers the write.
	if err := l.writeBackAll(); err != nil {
		return fmt.Errorf("checksum: resize: %w", err)
	}
	oldGroups, newGroups := int64(len(l.groups)), groupsFor(n)
	first := oldGroups
	if old%GroupData != 0 {
		first--
	}
	if first < oldGroups && l.groups[first].stale {
		// A failed write left the old last group stale; settle it now,
		// as the bookkeeping below ends with it not stale.
		st := l.groups[first]
		if _, _, err := l.reconcile(first, true, st.staleFrom, st.staleTo); err != nil {
			return fmt.Errorf("checksum: resize: reconcile group %d: %w", first, err)
		}
		st.stale, st.staleFrom, st.staleTo = false, 0, 0
	}
	if err := l.bm.Grow(newGroups); err != nil {
		return fmt.Errorf("checksum: resize: %w", err)
	}
	for g := first; g < newGroups; g++ {
		l.bm.Set(g)
	}
	if err := l.bm.Sync(); err != nil {
		return fmt.Errorf("checksum: resize: mark in flux: %w", err)
	}
	oldCS := l.child.Size()
	if want := ChildSize(n); oldCS < want {
		if err := r.Resize(want); err != nil {
			return fmt.Errorf("checksum: resize child: %w", err)
		}
	}
	cs := l.child.Size()
	size := DataSize(cs)
	if size < n {
		return fmt.Errorf("checksum: child grew to %d bytes, %d needed", cs, ChildSize(n))
	}
	if extra := groupsFor(size); extra > newGroups {
		// The child grew more than asked (it rounds up): its extra
		// groups are new too.
		if err := l.bm.Grow(extra); err != nil {
			return fmt.Errorf("checksum: resize: %w", err)
		}
		for g := newGroups; g < extra; g++ {
			l.bm.Set(g)
		}
		if err := l.bm.Sync(); err != nil {
			return fmt.Errorf("checksum: resize: mark in flux: %w", err)
		}
	}
	// The child bytes not in use before: from the old end, and the tables
	// of new groups in the old last extent's table area (never written,
	// but zero them rather than trust that).
	var zero [][2]int64 // child ranges [from, to)
	if oldCS < cs {
		zero = append(zero, [2]int64{oldCS, cs})
	}
	if ng := groupsFor(size); oldGroups < ng {
		last := min(ng, oldGroups/ExtentGroups*ExtentGroups+ExtentGroups) - 1
		if from, to := tableOff(oldGroups), min(tableOff(last)+BlockSize, oldCS); from < to {
			zero = append(zero, [2]int64{from, to})
		}
	}
	for g := oldGroups; g < groupsFor(size); g++ {
		l.groups = append(l.groups, &groupState{marked: true})
	}
	l.size = size
	// Until the new range is initialised and flushed, the groups it
	// touches are stale: if Resize fails from here on, they are
	// reconciled before use and keep their bits. Its blocks start with
	// the one holding the old end (its tail is new); the blocks before
	// are not changed, and a corrupt one stays so.
	grown := func(g int64) (int64, int64) { return max(g*TableEntries, old/BlockSize), (g + 1) * TableEntries }
	for g := first; g < int64(len(l.groups)); g++ {
		from, to := grown(g)
		l.markStale(l.groups[g], from, to)
	}
	if len(zero) > 0 {
		var err error
		if l.cc.WriteZeroes {
			for _, z := range zero {
				if err = l.child.WriteZeroes(z[0], z[1]-z[0], block.ZeroFlags{}); err != nil {
					break
				}
			}
		} else {
			// The child cannot zero: make the tables match whatever it
			// grew with instead.
			for g := first; g < int64(len(l.groups)) && err == nil; g++ {
				l.cache.drop(g)
				from, to := grown(g)
				_, _, err = l.reconcile(g, true, from, to)
			}
		}
		if err != nil {
			return fmt.Errorf("checksum: resize: initialise new range: %w", err)
		}
	}
	for g := first; g < int64(len(l.groups)); g++ {
		l.cache.drop(g)
	}
	for g := first; g < int64(len(l.groups)); g++ {
		st := l.groups[g]
		st.stale, st.staleFrom, st.staleTo = false, 0, 0
	}
	if !l.cc.Flush {
		return nil // the bits stay: nothing here is known to be durable
	}
	if err := l.child.Flush(); err != nil {
		return fmt.Errorf("checksum: resize: flush: %w", err)
	}
	// No I/O runs during Resize and the child is flushed: every write
	// into these groups is durable.
	for g := first; g < int64(len(l.groups)); g++ {
		l.bm.Clear(g)
		l.groups[g].marked = false
	}
	if err := l.bm.Sync(); err != nil {
		return fmt.Errorf("checksum: resize: clear in-flux map: %w", err)
	}
	return nil
}
