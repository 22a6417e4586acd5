package checksum

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/basalt-storage/basalt/internal/block"
)

// repairStatus is what repairBlock found.
type repairStatus int

const (
	// healthy: every readable copy verified and agreed with the table.
	healthy repairStatus = iota
	// repaired: a good version was found and every bad copy rewritten.
	repaired
	// unrepaired: a good version was found but a bad copy could not be
	// rewritten (read-only, or the write failed).
	unrepaired
)

func (l *Layer) numCopies() int {
	if l.copies != nil {
		return l.copies.NumCopies()
	}
	return 1
}

// readCopy reads from copy k; a child without copies is copy 0.
func (l *Layer) readCopy(k int, p []byte, off int64) error {
	if l.copies != nil {
		return l.copies.ReadCopy(k, p, off)
	}
	return l.child.ReadAt(p, off)
}

func (l *Layer) writeCopy(k int, p []byte, off int64) error {
	if l.copies != nil {
		return l.copies.WriteCopy(k, p, off)
	}
	return l.child.WriteAt(p, off, false)
}

// repairBlock looks for a good version of block b (of group g): the data
// of some copy matching a candidate entry — the cached entry (what this
// layer last wrote) first, then each copy's table entry. It returns that
// entry and data, after rewriting every copy whose data or entry differs
// and the cache. No good version: an error wrapping ErrCorrupt, and with
// note the block is recorded and logged as bad (reconcile, which then
// accepts the data, passes false). The caller holds the group lock
// exclusively (or is New).
//
// Rewrites need no in-flux marking: they store again what the other
// copies (or the cache) hold, so a crash that tears one leaves the copy
// as bad as before, not differently bad.
func (l *Layer) repairBlock(g, b int64, note bool) (entry uint32, data []byte, status repairStatus, err error) {
	off := b * BlockSize
	i := b % TableEntries
	type view struct {
		ok         bool
		table      []byte
		data       []byte
		entry, sum uint32 // the copy's table entry; the entry of its data
	}
	views := make([]view, l.numCopies())
	readable := 0
	var readErr error
	for k := range views {
		tb := make([]byte, BlockSize)
		d := make([]byte, l.blockLen(b))
		err := l.readCopy(k, tb, tableOff(g))
		if err == nil {
			err = l.readCopy(k, d, dataOff(off))
		}
		if err != nil {
			readErr = errors.Join(readErr, fmt.Errorf("copy %d: %w", k, err))
			continue
		}
		views[k] = view{ok: true, table: tb, data: d, entry: binary.BigEndian.Uint32(tb[4*i:]), sum: entryOf(d)}
		readable++
	}
	if readable == 0 {
		return 0, nil, 0, fmt.Errorf("checksum: read block at %d: %w", off, readErr)
	}
	cached := l.cachedTable(g)
	// A pinned table (read-only open after a crash) or a dirty one (I5)
	// replaces the child's, which is known to be out of date: then the
	// copies' entries are no candidates (an old entry would serve a block
	// whose latest write the child lost as its previous contents), and
	// only the data is compared.
	trustTables := l.pinned[g] == nil && l.dirty.get(g) == nil
	var cands []uint32
	if cached != nil {
		cands = append(cands, cached[i])
	}
	for _, v := range views {
		if v.ok && (trustTables || cached == nil) && !slices.Contains(cands, v.entry) {
			cands = append(cands, v.entry)
		}
	}
	good := -1
search:
	for _, c := range cands {
		for k, v := range views {
			if v.ok && v.sum == c {
				good, entry = k, c
				break search
			}
		}
	}
	if good < 0 {
		if note {
			l.noteBad(b)
			l.log.Error("corrupt block: no copy matches its checksum", "offset", off, "copies", len(views), "readable", readable)
		}
		return 0, nil, 0, fmt.Errorf("checksum: block at %d: %w", off, ErrCorrupt)
	}
	data = views[good].data
	needCache := cached != nil && cached[i] != entry
	var fixes int
	for _, v := range views {
		if v.ok && (v.sum != entry || trustTables && v.entry != entry) {
			fixes++
		}
	}
	if fixes == 0 && !needCache {
		return entry, data, healthy, nil
	}
	if l.readOnly {
		l.noteBad(b)
		return entry, data, unrepaired, nil
	}
	ok := true
	for k, v := range views {
		if !v.ok {
			continue
		}
		if v.sum != entry {
			if err := l.writeCopy(k, data, dataOff(off)); err != nil {
				ok = false
				l.log.Error("repair: rewrite data failed", "offset", off, "copy", k, "err", err)
			}
		}
		if v.entry != entry {
			binary.BigEndian.PutUint32(v.table[4*i:], entry)
			if err := l.writeCopy(k, v.table, tableOff(g)); err != nil {
				ok = false
				l.log.Error("repair: rewrite table failed", "offset", off, "copy", k, "err", err)
			}
		}
	}
	if needCache {
		nt := *cached
		nt[i] = entry
		l.keepTable(g, &nt)
	}
	if !ok {
		l.noteBad(b)
		return entry, data, unrepaired, nil
	}
	l.repaired.Add(1)
	l.forgetBad(b, b+1)
	l.log.Warn("repaired corrupt block from a good copy", "offset", off, "good_copy", good, "bad_copies", fixes)
	return entry, data, repaired, nil
}

// Scrub implements block.Scrubber: every block of every copy is read and
// verified, and bad ones are repaired where a good version exists.
// Progress counts data bytes. It holds each group's lock shared while
// reading it, exclusively only to repair, and the layout lock per group,
// so I/O and Resize go on around it.
func (l *Layer) Scrub(ctx context.Context, progress block.Progress) (block.ScrubReport, error) {
	var rep block.ScrubReport
	bufs := make([][]byte, l.numCopies())
	for k := range bufs {
		bufs[k] = make([]byte, GroupData)
	}
	for g := int64(0); ; g++ {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("checksum: scrub: %w", err)
		}
		l.mu.RLock()
		if l.closed.Load() {
			l.mu.RUnlock()
			return rep, block.ErrClosed
		}
		if g >= int64(len(l.groups)) {
			l.mu.RUnlock()
			break
		}
		size := l.size
		err := l.scrubGroup(g, bufs, &rep)
		l.mu.RUnlock()
		if err != nil {
			return rep, err
		}
		if progress != nil {
			progress(rep.Checked, size)
		}
	}
	l.log.Info("scrub done", "checked_bytes", rep.Checked, "bad_blocks", rep.Bad, "repaired_blocks", rep.Repaired)
	return rep, nil
}

// scrubGroup verifies group g in every copy; the caller holds l.mu shared.
func (l *Layer) scrubGroup(g int64, bufs [][]byte, rep *block.ScrubReport) error {
	st := l.groups[g]
	// Scrub checks the tables in the child: write back the group's first
	// (I5), as a write of this epoch so the next Flush covers it.
	if l.dirty.get(g) != nil {
		l.gate.RLock()
		st.mu.Lock()
		st.epoch = l.epoch.Load()
		err := l.writeBack(g, st)
		st.mu.Unlock()
		l.gate.RUnlock()
		if err != nil {
			return fmt.Errorf("checksum: scrub: %w", err)
		}
	}
	if err := l.lockShared(g, st); err != nil {
		return err
	}
	gs := g * GroupData
	ge := min(gs+GroupData, l.size)
	nb := (ge - gs + BlockSize - 1) / BlockSize
	tabs := make([]*table, len(bufs))
	readable := 0
	var readErr error
	for k := range bufs {
		raw := make([]byte, BlockSize)
		err := l.readCopy(k, raw, tableOff(g))
		if err == nil {
			err = l.readCopy(k, bufs[k][:ge-gs], dataOff(gs))
		}
		if err != nil {
			readErr = errors.Join(readErr, fmt.Errorf("copy %d: %w", k, err))
			continue
		}
		tabs[k] = decodeTable(raw)
		readable++
	}
	cached := l.cachedTable(g)
	trustTables := l.pinned[g] == nil && l.dirty.get(g) == nil
	var suspects []int64
	for j := range nb {
		lo, hi := j*BlockSize, min(j*BlockSize+BlockSize, ge-gs)
		ref, have := uint32(0), false
		if cached != nil {
			ref, have = cached[j], true
		}
		for k, t := range tabs {
			if t == nil {
				continue
			}
			if !have {
				ref, have = t[j], true
			}
			if trustTables && t[j] != ref || entryOf(bufs[k][lo:hi]) != ref {
				suspects = append(suspects, g*TableEntries+j)
				break
			}
		}
	}
	st.mu.RUnlock()
	if readable == 0 {
		return fmt.Errorf("checksum: scrub group %d: %w", g, readErr)
	}
	rep.Checked += ge - gs

	st.mu.Lock()
	defer st.mu.Unlock()
	var unrep []int64
	for _, b := range suspects {
		_, _, status, err := l.repairBlock(g, b, true)
		switch {
		case errors.Is(err, ErrCorrupt):
			rep.Bad++
			unrep = append(unrep, b)
		case err != nil:
			return fmt.Errorf("checksum: scrub: %w", err)
		case status == repaired:
			rep.Bad++
			rep.Repaired++
		case status == unrepaired:
			rep.Bad++
			unrep = append(unrep, b)
		}
		// healthy: a write replaced the block since it was read.
	}
	// This group's blocks are now known: good, or in unrep.
	l.forgetBad(g*TableEntries, g*TableEntries+nb)
	for _, b := range unrep {
		l.noteBad(b)
	}
	return nil
}
