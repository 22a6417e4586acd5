// Package parity is the `parity` layer (RAID-5): data striped over n ≥ 3
// legs with one parity chunk per stripe, so any one leg can be lost and
// every byte is still served, and a replacement leg can be rebuilt online.
//
// # Params
//
// {"chunk": BYTES} — the chunk (stripe unit), a power of two between 4 KiB
// and 16 MiB, default 64 KiB; {"meta": "NAME"} — the metadata file,
// relative to the stack's directory, default "parity.meta".
//
// # Layout
//
// Stripe s occupies bytes [s·C, (s+1)·C) of every leg (C = chunk). Its
// parity chunk is on leg p(s) = n-1 - (s mod n) and its data chunk d
// (0 ≤ d < n-1) on leg (p(s)+1+d) mod n — the "left-symmetric" layout of
// Linux md, so a sequential read touches every leg in turn. Logical byte x
// is in stripe x / ((n-1)·C), data chunk (x mod (n-1)·C) / C. Parity is
// computed with klauspost/reedsolomon (n-1 data shards, 1 parity shard)
// using its XOR matrix: the parity chunk is the XOR of the data chunks.
// The device presents exactly the size it was created or resized with;
// each leg holds ceil(size / ((n-1)·C)) stripes (childSize), and a tail
// of the last stripe beyond the size is never written by users but is kept
// consistent like the rest.
//
// # Metadata (one file, see meta.go)
//
//   - superblock (package superblock): geometry, size, per-leg state
//     (ok / failed / rebuilding) and the epoch — a counter bumped whenever
//     the set of valid legs changes.
//   - bitmap (package bitmap), 3+n bits per stripe: two write-intent bits
//     (one per epoch parity), "still to rebuild" and one "lost" bit per leg.
//   - journal: the content of a degraded stripe's missing data chunk.
//
// # Invariants (why it is crash-safe)
//
//  1. A stripe is modified only after its write-intent bit for the current
//     epoch is durable. The bit is cleared (lazily, see clean) only once a
//     Flush that started after the stripe's last update has completed, so
//     a stripe whose bit is clear on disk is consistent on disk (parity =
//     XOR of its data). On open every stripe whose bit is set gets its parity
//     recomputed from its data before anything else happens: the RAID-5
//     write hole (data written, parity not, or the reverse) is closed. (An
//     open that a full store keeps from writing that recovery leaves it to
//     before the first update: see "A full store".)
//  2. A data chunk on a missing leg exists only as parity, so recomputing
//     parity cannot repair it. Before a stripe whose missing leg holds data
//     is modified, the chunk's content after the update is written to the
//     journal (and synced), in the other slot of the stripe's pair — and
//     only then is its intent bit set, so the newest entry of a stripe
//     dirty on disk is from its current dirty period (a pair is released
//     only after the stripe's bit is durably clear). On open a dirty
//     degraded stripe takes the missing chunk from its newest valid entry
//     of the current epoch and recomputes parity with it; with no entry it
//     was not modified this epoch (every epoch starts with all stripes
//     consistent, invariant 4) and is left alone. Entries are believed
//     only for stripes whose chunk was missing on disk all epoch (the leg
//     is failed, or rebuilding and the stripe is not yet rebuilt), and
//     only in their epoch.
//  3. A dirty stripe whose missing data chunk has no journal entry (the leg
//     vanished in the same crash that interrupted the update, or fails
//     the open's recovery of the stripe: see "Failures") cannot be
//     recovered. It is marked lost for that leg (persisted): reads of that
//     chunk fail with EIO instead of returning reconstructed garbage, and
//     the stripe is made consistent with zeroes standing in for the chunk.
//     A write covering the whole chunk (in the last stripe: up to the
//     device's end) makes it readable again, once the write is durable —
//     also when another leg failed during the write but the write still
//     landed (see writePhase): the mark is cleared once that leg is marked
//     failed.
//  4. Changing the set of valid legs (a leg fails; a rebuild completes)
//     happens with no update in flight: healthy legs are flushed, the next
//     epoch's intent bits are cleared durably, then the superblock is
//     written with the new states and epoch (the commit point). The old
//     epoch's intent bits and journal entries die with it.
//  5. A leg being rebuilt is trusted for stripe s only once the stripe's
//     rebuild bit is clear; the bit is cleared (with the stripe locked)
//     only after the rebuilt chunk has been flushed, and the clear is
//     synced before the stripe is unlocked.
//
// # Operations
//
// A full-stripe write encodes parity from the new data alone. A partial
// one reads whichever is less: the old contents of the written ranges plus
// the parity (read-modify-write, 2 reads whatever n is: small writes) or
// the unwritten rest of the touched columns (reconstruct-write: writes
// covering most of a stripe). A request's stripes are written
// concurrently; a multi-stripe FUA request is written without FUA and the
// legs flushed once at the end. Reads go straight to the legs; a chunk on
// a missing leg is reconstructed from the rest of its stripe. Write-zeroes
// zeroes whole stripes on every leg (parity of zeroes is zeroes) and
// writes zeroes into partial ones; trim, advisory on the legs, is done as
// write-zeroes of whole stripes only (a leg keeping a trimmed chunk while
// another dropped its own would break the stripe). Extents: a range reads
// as zero where its leg's chunk does, and is a hole only where every leg
// that is not missing has a hole.
//
// # Concurrency
//
// Every operation holds `mode` shared; leg state changes, settle, Resize
// and Close hold it exclusively, so they never see an update in flight. A
// stripe is updated (and a missing chunk reconstructed) under its stripe
// lock (1024 locks, by stripe number modulo 1024); only zeroBatch and
// rebuildBatch hold several at once, taken in ascending order.
//
// # Failures
//
// A leg that fails an I/O, or whose Describe says failed at a Flush, or
// that cannot be opened (block.Failed), is marked failed in the superblock
// before the operation that noticed it returns — an update that reached
// every other leg is then acknowledged (it is reconstructable). Between
// an update whose write to a leg failed releasing its stripe and that leg
// being marked failed, the leg is "failing" (in memory): its chunk of the
// stripe is stale, so reads treat it as missing and updates wait for
// markFailed (they return a leg error for it first), so nothing computes
// parity from, returns, or acknowledges on top of, that chunk. Every error
// from a leg but a refusal for want of space (see "A full store") is a
// failure: a write that reached only some legs leaves a stripe
// inconsistent, which is only safe once that leg is out. A second leg out
// is not persisted: the layer freezes (state failed; writes fail with
// EIO; no metadata is written, intent bits stay), so that if that leg was
// only briefly unreachable the next open with it back is merely degraded
// and recovers normally. Meanwhile what can be read directly is served;
// the rest fails with EIO.
//
// At open the same holds for the recovery of the stripes a crash left
// dirty (invariant 1): a leg that fails one of its reads, parity writes
// or its flush is taken out as a leg found gone is — the open succeeds
// degraded, and the new epoch records the leg failed. The stripe it failed
// in is recovered without it, so its chunk there, if a data chunk, is lost
// (invariant 3); stripes recovered before it failed keep their chunk on
// it, which their new parity reconstructs once the other legs are
// flushed. A second leg out during that recovery freezes the layer as
// above, the open succeeding all the same. Close, too, marks failed a leg
// whose flush fails (or that failed a write not yet marked), as Flush does.
//
// # A full store
//
// A leg that refuses a write or a flush for want of space (ENOSPC, EDQUOT)
// is not failed: the legs live on the store's file system, which is full,
// not broken, and failing them would degrade, then freeze, every parity
// volume of a full store (writes failing with EIO until a reopen, not
// with the file system's error). The operation fails with that error
// instead, and the stripes it may have left inconsistent — the update's,
// or after a refused flush (which may have dropped what the leg had
// taken) every stripe updated since the last flush — become unsettled:
// their intent bits are set (an update sets its stripe's before writing;
// only a completed flush clears one) and stay; no stripe is updated, no
// intent bit cleared and no rebuild batch run until settle has recovered
// every stripe whose intent bit is set exactly as an open after a crash
// does (invariants 1 and 2: parity recomputed from the data, the journal's
// entry standing in for a chunk missing all epoch); and a missing chunk of
// an unsettled stripe reads as EIO, never reconstructed from stale
// parity. The next write, flush, resize or repair settles, failing with
// the store's error while it still cannot. An open whose recovery (or the
// epoch switch for a leg found gone) a full store refuses opens all the
// same with that work unsettled, every dirty stripe unsettled; a
// superblock write that fails (and may have landed: the disk's epoch is
// then unknown) leaves updates refused until a superblock write succeeds.
// A leg failing meanwhile for another reason — settle's own recovery
// included — freezes the layer, as a second leg out does (a new epoch
// would declare the unsettled stripes consistent); the next open
// recovers. A rebuild whose writes the store refuses stops, its leg still
// rebuilding, and starts again at the next Flush that succeeds.
//
// A store whose file system has turned read-only (EROFS from the whole
// file system, block.ErrStoreReadOnly; ext4 remounts itself so after an
// error) is a refusal of the same kind (block.StoreRefused): without it, the first refused write would fail
// one leg and the first refused flush a second, and the volume would stop
// serving reads its legs hold intact. Writes fail with EROFS instead;
// reads go on.
//
// # Who calls it
//
// block.Build for specs with type "parity" (volume types such as
// "parity3"), the volume service through block.Resizer (extend) and
// block.Repairer (repair; also resumed in the background on open), and the
// NBD server for I/O.
package parity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/bitmap"
	"github.com/basalt-storage/basalt/internal/block/superblock"
	"github.com/klauspost/reedsolomon"
)

func init() {
	block.Register(block.Type{
		Name: "parity", Doc: "RAID-5: striped data plus one rotating parity chunk per stripe",
		Params:      Params{},
		MinChildren: 3, MaxChildren: -1, TolerateFailedChildren: true,
		ChildSize: childSize, New: New,
		Files: func(raw json.RawMessage) []string {
			p := Params{Meta: DefaultMeta}
			if block.DecodeParams(raw, &p) != nil || p.Meta == "" {
				return nil // New refuses these params
			}
			return []string{p.Meta}
		},
	})
}

const (
	// DefaultChunk is the chunk when params give none.
	DefaultChunk = 64 << 10
	// DefaultMeta is the metadata file when params give none.
	DefaultMeta = "parity.meta"
	// MaxChunk bounds the chunk: a journal slot and every stripe update
	// buffer are a chunk or more.
	MaxChunk = 16 << 20
	maxLegs  = 256 // reedsolomon's GF(2^8) limit
	// lockSlots stripe locks, shared by stripes s ≡ k (mod lockSlots).
	lockSlots = 1024
)

// Params are the parity layer's parameters.
type Params struct {
	Chunk int64  `json:"chunk,omitempty"`
	Meta  string `json:"meta,omitempty"`
}

func decodeParams(raw json.RawMessage) (Params, error) {
	p := Params{Chunk: DefaultChunk, Meta: DefaultMeta}
	if err := block.DecodeParams(raw, &p); err != nil {
		return p, err
	}
	if p.Chunk < 4096 || p.Chunk > MaxChunk || p.Chunk&(p.Chunk-1) != 0 {
		return p, fmt.Errorf("chunk %d must be a power of two from 4096 to %d", p.Chunk, MaxChunk)
	}
	if p.Meta == "" {
		return p, errors.New("params.meta must not be empty")
	}
	return p, nil
}

// childSize: each leg holds one chunk of every stripe.
func childSize(raw json.RawMessage, size int64, n int) (int64, error) {
	p, err := decodeParams(raw)
	if err != nil {
		return 0, err
	}
	if n < 3 {
		return 0, fmt.Errorf("parity needs at least 3 legs, not %d", n)
	}
	d := int64(n-1) * p.Chunk
	return (size + d - 1) / d * p.Chunk, nil
}

// errLost is returned for reads of a chunk lost in a crash while degraded.
var errLost = fmt.Errorf("parity: chunk lost in a crash while a leg was missing: %w", syscall.EIO)

// errTooManyFailed is returned when a stripe is missing two chunks.
var errTooManyFailed = fmt.Errorf("parity: two legs failed: %w", syscall.EIO)

// errFrozen is returned for writes once two legs are out (see markFailed).
var errFrozen = fmt.Errorf("parity: two legs failed; writes refused until reopened with one of them back: %w", syscall.EIO)

// Layer is a parity layer.
type Layer struct {
	env     block.Env
	log     *slog.Logger
	params  json.RawMessage
	n       int
	chunk   int64
	dsz     int64 // data bytes per stripe: (n-1)·chunk
	bps     int64 // bitmap bits per stripe: 3+n
	enc     reedsolomon.Encoder
	caps    block.Capabilities
	legCaps block.Capabilities // what the legs present at open all support
	ro      bool
	pairs   int

	meta block.MetaFile
	sb   *superblock.Block
	bm   *bitmap.Bitmap
	jr   *journal

	// mode is held shared by every operation and exclusively by changes of
	// the legs' states, Resize and Close, so those see no update in flight.
	mode     sync.RWMutex
	closed   bool
	children []block.Layer
	state    []byte // legOK / legFailed / legRebuilding per leg, as in effect
	disk     []byte // the same as the superblock has it (differs only when frozen or read-only)
	epoch    uint64
	// frozen: two legs are out. Nothing is persisted any more (neither
	// the second failure nor intent bits cleared) and writes fail, so the
	// next open with one of them back can still recover.
	frozen atomic.Bool
	// failing: legs that failed a write of a stripe update and are not yet
	// marked failed in state (markFailed, which needs mode exclusively,
	// runs after the update released its stripe and mode). Their chunk of
	// that stripe is stale while the rest of it (parity included) is
	// already updated, so from the moment the update records it here,
	// under its stripe lock, a failing leg is missing for reads
	// (missingFor, legValid) and updates refuse to run until markFailed
	// has taken it out (failingError): an update relying on it being out
	// must not be acknowledged before that is durable. markFailedLocked
	// clears the bit once state says failed.
	failing []atomic.Bool
	// landedHook, if set (tests), runs in retry when an update landed
	// although a leg failed, before that leg is marked failed.
	landedHook func()
	// suspect: stripes whose interrupted update a read-only or frozen open
	// could not recover; their missing chunks are not reconstructed.
	suspect map[int64]bool
	// unsettled, when set, is work a full store kept from being done
	// (see "A full store"): stripes that may be inconsistent on disk
	// although no leg is out (recover), or a superblock that may hold
	// what a failed write left (super). Until settle has done it no
	// stripe is updated and no intent bit cleared, and the stripes in
	// unsettledStripes (guarded by mu) are not reconstructed from.
	unsettled        atomic.Pointer[pending]
	unsettledStripes map[int64]bool
	// rebuildStalled: the last rebuild stopped because the store was
	// full; the next Flush that succeeds starts it again.
	rebuildStalled atomic.Bool

	size    atomic.Int64
	stripes atomic.Int64

	locks [lockSlots]sync.Mutex

	mu         sync.Mutex
	flushGen   uint64
	updating   map[int64]int         // stripes being modified (their lock is held)
	dirty      map[int64]dirtyStripe // stripes whose intent bit is set
	releasable []int                 // journal pairs to free once the next bitmap sync lands
	pairEvents uint64                // bumped when pairs may have become releasable
	pairCond   *sync.Cond

	lost       atomic.Int64  // lost chunks
	untaken    atomic.Int64  // device bytes rebuilt since the last TakeResynced
	cleanDelay time.Duration // see defaultCleanDelay; tests pin it
	// batchStripes: stripes rebuilt per batch (about 8 MiB of chunks, at
	// most 256: the batch's stripes are locked meanwhile).
	batchStripes int

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	rb     rebuilder
}

// pending is what settle must do before any stripe is updated again.
type pending struct {
	err error // what kept it from being done: what writers are told meanwhile
	// recover: every stripe whose intent bit is set gets its parity
	// recomputed from its data, as after a crash (a leg refused part of
	// an update or a flush for want of space, or an open could not write
	// its recovery), and a leg state changed in memory only (a leg found
	// gone at open) is committed with a new epoch.
	recover bool
	// super: a superblock write failed, and may have landed: which epoch
	// and leg states the disk holds is unknown until one succeeds.
	super bool
}

// needSettle adds work for settle (see pending); err is kept from the
// first work that is still to do.
func (l *Layer) needSettle(recover, super bool, err error) {
	for {
		old := l.unsettled.Load()
		n := &pending{err: err, recover: recover, super: super}
		if old != nil {
			if (old.recover || !recover) && (old.super || !super) {
				return
			}
			n.err, n.recover, n.super = old.err, old.recover || recover, old.super || super
		}
		if l.unsettled.CompareAndSwap(old, n) {
			return
		}
	}
}

// settle does what a full store left to do (unsettled), if anything; it
// fails, with the store's error, while that still cannot be done.
func (l *Layer) settle() error {
	if l.unsettled.Load() == nil {
		return nil
	}
	l.mode.Lock()
	defer l.mode.Unlock()
	if l.closed {
		return block.ErrClosed
	}
	return l.settleLocked()
}

// settleLocked is settle with mode held exclusively: no update in flight.
// With recover, every stripe whose current intent bit is set gets its
// parity recomputed from its data chunks (the journal's entry standing in
// for a chunk on a leg missing all epoch), the legs are flushed and every
// intent bit cleared durably — recover, as at open — and a leg state
// that changed in memory only is committed by a new epoch; with super
// alone, the superblock is written again as memory has it.
func (l *Layer) settleLocked() error {
	p := l.unsettled.Load()
	if p == nil {
		return nil
	}
	if l.frozen.Load() {
		return errFrozen
	}
	if le := asLegError(l.failingError()); le != nil {
		// A leg failed a write meanwhile: out first (with stripes to
		// recover, that freezes the layer: see markFailedLocked).
		if err := l.markFailedLocked(le); err != nil {
			return err
		}
		if p = l.unsettled.Load(); p == nil {
			return nil
		}
	}
	if p.recover {
		if err := l.jr.scan(l.epoch); err != nil {
			return fmt.Errorf("parity recovery: %w", err)
		}
		gone := make([]bool, l.n)
		for i := range gone {
			gone[i] = l.state[i] == legFailed && l.disk[i] != legFailed
		}
		if err := l.recover(l.disk, gone, true, false); err != nil {
			if le := asLegError(err); le != nil {
				// A leg failed meanwhile: with stripes still unsettled
				// that freezes the layer (markFailedLocked); the next
				// open recovers, taking the leg out if it fails again.
				return l.markFailedLocked(le)
			}
			return fmt.Errorf("parity: stripes a full store left unsettled are still to recover: %w", err)
		}
		// Every stripe is consistent and durable, every intent bit
		// durably clear: no stripe holds a journal pair any more.
		l.mu.Lock()
		clear(l.dirty)
		l.unsettledStripes = nil
		l.jr.resetPairs()
		l.releasable = nil
		l.pairEvents++
		l.pairCond.Broadcast()
		l.mu.Unlock()
	}
	if !slices.Equal(l.state, l.disk) {
		if err := l.switchEpoch(l.state); err != nil {
			return err
		}
	} else if p.super {
		if err := l.writeSuper(l.disk, l.epoch, l.size.Load()); err != nil {
			return err
		}
	}
	l.unsettled.Store(nil)
	l.log.Info("parity: settled what a full store had left undone")
	return nil
}

// settleIfUnfrozen is settleLocked unless the layer is frozen (which
// settles nothing, and its next open recovers everything).
func (l *Layer) settleIfUnfrozen() error {
	if l.frozen.Load() {
		return nil
	}
	return l.settleLocked()
}

// dirtyStripe is when a stripe with its intent bit set was last updated.
type dirtyStripe struct {
	gen uint64 // flushGen at the time
	at  time.Time
}

// New builds a parity layer: it creates the metadata with env.Create, or
// opens it, recovers from an interrupted run and resumes a rebuild.
func New(env block.Env, raw json.RawMessage, children []block.Layer) (block.Layer, error) {
	p, err := decodeParams(raw)
	if err != nil {
		return nil, err
	}
	n := len(children)
	if n < 3 || n > maxLegs {
		return nil, fmt.Errorf("parity takes 3 to %d legs, not %d", maxLegs, n)
	}
	if len(env.ChildSpecs) != n {
		return nil, errors.New("a parity layer is built by block.Build (it needs its legs' specs to rebuild them)")
	}
	enc, err := reedsolomon.New(n-1, 1, reedsolomon.WithFastOneParityMatrix())
	if err != nil {
		return nil, fmt.Errorf("parity code: %w", err)
	}
	l := &Layer{
		env: env, log: env.Log, params: raw, n: n, chunk: p.Chunk, dsz: int64(n-1) * p.Chunk,
		bps: int64(3 + n), enc: enc, children: children, state: make([]byte, n), failing: make([]atomic.Bool, n),
		updating: map[int64]int{}, dirty: map[int64]dirtyStripe{}, cleanDelay: defaultCleanDelay,
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.pairCond = sync.NewCond(&l.mu)
	l.batchStripes = int(min(256, max(1, (8<<20)/p.Chunk)))
	var present []block.Layer
	for _, c := range children {
		if _, _, failed := block.IsFailed(c); !failed {
			present = append(present, c)
		}
	}
	l.legCaps = block.Combine(present)
	if !l.legCaps.Flush {
		return nil, errors.New("parity legs must support flush: crash safety depends on it")
	}
	l.ro = env.ReadOnly || l.legCaps.ReadOnly
	l.caps = block.Capabilities{
		ReadOnly: l.ro, Flush: true, FUA: true, WriteZeroes: true,
		FastZero: l.legCaps.WriteZeroes && l.legCaps.FastZero,
		Trim:     l.legCaps.WriteZeroes,
		Extents:  l.legCaps.Extents, MultiConn: l.legCaps.MultiConn,
	}
	// Journal pairs: about 4 MiB of journal, 8 to 64 pairs. They bound
	// the stripes written while degraded between two flushes (an internal
	// flush frees them when they run out).
	l.pairs = int(min(64, max(8, (4<<20)/(2*(jHeader+p.Chunk)))))
	l.meta, err = env.OpenMeta(p.Meta)
	if err != nil {
		return nil, fmt.Errorf("parity metadata %s: %w", p.Meta, err)
	}
	if env.Create {
		err = l.create(env.Size)
	} else {
		err = l.open()
	}
	if err != nil {
		l.meta.Close()
		return nil, fmt.Errorf("parity metadata %s: %w", p.Meta, err)
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	if !l.ro && !l.frozen.Load() {
		if slices.Contains(l.state, legRebuilding) {
			l.log.Info("parity: resuming rebuild")
			l.startRebuild(nil)
		}
	}
	return l, nil
}

func (l *Layer) perLeg() int64 { return l.stripes.Load() * l.chunk }

func (l *Layer) bitmapOff() int64 { return journalOff + int64(2*l.pairs)*(jHeader+l.chunk) }

func (l *Layer) setupMeta(stripes int64) error {
	l.jr = newJournal(&section{f: l.meta, off: journalOff, limit: int64(2*l.pairs) * (jHeader + l.chunk)}, l.chunk, l.pairs)
	bm, err := bitmap.OpenFile(&section{f: l.meta, off: l.bitmapOff(), limit: -1}, stripes*l.bps)
	if err != nil {
		return fmt.Errorf("bitmap: %w", err)
	}
	l.bm = bm
	return nil
}

func (l *Layer) create(size int64) error {
	head := make([]byte, journalOff)
	if _, err := (&section{f: l.meta, limit: -1}).ReadAt(head, 0); err != nil {
		return err
	}
	if !isZero(head) {
		return errors.New("already holds data: refusing to create over it")
	}
	if l.ro {
		return block.ErrReadOnly
	}
	smallest := l.children[0].Size()
	for _, c := range l.children[1:] {
		smallest = min(smallest, c.Size())
	}
	if size <= 0 {
		size = smallest / l.chunk * l.dsz
	}
	stripes := (size + l.dsz - 1) / l.dsz
	if stripes*l.chunk > smallest {
		return fmt.Errorf("legs of %d bytes cannot hold %d bytes (%d per leg)", smallest, size, stripes*l.chunk)
	}
	l.size.Store(size)
	l.stripes.Store(stripes)
	l.epoch = 1
	for i := range l.state {
		l.state[i] = legOK
	}
	l.disk = slices.Clone(l.state)
	if err := l.setupMeta(stripes); err != nil {
		return err
	}
	// Parity must match whatever the legs hold: zero them (fresh sparse
	// files make that free), or compute parity stripe by stripe.
	if err := l.initStripes(0, stripes); err != nil {
		return err
	}
	sb, err := superblock.CreateFile(&section{f: l.meta, limit: 2 * sbSlot}, sbSlot, l.payload(l.state, l.epoch, size).marshal())
	if err != nil {
		return err
	}
	l.sb = sb
	return nil
}

// initStripes makes stripes [from, to) consistent: zeroed on every leg,
// or (legs without write-zeroes) with parity computed from their data.
func (l *Layer) initStripes(from, to int64) error {
	if from >= to {
		return nil
	}
	if l.legCaps.WriteZeroes {
		for i, c := range l.children {
			if l.state[i] == legFailed {
				continue
			}
			if err := c.WriteZeroes(from*l.chunk, (to-from)*l.chunk, block.ZeroFlags{}); err != nil {
				return fmt.Errorf("zero leg %d: %w", i, err)
			}
		}
	} else {
		for s := from; s < to; s++ {
			m, _ := l.missingFor(s)
			if err := l.resync(s, m, nil); err != nil {
				return err
			}
		}
	}
	return l.flushLegs(-1)
}

func (l *Layer) payload(state []byte, epoch uint64, size int64) superPayload {
	return superPayload{Version: 1, Legs: l.n, Chunk: l.chunk, Size: size, Epoch: epoch, State: string(state), Pairs: l.pairs}
}

func (l *Layer) writeSuper(state []byte, epoch uint64, size int64) error {
	if err := l.sb.Write(l.payload(state, epoch, size).marshal()); err != nil {
		return fmt.Errorf("parity superblock: %w", err)
	}
	return nil
}

func (l *Layer) open() error {
	sb, raw, err := superblock.OpenFile(&section{f: l.meta, limit: 2 * sbSlot})
	if err != nil {
		return fmt.Errorf("corrupt or never created (both superblock copies invalid): %w", err)
	}
	l.sb = sb
	p, err := decodeSuper(raw)
	if err != nil {
		return err
	}
	switch {
	case p.Legs != l.n:
		return fmt.Errorf("made for %d legs, spec has %d", p.Legs, l.n)
	case p.Chunk != l.chunk:
		return fmt.Errorf("made with chunk %d, params say %d", p.Chunk, l.chunk)
	}
	stripes := (p.Size + l.dsz - 1) / l.dsz
	// Every leg that was ok has grown to hold the size before the
	// superblock recorded it (Resize), so a size no opened leg holds is
	// not ours; refuse it before the bitmap is sized from it.
	var largest int64
	for _, c := range l.children {
		if _, _, failed := block.IsFailed(c); !failed {
			largest = max(largest, c.Size())
		}
	}
	if stripes > largest/l.chunk {
		return fmt.Errorf("superblock size %d needs legs of %d bytes; the largest leg that opened has %d",
			p.Size, stripes*l.chunk, largest)
	}
	l.pairs = p.Pairs
	l.size.Store(p.Size)
	l.stripes.Store(stripes)
	l.epoch = p.Epoch
	persisted := []byte(p.State)
	copy(l.state, persisted)
	l.disk = slices.Clone(persisted)
	if err := l.setupMeta(stripes); err != nil {
		return err
	}
	if err := l.jr.scan(l.epoch); err != nil {
		return err
	}
	// Legs that could not be opened, or are too small to be ours, are gone.
	gone := make([]bool, l.n)
	for i, c := range l.children {
		if _, cause, failed := block.IsFailed(c); failed {
			gone[i] = true
			l.log.Warn("parity leg missing", "leg", i, "err", cause)
		} else if c.Size() < stripes*l.chunk && persisted[i] != legFailed {
			gone[i] = true
			l.log.Warn("parity leg too small; treating it as failed", "leg", i, "size", c.Size(), "need", stripes*l.chunk)
		}
		if gone[i] {
			l.state[i] = legFailed
		}
	}
	for i := l.bm.NextSet(0); i >= 0; i = l.bm.NextSet(i + 1) {
		if i%l.bps >= 3 {
			l.lost.Add(1)
		}
	}
	// Two legs out: touch nothing, so that the next open with one of them
	// back finds the metadata as it was.
	if countOut(l.state) > 1 && !l.ro {
		l.frozen.Store(true)
		l.log.Error("parity: two legs out; serving reads only", "state", string(l.state))
	}
	if err := l.recover(persisted, gone, !l.ro && !l.frozen.Load(), true); err != nil {
		if !block.StoreRefused(err) {
			return err
		}
		// A full store must not keep the volume from opening: the stripes
		// keep their intent bits, reads of their chunks on present legs
		// are right already, and settle recovers them — switching epoch
		// for a leg found gone too — before the first update, once there
		// is space (see "A full store").
		l.log.Warn("parity: recovery after an unclean shutdown waits for space", "err", err)
		l.mu.Lock()
		l.unsettledStripes = map[int64]bool{}
		for i := l.bm.NextSet(0); i >= 0; i = l.bm.NextSet(i + 1) {
			if i%l.bps == l.intentBit(0, l.epoch) {
				l.unsettledStripes[i/l.bps] = true
			}
		}
		l.mu.Unlock()
		l.needSettle(true, false, fmt.Errorf("recovery after an unclean shutdown: %w", err))
		return nil
	}
	// Persist a leg found gone (or taken out by recovery): a new epoch,
	// with every stripe consistent (recovery flushed the legs and cleared
	// every intent bit).
	if !slices.Equal(l.state, persisted) && !l.ro && !l.frozen.Load() {
		if err := l.switchEpoch(l.state); err != nil {
			if !block.StoreRefused(err) {
				return err
			}
			// The same: settle commits it before the first update.
			l.log.Warn("parity: recording a leg found gone waits for space", "err", err)
			l.needSettle(true, false, fmt.Errorf("recording a leg found gone: %w", err))
		}
	}
	return nil
}

// Bitmap bit indexes.
func (l *Layer) intentBit(s int64, epoch uint64) int64 { return s*l.bps + int64(epoch%2) }
func (l *Layer) rebuildBit(s int64) int64              { return s*l.bps + 2 }
func (l *Layer) lostBit(s int64, leg int) int64        { return s*l.bps + 3 + int64(leg) }

// Geometry.
func (l *Layer) parityLeg(s int64) int          { return l.n - 1 - int(s%int64(l.n)) }
func (l *Layer) dataLeg(s int64, d int) int     { return (l.parityLeg(s) + 1 + d) % l.n }
func (l *Layer) dataIndex(s int64, leg int) int { return (leg - l.parityLeg(s) - 1 + l.n) % l.n } // n-1: parity

// holdsData reports whether leg's chunk of stripe s is a data chunk that
// begins before the device's end.
func (l *Layer) holdsData(s int64, leg int) bool {
	d := l.dataIndex(s, leg)
	return d < l.n-1 && s*l.dsz+int64(d)*l.chunk < l.size.Load()
}

// missingFor returns the leg holding no valid chunk of stripe s (-1 for
// none) and how many such legs there are. The caller holds mode.
func (l *Layer) missingFor(s int64) (int, int) {
	m, cnt := -1, 0
	for i, st := range l.state {
		if st == legFailed || l.failing[i].Load() || st == legRebuilding && l.bm.Get(l.rebuildBit(s)) {
			m, cnt = i, cnt+1
		}
	}
	return m, cnt
}

// legValid reports whether leg holds a valid chunk of stripe s. The
// caller holds mode.
func (l *Layer) legValid(s int64, leg int) bool {
	st := l.state[leg]
	if l.failing[leg].Load() {
		return false
	}
	return st == legOK || st == legRebuilding && !l.bm.Get(l.rebuildBit(s))
}

// failingError returns a leg error for the legs that failed a write and
// are not yet marked failed (nil if none): an update that finds one
// returns it before touching anything, so that retry marks them failed
// (durably) first and runs the update again with them out.
func (l *Layer) failingError() error {
	var le *legError
	for i := range l.failing {
		if !l.failing[i].Load() {
			continue
		}
		if le == nil {
			le = &legError{leg: i, err: errors.New("failed a write; not yet marked failed")}
		} else {
			le.also = append(le.also, i)
		}
	}
	if le == nil {
		return nil
	}
	return le
}

func (l *Layer) isLost(s int64, leg int) bool {
	return l.lost.Load() > 0 && l.bm.Get(l.lostBit(s, leg))
}

// recover runs on open: every stripe whose current intent bit is set may
// be inconsistent (a crash interrupted its update) and gets its parity
// recomputed from its data — with the journal's copy of the missing chunk
// if a data leg is missing, or zeroes and a lost mark if there is none.
// Afterwards the legs are flushed and every intent bit cleared durably.
// persisted is the leg state the superblock holds; gone marks legs
// missing now. Without write (read-only or frozen) nothing is written:
// such stripes become suspect or lost in memory.
//
// With takeOut (open), a leg that fails an I/O of the recovery (a read,
// a parity write, the flush) is taken out as a leg found gone is: failed
// in l.state (the caller commits it with a new epoch) and gone from then
// on. The stripe it failed in is recovered again without it — its chunk
// there, if it held data, is lost (invariant 3); the stripes recovered
// before keep its chunk, which their new parity reconstructs once the
// other legs are flushed. A second leg out freezes the layer: nothing
// more is written (the stripes left become suspect) and nothing is
// persisted, so the next open with one of them back recovers. Without
// takeOut (settle) a leg's error is returned.
func (l *Layer) recover(persisted []byte, gone []bool, write, takeOut bool) error {
	fail := func(err error) bool {
		le := asLegError(err)
		if !takeOut || !write || le == nil || !slices.ContainsFunc(le.legs(), func(f int) bool { return !gone[f] }) {
			return false // (a leg already out is never read or written: no loop)
		}
		for _, f := range le.legs() {
			l.log.Error("parity leg failed while recovering after an unclean shutdown; running without it",
				"leg", f, "err", le.err)
			gone[f] = true
			l.state[f] = legFailed
		}
		if countOut(l.state) > 1 {
			l.frozen.Store(true)
			l.log.Error("parity: two legs out; serving reads only", "state", string(l.state))
			write = false
		}
		return true
	}
	dirty := false
	for i := l.bm.NextSet(0); i >= 0; i = l.bm.NextSet(i + 1) {
		s, k := i/l.bps, i%l.bps
		if k == 0 || k == 1 {
			dirty = true
		}
		if k != l.intentBit(0, l.epoch) {
			continue // the other epoch's bits are stale
		}
		for {
			err := l.recoverStripe(s, persisted, gone, write)
			if err == nil {
				break
			}
			if !fail(err) {
				return err
			}
		}
	}
	if !dirty || !write {
		return nil
	}
	for {
		err := l.flushLegs(-1)
		if err == nil {
			break
		}
		if !fail(err) {
			return fmt.Errorf("recover: %w", err)
		}
		if !write {
			return nil // frozen: the intent bits stay for the next open
		}
	}
	// The lost marks set above must be durable before any intent bit is
	// cleared: a stripe's bits can straddle two bitmap pages, which one
	// sync writes independently, and a crash landing only the page that
	// clears the intent bit would leave a stripe no open recovers again,
	// its lost chunk reconstructed as the zeroes resync stood in for it.
	// (Nothing dirty, nothing lost: this sync writes nothing.)
	if err := l.syncBitmap(); err != nil {
		return err
	}
	for i := l.bm.NextSet(0); i >= 0; i = l.bm.NextSet(i + 1) {
		if k := i % l.bps; k == 0 || k == 1 {
			l.bm.Clear(i)
		}
	}
	return l.syncBitmap()
}

// recoverStripe is recover's work on stripe s, whose current intent bit
// is set.
func (l *Layer) recoverStripe(s int64, persisted []byte, gone []bool, write bool) error {
	var miss []int
	for leg := range l.n {
		if gone[leg] || persisted[leg] == legFailed || persisted[leg] == legRebuilding && l.bm.Get(l.rebuildBit(s)) {
			miss = append(miss, leg)
		}
	}
	m := -1
	if len(miss) > 0 {
		m = miss[0]
	}
	switch {
	case len(miss) > 1:
		l.log.Error("parity: stripe interrupted with two legs missing; cannot recover it", "stripe", s)
		l.markSuspect(s)
		return nil
	case m >= 0 && m == l.parityLeg(s):
		return nil // all data present; the parity chunk does not exist
	}
	var dm []byte
	if m >= 0 {
		if persisted[m] == legFailed || persisted[m] == legRebuilding && l.bm.Get(l.rebuildBit(s)) {
			// The chunk was missing for the whole epoch, which began
			// with every stripe consistent, and every change of a
			// stripe missing a data chunk since was journaled first:
			// no entry means no change.
			found := false
			var err error
			if dm, found, err = l.jr.lookup(s, m); err != nil {
				return fmt.Errorf("journal: %w", err)
			}
			if !found {
				return nil
			}
		} else if l.holdsData(s, m) && !l.bm.Get(l.lostBit(s, m)) {
			// The leg vanished in the crash that interrupted the
			// update (or failed recovering it): its chunk can only
			// come from the parity, which may not match. (A chunk
			// wholly past the device's end holds zeroes — no write
			// reaches it — and resync stands them in for it: marked
			// lost, it could never be healed.)
			l.log.Error("parity: stripe was being written when its leg vanished; its chunk on that leg is lost",
				"stripe", s, "leg", m)
			l.bm.Set(l.lostBit(s, m))
			l.lost.Add(1)
		}
	}
	if !write {
		l.markSuspect(s)
		return nil
	}
	if err := l.resync(s, m, dm); err != nil {
		return fmt.Errorf("recover stripe %d: %w", s, err)
	}
	return nil
}

func (l *Layer) markSuspect(s int64) {
	if l.suspect == nil {
		l.suspect = map[int64]bool{}
	}
	l.suspect[s] = true
}

// resync recomputes stripe s's parity from its data chunks; m is a missing
// data leg (or -1) whose chunk is dm (nil: zeroes). The caller holds the
// stripe (or runs alone, at open).
func (l *Layer) resync(s int64, m int, dm []byte) error {
	C := l.chunk
	shards := make([][]byte, l.n)
	ops := make([]legOp, 0, l.n)
	for d := range l.n - 1 {
		leg := l.dataLeg(s, d)
		if leg == m {
			shards[d] = make([]byte, C)
			copy(shards[d], dm)
			continue
		}
		shards[d] = make([]byte, C)
		ops = append(ops, readOp(leg, shards[d], s*C))
	}
	if err := l.run(ops); err != nil {
		return err
	}
	shards[l.n-1] = make([]byte, C)
	if err := l.enc.Encode(shards); err != nil {
		return err
	}
	return l.run([]legOp{writeOp(l.parityLeg(s), shards[l.n-1], s*C, false)})
}

// Size implements block.Device.
func (l *Layer) Size() int64 { return l.size.Load() }

// inRange refuses a request that does not lie inside the device
// (block.Device).
func (l *Layer) inRange(off, n int64) error {
	if err := block.CheckRange(off, n, l.size.Load()); err != nil {
		return fmt.Errorf("parity: %w", err)
	}
	return nil
}

// Capabilities implements block.Device.
func (l *Layer) Capabilities() block.Capabilities { return l.caps }

// TakeResynced implements block.ResyncCounter: bytes of the device whose
// stripes were rebuilt (their chunk on the rebuilding leg reconstructed and
// made durable) since the previous call.
func (l *Layer) TakeResynced() int64 { return l.untaken.Swap(0) }

// Children implements block.Parent.
func (l *Layer) Children() []block.Layer {
	l.mode.RLock()
	defer l.mode.RUnlock()
	return append([]block.Layer(nil), l.children...)
}

// Describe implements block.Layer.
func (l *Layer) Describe() block.Node {
	l.mode.RLock()
	kids := block.Describe(l.children)
	state := append([]byte(nil), l.state...)
	l.mode.RUnlock()
	bad, rebuilding := 0, false
	for i, st := range state {
		switch {
		case st == legFailed:
			kids[i].State = block.StateFailed
			bad++
		case st == legRebuilding:
			kids[i].State = block.StateRebuilding
			rebuilding = true
			bad++
		case kids[i].State == block.StateFailed: // vanished, not yet noticed by a Flush
			bad++
		}
	}
	node := block.Node{Type: "parity", Params: l.params, Children: kids, State: block.StateOK}
	switch {
	case bad > 1:
		node.State = block.StateFailed
	case rebuilding:
		node.State = block.StateRebuilding
		pct := l.rb.percent()
		node.Progress = &pct
	case bad == 1 || l.lost.Load() > 0:
		node.State = block.StateDegraded
	}
	return node
}

// Resize implements block.Resizer: the legs grow first (a crash leaves
// them larger than needed, which is harmless), the new stripes are made
// consistent, then the superblock records the size.
func (l *Layer) Resize(size int64) error {
	if l.ro {
		return block.ErrReadOnly
	}
	if l.frozen.Load() {
		return errFrozen
	}
	l.mode.Lock()
	defer l.mode.Unlock()
	if l.closed {
		return block.ErrClosed
	}
	if err := l.settleLocked(); err != nil {
		return err
	}
	cur := l.size.Load()
	if size < cur {
		return fmt.Errorf("parity resize: cannot shrink from %d to %d bytes", cur, size)
	}
	if size == cur {
		return nil
	}
	old := l.stripes.Load()
	stripes := (size + l.dsz - 1) / l.dsz
	per := stripes * l.chunk
	for i, c := range l.children {
		if l.state[i] == legFailed || c.Size() >= per {
			continue
		}
		r, ok := c.(block.Resizer)
		if !ok {
			return fmt.Errorf("parity leg %d (%s) cannot grow", i, c.Describe().Type)
		}
		if err := r.Resize(per); err != nil {
			return fmt.Errorf("parity leg %d: %w", i, err)
		}
	}
	// A Resize whose superblock write (or initStripes) failed left the
	// bitmap grown, its new bits clear; it never shrinks, so a new target
	// smaller than that one grows it only if it needs more.
	if l.bm.Len() < stripes*l.bps {
		if err := l.bm.Grow(stripes * l.bps); err != nil {
			return err
		}
	}
	l.stripes.Store(stripes)
	if err := l.initStripes(old, stripes); err != nil {
		l.stripes.Store(old)
		return fmt.Errorf("parity resize: %w", err)
	}
	if err := l.writeSuper(l.disk, l.epoch, size); err != nil {
		l.stripes.Store(old)
		return err
	}
	l.size.Store(size)
	return nil
}

// Close implements block.Device: it stops a rebuild (it resumes on the
// next open), flushes the legs and, if that worked (and the layer is not
// frozen), clears every intent bit so the next open has nothing to
// recover. A leg that fails its flush — or failed a write of an update
// still waiting to mark it failed (see failing) — is marked failed first,
// as at Flush (markFailedLocked: the other legs flushed, then a new
// epoch), so what was written is durable on the others and Close succeeds
// degraded; a second leg out freezes the layer and Close returns
// errFrozen, the intent bits kept for the next open.
func (l *Layer) Close() error {
	l.rb.stop()
	l.mode.Lock()
	if l.closed {
		l.mode.Unlock()
		return nil
	}
	var first error
	if !l.ro {
		// As Flush does, a leg that failed a write (its chunk of that
		// stripe stale) or fails the flush is marked failed before any
		// intent bit is cleared — while not closed yet: markFailedLocked
		// refuses a closed layer.
		var err error
		if le := asLegError(l.failingError()); le != nil {
			err = l.markFailedLocked(le)
		}
		if err == nil {
			err = l.flushLegs(-1)
			if le := asLegError(err); le != nil {
				err = l.markFailedLocked(le)
			}
		}
		if err != nil {
			first = err
		} else if err := l.settleIfUnfrozen(); err != nil {
			// Stripes a full store left unsettled keep their bits: the
			// next open recovers them.
			first = err
		} else if !l.frozen.Load() {
			for i := l.bm.NextSet(0); i >= 0; i = l.bm.NextSet(i + 1) {
				if k := i % l.bps; k == 0 || k == 1 {
					l.bm.Clear(i)
				}
			}
			first = l.syncBitmap()
		}
	}
	l.closed = true
	l.cancel()
	l.mode.Unlock()
	l.rb.stop() // a rebuild started while we waited for mode
	l.bm.Close()
	l.sb.Close()
	if err := l.meta.Close(); err != nil && first == nil {
		first = err
	}
	if err := block.CloseAll(l.children); err != nil && first == nil {
		first = err
	}
	return first
}
