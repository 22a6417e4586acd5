// Package checksum is the `checksum` layer: end-to-end data integrity for
// the one child below it. Every 4 KiB block has a CRC-32C; every read is
// verified, so corruption anywhere below (media, a bug in a lower layer, a
// file edited behind our back) becomes an error wrapping ErrCorrupt — the
// NBD server replies EIO — and never wrong data. When the child keeps
// several copies (it implements block.Copies, like a mirror), a block that
// fails verification is read from each copy, served from one that
// verifies, and rewritten over the others. Scrub verifies everything.
//
// Params: {"meta": "NAME"} — the in-flux bitmap's file, relative to the
// stack's directory (default "checksum.meta").
//
// # On-disk layout
//
// Checksums live in band, in the child, so that a snapshot or clone of the
// child (cow below checksum) carries them. A group is 1024 data blocks
// (4 MiB) and the table block covering them; 1024 groups make an extent,
// stored as all its tables, then all its data:
//
//	extent: tables of groups 0..1023 (4 MiB) | data of groups 0..1023 (4 GiB)
//	table:  1024 entries, u32 big-endian; entry i covers data block i
//	entry:  CRC-32C(block) XOR CRC-32C(4096 zero bytes)
//
// Data offset d lives at child offset (d div 4 GiB) × (4 MiB + 4 GiB) +
// 4 MiB + d mod 4 GiB — congruent to d modulo 4 MiB, so a request aligned
// to a stripe or block of the file system below stays aligned (tables in
// front of each group shifted every write by 4 KiB, off the stripes and
// off the page cache's large folios). The child is ChildSize(size) = size
// + 4 MiB per started extent (sparse); the layer's size is derived from
// the child's alone (DataSize), so a clone of the child needs nothing
// else. The last group
// may be partial; the device's last block may be shorter than 4 KiB and
// is checksummed as if zero-padded to 4 KiB.
//
// Why the XOR: CRC-32C of a fixed-length block is affine, and XORing the
// CRC of the zero block leaves its linear part, which is 0 for a block of
// zeroes. A never-written, zeroed or trimmed block (zeroes in a fresh
// sparse child, with a zero entry in a fresh table) therefore verifies
// with no special case: there is one entry value per block content and one
// rule to check it, nothing reserved, nothing to confuse with a real CRC
// of 0. A block whose data is lost together with its entry (both read as
// zeroes) is indistinguishable from a zeroed block — the one thing an
// in-band checksum cannot see.
//
// The meta file is a persistent bitmap (package bitmap), one bit per
// group: the in-flux map.
//
// # Invariants and crash safety
//
// A block's data and its table entry are separate writes, so a crash can
// leave one without the other. Hence:
//
//   - I1: before an operation's first data or table write into a group,
//     the group's in-flux bit is set and synced (skipped when the group is
//     already durably in flux since the last Flush). Operations that fail
//     before writing (a corrupt edge block) do not mark.
//   - I2: a bit is cleared only by Flush, after the child was flushed, and
//     only for groups none of whose writes started after that child flush
//     began: writers hold the flush gate shared for their whole run, and
//     Flush bumps an epoch under it exclusively, so every write of an
//     older epoch has completed before the child flush. Hence outside
//     in-flux groups every block verifies against its entry on stable
//     storage.
//   - I3: on open, every group in flux is reconciled: each block that
//     does not verify gets the entry of the data the child holds ("accept
//     what landed": only unflushed writes can be affected; with copies, a
//     copy that verifies is preferred and the others rewritten). Then the
//     child is flushed and the bits cleared (over a child that cannot
//     flush, they stay).
//   - I4: one RWMutex per group orders table updates: readers share it
//     (data and table read together are consistent), writers hold it
//     exclusively for read-modify-write, data, then table.
//   - I5: tables are written back, not through: a write without FUA
//     leaves its group's new table in memory (dirty), and Flush writes
//     every dirty table before it flushes the child. A dirty table is
//     the group's table (reads verify against it), is never evicted, and
//     its group is in flux (I1 marked it; I2 clears the bit only after
//     the write-back was flushed). A FUA write, a write finding too many
//     tables dirty, and every repair write their table through. So a 4
//     KiB write costs one child write, not two; a crash loses only what
//     I3 reconciles anyway. Whatever reads the child directly (a cow
//     snapshot below, scrub, resize) needs the tables written first: the
//     volume service flushes the whole stack before freezing cow, and
//     Scrub and Resize write back what they cover.
//
// The price of I3: corruption that strikes a block of a group while it is
// in flux, followed by a crash, is accepted rather than reported. Close
// flushes, so only a crash leaves anything in flux.
//
// A missing or empty meta file on open means nothing is in flux: that is
// what a clone of the child (which carries its tables but not our meta
// file) looks like, and a clone must be taken of a flushed child. If a
// volume's meta file is lost after a crash, blocks written since the last
// Flush may read as corrupt (detected, never wrong data).
//
// A data or table write that fails marks its group stale: it is
// reconciled (I3) before the group is used again or by the next Flush,
// whichever comes first, and its bit is kept. Unlike after a crash, the
// blocks the failed write may have changed are known: only their data is
// accepted, so a block of the group that was already corrupt stays so.
// Resize puts the groups whose layout changes (a partial last one, the
// new ones) in flux, grows the child, zeroes the grown range (so new
// blocks verify as zeroes whatever the child grew with), flushes, and
// clears them.
//
// Operations: unaligned writes read-modify-write their edge blocks,
// verifying the old block first (a corrupt block is not laundered into a
// valid one). WriteZeroes zeroes whole blocks in the child (or writes
// zeroes if the child cannot) and sets their entries to 0; edges are
// read-modify-written. Trim is advisory: whole blocks are zeroed through
// the child's WriteZeroes (which may deallocate them), so data and entry
// stay in step — a child trim could leave either; edges and children
// without WriteZeroes are left as they are. Extents are the child's,
// mapped to data offsets, but for blocks the child calls zero whose
// entries say they hold data: those are data (their reads fail
// verification), so that no client skips reading them and takes zeroes
// for lost data.
//
// Built by block.Build from a spec (the `verified` volume type puts it
// above cow); the volume service calls Scrub and Resize through
// block.Walk.
package checksum

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/bitmap"
)

func init() {
	block.Register(block.Type{
		Name: "checksum", Doc: "per-block CRC-32C in band, verified on every read; scrub and repair from copies",
		Params:      Params{},
		MinChildren: 1, MaxChildren: 1, New: New, ChildSize: childSize,
		Files: func(raw json.RawMessage) []string {
			p, err := decodeParams(raw)
			if err != nil {
				return nil // New refuses these params
			}
			return []string{p.Meta}
		},
	})
}

// ErrCorrupt is wrapped by every error that reports data not matching its
// checksum (in every copy, when there are several).
var ErrCorrupt = errors.New("checksum mismatch: data is corrupt")

// DefaultMeta is the meta file's name when params give none.
const DefaultMeta = "checksum.meta"

// cachedTables bounds the table cache per layer (4 KiB each: 1 MiB,
// covering 1 GiB of data; beyond it tables are read from the child, where
// a file child's page cache usually holds them).
const cachedTables = 256

// dirtyMax bounds the tables written back rather than through (I5), for
// the same memory: writes spread over more than 1 GiB of data between
// flushes write the tables beyond it through.
const dirtyMax = 256

// Params are the checksum layer's parameters.
type Params struct {
	Meta string `json:"meta,omitempty"`
}

func decodeParams(raw json.RawMessage) (Params, error) {
	p := Params{Meta: DefaultMeta}
	if err := block.DecodeParams(raw, &p); err != nil {
		return p, err
	}
	if p.Meta == "" {
		return p, errors.New("params.meta must not be empty")
	}
	return p, nil
}

func childSize(raw json.RawMessage, size int64, _ int) (int64, error) {
	if _, err := decodeParams(raw); err != nil {
		return 0, err
	}
	return ChildSize(size), nil
}

// groupState is the per-group state. mu is the group lock (I4); the other
// fields change only under mu held exclusively.
type groupState struct {
	mu sync.RWMutex
	// marked: the group's in-flux bit is durably set.
	marked bool
	// epoch is the flush epoch in which the last write into the group
	// started; Flush clears the bit only of groups with an older epoch.
	epoch uint64
	// stale: a data or table write failed part-way; reconcile first.
	stale bool
	// staleFrom, staleTo: the blocks [staleFrom, staleTo) the failed
	// writes may have changed (empty: none, only a table write failed).
	// Reconciling a stale group accepts the data of these blocks only: a
	// block outside them that does not verify was corrupt before, and
	// stays reported as such.
	staleFrom, staleTo int64
}

// Stats are counters since the layer was opened.
type Stats struct {
	// Repaired is the number of blocks rewritten from a good copy (or
	// whose table entry was restored from the cache).
	Repaired int64
	// CorruptReads is the number of reads that failed with ErrCorrupt.
	CorruptReads int64
	// Reconciled is the number of groups found in flux on open.
	Reconciled int64
}

// Layer is a checksum layer.
type Layer struct {
	child    block.Layer
	copies   block.Copies // nil: the child has one copy
	params   json.RawMessage
	readOnly bool
	cc       block.Capabilities // the child's
	caps     block.Capabilities
	log      *slog.Logger
	bm       *bitmap.Bitmap

	// mu guards the layout (size, groups): every operation holds it
	// shared, Resize exclusively.
	mu     sync.RWMutex
	size   int64
	groups []*groupState

	// gate: operations that write hold it shared for their whole run;
	// Flush holds it exclusively only to start a new epoch, so every
	// write of an older epoch has completed when the child flush starts.
	gate  sync.RWMutex
	epoch atomic.Uint64

	cache  *tableCache
	dirty  *dirtyTables     // tables not yet written to the child (I5)
	pinned map[int64]*table // read-only: reconciled tables of groups in flux

	// flushMu serialises Flush: a write-back one Flush started must be
	// durable before another clears the bits it covers.
	flushMu sync.Mutex
	// anyStale: some group may be stale (set with the group's flag;
	// cleared by the Flush that reconciles them all).
	anyStale atomic.Bool

	closed                             atomic.Bool
	repaired, corruptReads, reconciled atomic.Int64

	badMu sync.Mutex
	bad   map[int64]struct{} // blocks known to be corrupt and not repaired
}

// maxBad bounds the set of known bad blocks (beyond it, the layer stays
// degraded until a scrub finds fewer).
const maxBad = 1 << 16

// New builds a checksum layer over children[0].
func New(env block.Env, raw json.RawMessage, children []block.Layer) (block.Layer, error) {
	p, err := decodeParams(raw)
	if err != nil {
		return nil, err
	}
	child := children[0]
	cc := child.Capabilities()
	l := &Layer{
		child: child, params: raw, readOnly: env.ReadOnly || cc.ReadOnly, cc: cc,
		log: env.Log, cache: newTableCache(cachedTables), dirty: newDirtyTables(dirtyMax), pinned: map[int64]*table{}, bad: map[int64]struct{}{},
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.log = l.log.With("layer", "checksum")
	if c, ok := child.(block.Copies); ok && c.NumCopies() > 1 {
		l.copies = c
	}
	l.caps = block.Capabilities{
		ReadOnly:    l.readOnly,
		Flush:       cc.Flush,
		FUA:         cc.FUA || cc.Flush,
		Trim:        true,
		WriteZeroes: true,
		FastZero:    cc.WriteZeroes && cc.FastZero,
		Extents:     cc.Extents,
		MultiConn:   cc.MultiConn,
	}
	l.size = DataSize(child.Size())
	if env.Create && l.size < env.Size {
		return nil, fmt.Errorf("child holds %d data bytes, %d needed (child size %d, want %d)",
			l.size, env.Size, child.Size(), ChildSize(env.Size))
	}
	n := groupsFor(l.size)
	l.groups = make([]*groupState, n)
	for i := range l.groups {
		l.groups[i] = &groupState{}
	}
	l.epoch.Store(1)

	mf, err := env.OpenMeta(p.Meta)
	if err != nil {
		return nil, fmt.Errorf("in-flux map %s: %w", p.Meta, err)
	}
	l.bm, err = bitmap.OpenFile(mf, n)
	if err != nil {
		mf.Close()
		return nil, fmt.Errorf("in-flux map %s: %w", p.Meta, err)
	}
	if env.Create {
		err = l.clearStale()
	} else {
		err = l.recover()
	}
	if err != nil {
		l.bm.Close()
		return nil, err
	}
	return l, nil
}

// clearStale clears bits a previous file of the same name may hold: a
// new volume has nothing in flux.
func (l *Layer) clearStale() error {
	if l.bm.Count() == 0 || l.readOnly {
		return nil
	}
	for g := l.bm.NextSet(0); g >= 0; g = l.bm.NextSet(g + 1) {
		l.bm.Clear(g)
	}
	if err := l.bm.Sync(); err != nil {
		return fmt.Errorf("in-flux map: %w", err)
	}
	return nil
}

// recover reconciles every group in flux (I3). Read-only, the reconciled
// tables are kept in memory (pinned) instead of written.
func (l *Layer) recover() error {
	var influx []int64
	for g := l.bm.NextSet(0); g >= 0; g = l.bm.NextSet(g + 1) {
		influx = append(influx, g)
	}
	if len(influx) == 0 {
		return nil
	}
	fixed := 0
	written := influx[:0:0] // groups whose reconciled table the child took
	for _, g := range influx {
		t, n, err := l.reconcile(g, !l.readOnly, g*TableEntries, (g+1)*TableEntries)
		if err != nil {
			// A child that refuses the table (a full store) must not
			// make the volume unavailable: the reconciled table is
			// right, only writing it failed. It becomes the group's
			// dirty table (I5: reads verify against it, the group stays
			// in flux — its bit is durably set — and the next Flush
			// writes it). Only a table that could not be computed, or
			// no room to keep it, fails the open.
			if t == nil || !l.dirty.put(g, t) {
				return fmt.Errorf("reconcile group %d: %w", g, err)
			}
			l.groups[g].marked = true
			l.log.Warn("reconciled table kept in memory: the child refused it; the next flush writes it", "group", g, "err", err)
		} else {
			written = append(written, g)
		}
		fixed += n
		if l.readOnly {
			l.pinned[g] = t
		}
	}
	l.reconciled.Store(int64(len(influx)))
	l.log.Info("reconciled groups in flux after an unclean shutdown", "groups", len(influx), "entries_rewritten", fixed)
	if l.readOnly || !l.cc.Flush || len(written) == 0 {
		// Without a flush nothing here is known durable: the bits stay,
		// and the next open reconciles these groups again.
		return nil
	}
	if err := l.child.Flush(); err != nil {
		// The same: the bits stay, for the next Flush or open.
		l.log.Warn("flush after reconcile failed; the groups stay in flux", "groups", len(written), "err", err)
		return nil
	}
	for _, g := range written {
		l.bm.Clear(g)
	}
	if err := l.bm.Sync(); err != nil {
		// Cleared in memory only: the data is durable, and a bit left
		// set on disk costs a reconcile at the next open, nothing more.
		l.log.Warn("in-flux map not synced after reconcile", "err", err)
	}
	return nil
}

// Size implements block.Device.
func (l *Layer) Size() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.size
}

// Capabilities implements block.Device.
func (l *Layer) Capabilities() block.Capabilities { return l.caps }

// Children implements block.Parent.
func (l *Layer) Children() []block.Layer { return []block.Layer{l.child} }

// Stats returns the layer's counters.
func (l *Layer) Stats() Stats {
	return Stats{Repaired: l.repaired.Load(), CorruptReads: l.corruptReads.Load(), Reconciled: l.reconciled.Load()}
}

// Describe implements block.Layer: degraded while blocks are known to be
// corrupt and unrepaired (found by reads or the last scrub).
func (l *Layer) Describe() block.Node {
	kid := l.child.Describe()
	state := kid.State
	l.badMu.Lock()
	nbad := len(l.bad)
	l.badMu.Unlock()
	if state == block.StateOK && nbad > 0 {
		state = block.StateDegraded
	}
	return block.Node{Type: "checksum", Params: l.params, State: state, Children: []block.Node{kid}}
}

// Close implements block.Device. It flushes first: after a clean
// shutdown nothing is in flux, so the next open has nothing to reconcile
// (reconciling costs reads, and accepts whatever a group in flux holds).
func (l *Layer) Close() error {
	if l.closed.Load() {
		return nil
	}
	var err error
	if !l.readOnly && l.caps.Flush {
		err = l.Flush()
	}
	if l.closed.Swap(true) {
		return nil
	}
	err = errors.Join(err, l.bm.Close(), l.child.Close())
	if err != nil {
		return fmt.Errorf("checksum: close: %w", err)
	}
	return nil
}

// check validates a request; the caller holds l.mu.
func (l *Layer) check(off, n int64) error {
	if l.closed.Load() {
		return block.ErrClosed
	}
	if err := block.CheckRange(off, n, l.size); err != nil {
		return fmt.Errorf("checksum: %w", err)
	}
	return nil
}

// forGroups calls fn for the part of [off, off+n) inside each group, in
// order; at is the part's offset within the request.
func forGroups(off, n int64, fn func(g, off, n, at int64) error) error {
	at := int64(0)
	for n > 0 {
		g := off / GroupData
		m := min(n, (g+1)*GroupData-off)
		if err := fn(g, off, m, at); err != nil {
			return err
		}
		off, n, at = off+m, n-m, at+m
	}
	return nil
}

// span describes the blocks a request inside one group touches: blocks
// [b0, b1), whose bytes are [start, stop) (stop is clipped to the size).
type span struct{ b0, b1, start, stop int64 }

func (l *Layer) spanOf(off, n int64) span {
	b0, b1 := off/BlockSize, (off+n+BlockSize-1)/BlockSize
	return span{b0, b1, b0 * BlockSize, min(b1*BlockSize, l.size)}
}

// blockLen is the length of block b (BlockSize but for a short last one).
func (l *Layer) blockLen(b int64) int64 { return min(BlockSize, l.size-b*BlockSize) }

// ---- tables ----

// loadTable returns group g's table; the caller holds the group lock.
func (l *Layer) loadTable(g int64) (*table, error) {
	if t := l.cachedTable(g); t != nil {
		return t, nil
	}
	t, err := l.readTable(g)
	if err != nil {
		return nil, fmt.Errorf("checksum: read table of group %d: %w", g, err)
	}
	l.cache.put(g, t)
	return t, nil
}

// readTable reads group g's table from the child. With copies it reads
// every copy's: a write rewrites the whole table on every copy, so an
// entry corrupt in the copy it was loaded from would otherwise be spread
// to the others. Where the copies disagree, the entry some copy's data
// matches wins (no writes here: readers hold the group lock shared; a
// read or scrub of the block repairs the copies).
func (l *Layer) readTable(g int64) (*table, error) {
	if l.copies == nil {
		raw := make([]byte, BlockSize)
		if err := l.child.ReadAt(raw, tableOff(g)); err != nil {
			return nil, err
		}
		return decodeTable(raw), nil
	}
	var tabs []*table
	var errs error
	for k := range l.copies.NumCopies() {
		raw := make([]byte, BlockSize)
		if err := l.copies.ReadCopy(k, raw, tableOff(g)); err != nil {
			errs = errors.Join(errs, fmt.Errorf("copy %d: %w", k, err))
			continue
		}
		tabs = append(tabs, decodeTable(raw))
	}
	if len(tabs) == 0 {
		return nil, errs
	}
	t := tabs[0]
	for i := range int64(TableEntries) {
		differ := false
		for _, o := range tabs[1:] {
			differ = differ || o[i] != t[i]
		}
		b := g*TableEntries + i
		if !differ || b*BlockSize >= l.size {
			continue
		}
		data := make([]byte, l.blockLen(b))
	resolve:
		for k := range l.copies.NumCopies() {
			if l.copies.ReadCopy(k, data, dataOff(b*BlockSize)) != nil {
				continue
			}
			sum := entryOf(data)
			for _, o := range tabs {
				if o[i] == sum {
					t[i] = sum
					break resolve
				}
			}
		}
	}
	return t, nil
}

// cachedTable is the table this layer believes in without reading the
// child, or nil: pinned, dirty or cached, in that order. The caller holds
// the group lock.
func (l *Layer) cachedTable(g int64) *table {
	if t := l.pinned[g]; t != nil {
		return t
	}
	if t := l.dirty.get(g); t != nil {
		return t
	}
	return l.cache.get(g)
}

// keepTable replaces group g's table in memory only: the dirty one if
// the group has one, else the cached one (the caller wrote the child's
// copies to match). The caller holds the group lock exclusively.
func (l *Layer) keepTable(g int64, t *table) {
	if l.dirty.get(g) != nil {
		l.dirty.put(g, t)
		return
	}
	l.cache.put(g, t)
}

// storeTable makes t group g's table after a write into the group (I5):
// in memory until the next Flush while the child can flush and the dirty
// set has room, else written through. The caller holds the gate shared
// and the group lock exclusively, and marked the group in flux.
func (l *Layer) storeTable(g int64, t *table, fua bool) error {
	if !fua && l.cc.Flush && l.dirty.put(g, t) {
		l.cache.drop(g)
		return nil
	}
	return l.writeTable(g, t, fua)
}

// setEntries sets the entries of blocks b0, b0+1, ... in group g's table
// t after their data was written, and stores the table (storeTable). The
// group's dirty table is changed in place — readers hold the group lock
// shared, the caller holds it exclusively — so a write into a group
// already dirty copies nothing; any other table is copied first.
func (l *Layer) setEntries(g int64, t *table, b0 int64, entries []uint32, fua bool) error {
	if !fua && l.dirty.get(g) == t {
		for i, e := range entries {
			t[(b0+int64(i))%TableEntries] = e
		}
		return nil
	}
	nt := *t
	for i, e := range entries {
		nt[(b0+int64(i))%TableEntries] = e
	}
	return l.storeTable(g, &nt, fua)
}

// writeTable writes t to the child as group g's table; the caller holds
// the group lock exclusively. On failure the group's dirty table, if it
// has one, stays: it holds acknowledged entries that reconcile prefers.
func (l *Layer) writeTable(g int64, t *table, fua bool) error {
	if err := l.childWrite(t.encode(), tableOff(g), fua); err != nil {
		l.cache.drop(g)
		return fmt.Errorf("checksum: write table of group %d: %w", g, err)
	}
	l.dirty.drop(g)
	l.cache.put(g, t)
	return nil
}

// writeBack writes group g's dirty table, if it has one, to the child;
// the caller holds the group lock exclusively, and the gate shared unless
// it is Flush (whose child flush follows). A failure leaves the group
// stale: reconcile settles it from its data, starting from the dirty
// table.
func (l *Layer) writeBack(g int64, st *groupState) error {
	t := l.dirty.get(g)
	if t == nil {
		return nil
	}
	if err := l.writeTable(g, t, false); err != nil {
		l.markStale(st, 0, 0) // no data changed: the dirty table stays
		return err
	}
	return nil
}

// writeBackAll writes every dirty table; the caller holds l.mu (either
// way) and, unless it is Flush, keeps writes out.
func (l *Layer) writeBackAll() error {
	var errs error
	for _, g := range l.dirty.groups() {
		st := l.groups[g]
		st.mu.Lock()
		errs = errors.Join(errs, l.writeBack(g, st))
		st.mu.Unlock()
	}
	return errs
}

// childWrite writes to the child, emulating FUA by a flush when the child
// has Flush but no FUA.
func (l *Layer) childWrite(p []byte, off int64, fua bool) error {
	if fua && !l.cc.FUA {
		if err := l.child.WriteAt(p, off, false); err != nil {
			return err
		}
		return l.child.Flush()
	}
	return l.child.WriteAt(p, off, fua)
}

// ---- bad block bookkeeping ----

func (l *Layer) noteBad(b int64) {
	l.badMu.Lock()
	defer l.badMu.Unlock()
	if len(l.bad) < maxBad {
		l.bad[b] = struct{}{}
	}
}

func (l *Layer) forgetBad(b0, b1 int64) {
	l.badMu.Lock()
	defer l.badMu.Unlock()
	if len(l.bad) == 0 {
		return
	}
	for b := b0; b < b1; b++ {
		delete(l.bad, b)
	}
}

// ---- group locking, marking, reconciling ----

// lockShared takes group g's lock shared, reconciling it first if a
// failed write left it stale. The caller holds l.mu shared and not the
// gate.
func (l *Layer) lockShared(g int64, st *groupState) error {
	for {
		st.mu.RLock()
		if !st.stale {
			return nil
		}
		st.mu.RUnlock()
		// Lock order: l.mu, gate, group.
		l.gate.RLock()
		st.mu.Lock()
		err := l.reconcileStale(g, st)
		st.mu.Unlock()
		l.gate.RUnlock()
		if err != nil {
			return err
		}
	}
}

// reconcileStale reconciles a stale group; the caller holds the gate
// shared and the group lock exclusively. The table write it may make is
// of this epoch, so the next Flush covers it before clearing the bit.
func (l *Layer) reconcileStale(g int64, st *groupState) error {
	if !st.stale {
		return nil
	}
	st.epoch = l.epoch.Load()
	if _, _, err := l.reconcile(g, true, st.staleFrom, st.staleTo); err != nil {
		return fmt.Errorf("checksum: reconcile group %d after a failed write: %w", g, err)
	}
	st.stale, st.staleFrom, st.staleTo = false, 0, 0
	return nil
}

// markStale notes that a write into blocks [b0, b1) of a group failed
// part-way (b0 >= b1: only a table write, whose entries are still in
// memory); the caller holds the group lock exclusively.
func (l *Layer) markStale(st *groupState, b0, b1 int64) {
	if b0 < b1 {
		if st.staleFrom >= st.staleTo {
			st.staleFrom, st.staleTo = b0, b1
		} else {
			st.staleFrom, st.staleTo = min(st.staleFrom, b0), max(st.staleTo, b1)
		}
	}
	st.stale = true
	l.anyStale.Store(true)
}

// settleStale reconciles every group a failed write left stale, so that
// after a Flush each group's table in the child matches its data — which
// a snapshot of the child (cow below) relies on, as its clones open with
// nothing in flux. The caller holds l.mu shared and not the gate.
func (l *Layer) settleStale() error {
	if !l.anyStale.Swap(false) {
		return nil
	}
	l.gate.RLock()
	defer l.gate.RUnlock()
	var errs error
	for g, st := range l.groups {
		st.mu.Lock()
		err := l.reconcileStale(int64(g), st)
		if st.stale {
			l.anyStale.Store(true)
		}
		st.mu.Unlock()
		errs = errors.Join(errs, err)
	}
	return errs
}

// markInFlux readies group g for its first child write of an operation
// (I1); the caller holds the gate shared and the group lock exclusively.
// Operations call it only once they are about to write: one that fails
// before (a corrupt edge block) leaves the group as it was, so a crash
// cannot then accept the corruption while reconciling.
func (l *Layer) markInFlux(g int64, st *groupState) error {
	st.epoch = l.epoch.Load()
	if st.marked {
		return nil
	}
	l.bm.Set(g)
	if err := l.bm.Sync(); err != nil {
		return fmt.Errorf("checksum: mark group %d in flux: %w", g, err)
	}
	st.marked = true
	return nil
}

// reconcile makes group g's table match its data (I3): a block among
// [from, to) (the blocks writes may have changed without their entries)
// that does not verify is repaired from a copy that does if there is one,
// else its entry is recomputed from the data the child returns; any other
// block keeps its entry, so that corruption stays reported. Entries
// beyond the device's last block are zeroed. With write false nothing is
// written. It returns the resulting table and the number of entries
// changed — the table also when only writing it failed. The caller holds the group lock exclusively (or is New).
func (l *Layer) reconcile(g int64, write bool, from, to int64) (*table, int, error) {
	l.cache.drop(g)
	// A dirty table (a live group whose write failed) holds the entries
	// of acknowledged writes the child's table lacks: start from it, and
	// let repairBlock prefer it over the copies' tables.
	var t *table
	dirty := l.dirty.get(g)
	if dirty != nil {
		cp := *dirty
		t = &cp
	} else {
		var err error
		if t, err = l.readTable(g); err != nil {
			return nil, 0, fmt.Errorf("read table: %w", err)
		}
	}
	gs := g * GroupData
	ge := min(gs+GroupData, l.size)
	// Read the group in chunks: reconciling many groups on open must not
	// need a group's worth of memory each.
	const chunk = 64 * BlockSize
	data := make([]byte, min(chunk, ge-gs))
	changed := 0
	for i := range int64(TableEntries) {
		lo := i * BlockSize
		if gs+lo >= ge {
			if t[i] != 0 {
				t[i] = 0
				changed++
			}
			continue
		}
		if lo%chunk == 0 {
			n := min(chunk, ge-gs-lo)
			if err := l.child.ReadAt(data[:n], dataOff(gs+lo)); err != nil {
				return nil, 0, fmt.Errorf("read data at %d: %w", gs+lo, err)
			}
		}
		at := lo % chunk
		e := entryOf(data[at:min(at+BlockSize, ge-gs-lo+at)])
		if b := g*TableEntries + i; e == t[i] || b < from || b >= to {
			continue
		}
		if write && l.copies != nil {
			// Prefer a copy that verifies: the write that left this
			// block inconsistent was not acknowledged, and old data
			// that verifies is as valid an outcome as new data.
			if good, _, _, err := l.repairBlock(g, g*TableEntries+i, false); err == nil {
				if t[i] != good {
					t[i] = good
					changed++
				}
				continue
			}
		}
		t[i] = e
		changed++
	}
	if write && (changed > 0 || dirty != nil) {
		if err := l.writeTable(g, t, false); err != nil {
			return t, changed, err // the table is right; only writing it failed
		}
	} else if write {
		l.cache.put(g, t)
	}
	return t, changed, nil
}
