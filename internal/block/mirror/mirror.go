// Package mirror is the `mirror` layer (RAID-1): every leg (child) holds a
// full copy of the volume. Writes go to every healthy leg at once and
// succeed when at least one healthy leg took them; reads go to one healthy
// leg, round-robin, and a leg that fails a read is marked failed and the
// read retried on another. The volume service reaches it through
// block.Repairer (Repair: bring failed legs back and resynchronise them)
// and block.Copies (a checksum layer above reads and repairs each copy).
//
// Params (all optional): {"region": BYTES, "meta": "NAME"}. region is the
// granule of the write-intent and stale maps, a power of two >= 4096
// (default 1 MiB); meta is the metadata file in the stack directory
// (default "mirror.meta"; a second mirror in one directory needs its own).
// Size: the smallest leg when created; afterwards the size recorded in the
// metadata (Resize grows it).
//
// # On-disk format (metadata file, docs/formats.md)
//
//	[0, 8192)  superblock (package superblock, 4096-byte slots), payload JSON
//	           {"version":1,"region":R,"size":S,"legs":["ok"|"failed"|"rebuilding",…]}
//	[8192, …)  persistent bitmaps (package bitmap), one bit per region,
//	           page pairs interleaved: page p of bitmap j at
//	           8192 + (p×K + j)×8192, K = 1 + legs; bitmap 0 is the
//	           write-intent map, bitmap 1+i is leg i's stale map.
//
// # Invariants (why it is crash-safe)
//
//  1. Write intent: a region's intent bit is durable before any data write
//     into it starts (concurrent setters share one Sync, group commit), and
//     is cleared only after a Flush of every receiving leg that began after
//     the region's last write completed, while no write to it is in
//     flight, the leg set is unchanged, every leg state change is durable
//     and no sync a leg refused meanwhile is still to be recorded
//     (Layer.syncs) (and, as a policy, only once the region has been quiet for
//     DefaultClearDelay and through one whole flush interval). So after a
//     crash, every region where ok legs may differ has its intent bit set;
//     on open such regions are copied from one ok leg (the lowest-numbered)
//     to the others in the background, and reads of a region not yet
//     copied go to that same leg, so readers never see two versions (so
//     are regions an operation a leg refused for want of space touched:
//     see "A full store").
//  2. Stale maps: for a leg that is not ok, stale bit clear means the leg
//     holds the mirror's data for that region. A write sets the stale bit
//     of every failed leg it skips; a leg that fails inherits every intent
//     bit as stale; opening inherits intent bits into non-ok legs' stale
//     maps, and marks a leg found shorter than the mirror stale from its
//     end on (durably, before recording it failed: a superblock write
//     syncs the stale maps of the legs it records as not ok first). Before
//     intent bits are cleared, the stale maps of non-ok legs are synced, so
//     invariant 1 or a durable stale bit always covers a region a non-ok
//     leg may have missed.
//  3. Leg states: a leg's failure is durable in the superblock before any
//     write it missed is acknowledged (also one that skipped it while
//     another operation was still recording the failure: operations end
//     by persisting any leg state not yet durable), so a restart never
//     picks a stale leg as a resync source. A failed leg stays failed
//     across restarts until Repair. The last ok leg is never failed (its
//     errors go to the caller), so there is always a leg to read and
//     resync from.
//  4. Rebuild: Repair reopens a failed leg from its spec (or, when its
//     backing is gone, first marks every region stale durably, then creates
//     a replacement), marks it rebuilding (durable), and copies its stale
//     regions from an ok leg under the region's range lock, so writes
//     arriving meanwhile (which also go to the rebuilding leg) are neither
//     lost nor overwritten. Stale bits are cleared only after the leg was
//     flushed — and no flush or FUA write the leg refused meanwhile is
//     still to be recorded (Layer.syncs) — and synced every
//     DefaultCheckpoint regions, so an interrupted
//     rebuild (crash, Close, cancelled context) resumes where it stopped on
//     the next open. The leg turns ok once its stale map is empty.
//  5. Overlapping writes take a first-come-first-served byte-range lock, so
//     every leg sees them in the same order.
//
// # A full store
//
// A leg that refuses a write, a flush or a copy for want of space (ENOSPC,
// EDQUOT) is not failed: the legs live on the store's file system, which
// is full, not broken, and failing one would leave every mirrored volume
// of a full store degraded until someone repaired it. Instead the
// operation fails with the file system's error — never acknowledged, even
// if an ok leg took it, since the leg that refused it stays in service —
// and the regions it touched (for a flush, a FUA write or a resize, which
// syncs the legs it grows, every region with its intent bit set: a
// writeback refused for want of space may drop what the leg had taken)
// may now differ between the legs. They are
// treated as regions dirty at a crash (invariant 1): unsynced, read from
// the source leg, their intent bits kept until a resync has copied them to
// the other ok legs, and stale for legs that are not ok (invariant 2). That resync runs in
// the background once a flush succeeds (space may be back) and at the next
// open; one that meets a full store again stops and leaves the rest for
// the next. Leg states and stale bits that open cannot write (a full
// store) stay in memory: the volume opens, and the states are persisted
// before any write is acknowledged (invariant 3), the stale maps of legs
// recorded as not ok before their states.
//
// A store whose file system has turned read-only (EROFS from the whole
// file system, block.ErrStoreReadOnly; ext4 remounts itself so after an
// error) is a refusal of the same kind (block.StoreRefused): no leg is
// failed, writes fail with EROFS, reads go on, and what a refused write
// touched is resynchronised once writes succeed again. An EROFS from one
// storage target of a parallel file system fails the leg.
//
// Trim is implemented as WriteZeroes on every leg (holes allowed): a trim a
// leg may ignore could leave legs with different contents.
package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/bitmap"
	"github.com/basalt-storage/basalt/internal/block/superblock"
)

func init() {
	block.Register(block.Type{
		Name: "mirror", Doc: "RAID-1 across its children, with write-intent and stale-region resync",
		Params:      Params{},
		MinChildren: 2, MaxChildren: -1, TolerateFailedChildren: true, New: New,
		Files: func(raw json.RawMessage) []string {
			p := Params{Meta: DefaultMeta}
			if block.DecodeParams(raw, &p) != nil || p.Meta == "" {
				return nil // New refuses these params
			}
			return []string{p.Meta}
		},
	})
}

// Params are the mirror layer's parameters.
type Params struct {
	Region int64  `json:"region,omitempty"`
	Meta   string `json:"meta,omitempty"`
}

// Defaults.
const (
	DefaultRegion = 1 << 20
	DefaultMeta   = "mirror.meta"
)

// DefaultClearDelay is how long a region must have been quiet before a
// flush clears its intent bit (besides the flush rule, invariant 1): a
// working set of regions written again and again keeps its bits instead
// of paying a metadata sync whenever it returns (Linux md's bitmap waits a
// few seconds in the same way). A crash costs a resync of the regions
// written in the last few seconds.
const DefaultClearDelay = 3 * time.Second

// DefaultCheckpoint is how many regions a rebuild copies between syncs of
// the stale maps: what an interruption can cost again.
const DefaultCheckpoint = 64

// beforeResync, when set, runs in the background resync goroutine before it
// starts (tests use it to hold the resync back).
var beforeResync func()

// Layer is a mirror layer.
type Layer struct {
	// syncs is held shared by every operation that makes a leg sync
	// (a flush, a FUA write, a resize growing them) from its legs' calls
	// until a refusal is recorded (finish, growLegs: diverged), and
	// exclusively by a rebuild's checkpoint from its leg's flush until
	// it has cleared stale bits: a writeback that found no space drops a
	// rebuild's copies, and the file reports that to one sync only — if
	// it was the user's, the checkpoint's flush succeeds all the same,
	// and must not clear the bits of copies the refusal has not yet
	// forgotten. A flush that
	// succeeded takes it exclusively (a barrier) before it clears intent
	// bits, for the same reason: a concurrent sync may have been told of
	// writes the leg dropped, of which its own flush heard nothing.
	syncs sync.RWMutex

	env      block.Env
	params   json.RawMessage
	metaName string
	region   int64
	shift    uint
	log      *slog.Logger
	caps     block.Capabilities
	readOnly bool
	size     atomic.Int64

	meta   block.MetaFile
	sb     *superblock.Block
	intent *bitmap.Bitmap

	locks rangeLock
	rr    atomic.Uint64 // read round-robin

	// structMu serialises Resize against Repair replacing a leg.
	structMu sync.Mutex
	// sbMu serialises superblock writes (persist).
	sbMu sync.Mutex

	mu        sync.Mutex
	cond      *sync.Cond // intent group commit: signalled when a Sync ends
	legs      []*leg
	nreg      int64                  // regions
	sbSize    int64                  // size recorded (or to record) in the superblock
	dirty     map[int64]*regionState // exactly the set intent bits
	unsynced  int64                  // regions still dirty from before open
	setGen    uint64                 // intent bits set so far (generation)
	syncedGen uint64                 // setGen covered by the last intent Sync
	syncing   bool
	epoch     uint64 // flush epoch: incremented when a flush starts
	legsVer   uint64 // incremented whenever a leg's state or device changes
	stateVer  uint64 // incremented whenever the superblock payload changes
	persisted uint64 // stateVer last written to the superblock

	work      chan struct{} // held by whoever resyncs (background, Repair, Close)
	bgCtx     context.Context
	bgCancel  context.CancelFunc
	bg        sync.WaitGroup
	resyncing atomic.Bool
	kicked    atomic.Bool // a resync started by kickResync is queued or running
	progDone  atomic.Int64
	progTotal atomic.Int64
	copied    atomic.Int64 // bytes resynchronised since open
	untaken   atomic.Int64 // bytes resynchronised since the last TakeResynced
	// checkpointEvery is DefaultCheckpoint; tests lower it to make
	// interruptions land between checkpoints.
	checkpointEvery atomic.Int64
	// clearDelay is DefaultClearDelay (nanoseconds); tests set 0.
	clearDelay atomic.Int64
	closed     atomic.Bool
}

// leg is one child and what the mirror knows about it.
type leg struct {
	dev   block.Layer
	spec  block.Spec // to rebuild it
	state string
	gen   uint64          // incremented on every state change (rebuild checkpoints check it)
	refs  *sync.WaitGroup // operations in flight on dev (new one per dev)
	stale *bitmap.Bitmap
	// copied: regions a rebuild copied onto the leg whose stale bits the
	// next checkpoint may clear. A region made stale again after its copy
	// (a write the leg refused for want of space: diverged) leaves it, so
	// its bit stays and the rebuild copies it again. Guarded by mu.
	copied map[int64]bool
	// drops counts the times copied was forgotten (a refusal that may
	// have dropped copies): a copy under way then is not recorded, as
	// what it wrote before the refusal may be gone. Guarded by mu.
	drops uint64
}

// regionState is a region whose intent bit is set.
type regionState struct {
	inflight int    // writes in progress
	epoch    uint64 // flush epoch in which the last write completed
	last     int64  // when (monotonic nanoseconds) it completed; longAgo: none since open
	gen      uint64 // setGen when the bit was set (durable once syncedGen >= gen)
	unsynced bool   // dirty at open, not yet copied across the ok legs
	// refusals counts the operations a leg refused for want of space that
	// may have dropped writes here (diverged): a copy across that one
	// overtook may have been dropped, and does not make the region synced.
	refusals uint64
}

// target is a leg an operation uses, with a reference held on its device.
type target struct {
	i    int
	dev  block.Layer
	refs *sync.WaitGroup
}

// New builds a mirror layer.
func New(env block.Env, raw json.RawMessage, children []block.Layer) (block.Layer, error) {
	p := Params{Region: DefaultRegion, Meta: DefaultMeta}
	if err := block.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.Region < 4096 || p.Region&(p.Region-1) != 0 {
		return nil, fmt.Errorf("region %d must be a power of two of at least 4096", p.Region)
	}
	if p.Meta == "" {
		return nil, errors.New("params.meta must not be empty")
	}
	if env.Create && env.ReadOnly {
		return nil, errors.New("cannot create a mirror read-only")
	}
	if len(env.ChildSpecs) != len(children) {
		return nil, errors.New("a mirror is built by block.Build (it needs its legs' specs to rebuild them)")
	}
	log := env.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Layer{
		env: env, params: raw, metaName: p.Meta, region: p.Region, log: log.With("layer", "mirror", "meta", p.Meta),
		readOnly: env.ReadOnly, dirty: map[int64]*regionState{}, epoch: 1, work: make(chan struct{}, 1),
	}
	for 1<<l.shift < l.region {
		l.shift++
	}
	l.cond = sync.NewCond(&l.mu)
	l.checkpointEvery.Store(DefaultCheckpoint)
	l.clearDelay.Store(int64(DefaultClearDelay))
	mf, err := env.OpenMeta(p.Meta)
	if err != nil {
		return nil, fmt.Errorf("mirror metadata %s: %w", p.Meta, err)
	}
	l.meta = mf
	if err := l.open(children); err != nil {
		mf.Close()
		return nil, err
	}
	l.bgCtx, l.bgCancel = context.WithCancel(context.Background())
	if !l.readOnly && l.needsResync() {
		l.kicked.Store(true)
		l.startBackground()
	}
	return l, nil
}

// open reads (or creates) the metadata and reconciles it with the legs.
func (l *Layer) open(children []block.Layer) error {
	n := len(children)
	l.legs = make([]*leg, n)
	placeholder := make([]error, n)
	for i, c := range children {
		lg := &leg{dev: c, state: legOK, refs: &sync.WaitGroup{}, spec: l.env.ChildSpecs[i]}
		if _, err, ok := block.IsFailed(c); ok {
			placeholder[i] = err
			if err == nil {
				placeholder[i] = errors.New("child failed to open")
			}
		}
		l.legs[i] = lg
	}
	var st sbState
	if l.env.Create {
		empty, err := isEmpty(l.meta)
		if err != nil {
			return fmt.Errorf("mirror metadata %s: %w", l.metaName, err)
		}
		if !empty {
			return fmt.Errorf("mirror metadata %s already holds data (another mirror in this directory needs its own \"meta\" name)", l.metaName)
		}
		size := int64(-1)
		for i, c := range children {
			if placeholder[i] != nil {
				return fmt.Errorf("leg %d: %w", i, placeholder[i])
			}
			if size < 0 || c.Size() < size {
				size = c.Size()
			}
		}
		if size <= 0 {
			return fmt.Errorf("legs are empty (smallest is %d bytes)", size)
		}
		st = sbState{Version: formatV1, Region: l.region, Size: size, Legs: make([]string, n)}
		for i := range st.Legs {
			st.Legs[i] = legOK
		}
		payload, _ := json.Marshal(st)
		sb, err := superblock.CreateFile(sbSection{l.meta}, sbSlot, payload)
		if err != nil {
			return fmt.Errorf("mirror metadata %s: %w", l.metaName, err)
		}
		l.sb = sb
	} else {
		sb, payload, err := superblock.OpenFile(sbSection{l.meta})
		if err != nil {
			return fmt.Errorf("mirror metadata %s (empty or corrupt): %w", l.metaName, err)
		}
		l.sb = sb
		if st, err = decodeState(payload); err != nil {
			return fmt.Errorf("mirror metadata %s: %w", l.metaName, err)
		}
		if st.Region != l.region {
			return fmt.Errorf("mirror metadata %s: region is %d bytes, params say %d", l.metaName, st.Region, l.region)
		}
		if len(st.Legs) != n {
			return fmt.Errorf("mirror metadata %s records %d legs, the spec has %d", l.metaName, len(st.Legs), n)
		}
		// The size sizes the maps below: a forged one must not make them
		// huge. Some leg that opened must hold it (the mirror was made no
		// bigger than its smallest leg; legs only grow).
		biggest := int64(0)
		for i, c := range children {
			if placeholder[i] == nil {
				biggest = max(biggest, c.Size())
			}
		}
		if biggest > 0 && st.Size > biggest {
			return fmt.Errorf("mirror metadata %s records a size of %d bytes, more than any leg holds (%d)", l.metaName, st.Size, biggest)
		}
	}
	l.sbSize = st.Size
	l.size.Store(st.Size)
	l.nreg = (st.Size + l.region - 1) >> l.shift
	k := int64(1 + n)
	var err error
	if l.intent, err = bitmap.OpenFile(interleaved{l.meta, 0, k}, l.nreg); err != nil {
		return fmt.Errorf("mirror write-intent map: %w", err)
	}
	for i, lg := range l.legs {
		if lg.stale, err = bitmap.OpenFile(interleaved{l.meta, int64(1 + i), k}, l.nreg); err != nil {
			return fmt.Errorf("mirror leg %d stale map: %w", i, err)
		}
		lg.state = st.Legs[i]
	}

	// Reconcile the recorded states with what opened.
	changed := false
	for i, lg := range l.legs {
		switch {
		case placeholder[i] != nil:
			if lg.state != legFailed {
				l.log.Warn("mirror leg did not open; running degraded", "leg", i, "err", placeholder[i])
				lg.state, changed = legFailed, true
			}
		case lg.state != legFailed && lg.dev.Size() < st.Size:
			l.log.Warn("mirror leg is smaller than the mirror; marking it failed", "leg", i, "leg_size", lg.dev.Size(), "size", st.Size)
			// It lacks whatever lay beyond its end, and Repair grows it
			// and copies only stale regions: make them stale, durably
			// before the failure is recorded (a failed leg's size is not
			// checked again).
			lg.stale.SetRange(lg.dev.Size()>>l.shift, l.nreg)
			if !l.readOnly {
				if err := lg.stale.Sync(); err != nil {
					// A full store must not keep the volume from opening:
					// persist syncs the stale maps of legs it records as
					// not ok before it writes their states.
					l.log.Warn("mirror leg stale map not synced at open; it will be before the leg's failure is recorded", "leg", i, "err", err)
				}
			}
			lg.state, changed = legFailed, true
		case lg.state == legOK && lg.stale.NextSet(0) >= 0:
			// Only a leg whose failure was being recorded when the machine
			// stopped can be ok with stale regions: trust the stale map.
			l.log.Warn("mirror leg is ok but has stale regions; rebuilding it", "leg", i)
			lg.state, changed = legRebuilding, true
		}
	}
	oks := 0
	for _, lg := range l.legs {
		if lg.state == legOK {
			oks++
		}
	}
	if oks == 0 {
		return fmt.Errorf("mirror has no healthy leg (states %v)", l.states())
	}
	// Regions dirty at the crash: ok legs may differ there (resync them),
	// and non-ok legs may have missed writes there (stale).
	for r := l.intent.NextSet(0); r >= 0; r = l.intent.NextSet(r + 1) {
		rs := &regionState{last: longAgo}
		if oks > 1 {
			rs.unsynced = true
			l.unsynced++
		}
		l.dirty[r] = rs
		for _, lg := range l.legs {
			if lg.state != legOK {
				lg.stale.Set(r)
			}
		}
	}
	var real []block.Layer
	for i, lg := range l.legs {
		if placeholder[i] == nil {
			real = append(real, lg.dev)
		}
	}
	l.caps = block.Combine(real)
	// Trim is WriteZeroes on the legs (see the package comment).
	l.caps.Trim = l.caps.WriteZeroes
	l.caps.ReadOnly = l.caps.ReadOnly || l.readOnly
	if changed {
		l.stateVer++
		if err := l.persist(); err != nil {
			// Not fatal (a full store): the states hold in memory, and
			// every write persists them before it is acknowledged and
			// no intent bit is cleared until they are (invariant 3).
			l.log.Warn("mirror leg states not recorded at open; the next write records them", "err", err)
		}
	}
	if l.unsynced > 0 {
		l.log.Info("mirror was not shut down cleanly; resynchronising dirty regions", "regions", l.unsynced)
	}
	return nil
}

func (l *Layer) states() []string {
	out := make([]string, len(l.legs))
	for i, lg := range l.legs {
		out[i] = lg.state
	}
	return out
}

// persist writes the leg states and size to the superblock if they changed
// since the last write. Callers must not hold mu.
func (l *Layer) persist() error {
	if l.readOnly {
		return nil
	}
	l.sbMu.Lock()
	defer l.sbMu.Unlock()
	l.mu.Lock()
	ver := l.stateVer
	if ver == l.persisted {
		l.mu.Unlock()
		return nil
	}
	payload, err := json.Marshal(sbState{Version: formatV1, Region: l.region, Size: l.sbSize, Legs: l.states()})
	var stale []*bitmap.Bitmap
	for _, lg := range l.legs {
		if lg.state != legOK {
			stale = append(stale, lg.stale)
		}
	}
	l.mu.Unlock()
	if err != nil {
		return err
	}
	// A leg recorded as not ok is trusted where its stale bit is clear
	// (invariant 2): its stale map reaches the disk first. Bits a failure
	// inherits are covered by intent bits meanwhile, but those of a leg
	// found short at open by nothing else, if their sync there failed.
	for _, b := range stale {
		if err := b.Sync(); err != nil {
			return fmt.Errorf("mirror: recording leg states: stale map: %w", err)
		}
	}
	if err := l.sb.Write(payload); err != nil {
		return fmt.Errorf("mirror: recording leg states: %w", err)
	}
	l.mu.Lock()
	l.persisted = ver
	l.mu.Unlock()
	return nil
}

// failLeg marks leg i failed because dev failed with cause, unless it is
// the last ok leg (then it stays ok and the caller returns the error). It
// reports whether the leg is failed now. The caller persists (before
// acknowledging anything the leg missed) and then releases its reference.
func (l *Layer) failLeg(i int, dev block.Layer, cause error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lg := l.legs[i]
	if lg.dev != dev || lg.state == legFailed {
		return true
	}
	if lg.state == legOK {
		oks := 0
		for _, o := range l.legs {
			if o.state == legOK {
				oks++
			}
		}
		if oks == 1 {
			l.log.Error("mirror's last healthy leg failed an operation; keeping it", "leg", i, "err", cause)
			return false
		}
	}
	l.log.Warn("mirror leg failed; running degraded", "leg", i, "was", lg.state, "err", cause)
	l.setStateLocked(lg, legFailed)
	// Any region with its intent bit set may have missed a write on it.
	for r := range l.dirty {
		lg.stale.Set(r)
	}
	return true
}

func (l *Layer) setStateLocked(lg *leg, state string) {
	lg.state = state
	lg.gen++
	lg.copied = nil // copies of an earlier generation are not checkpointed
	l.legsVer++
	l.stateVer++
}

// acquireLocked takes a reference on leg i's device for an operation.
func (l *Layer) acquireLocked(i int) target {
	lg := l.legs[i]
	lg.refs.Add(1)
	return target{i: i, dev: lg.dev, refs: lg.refs}
}

func release(ts []target) {
	for _, t := range ts {
		t.refs.Done()
	}
}

// receiversLocked references every leg that takes writes (ok, rebuilding).
func (l *Layer) receiversLocked() []target {
	var ts []target
	for i, lg := range l.legs {
		if lg.state != legFailed {
			ts = append(ts, l.acquireLocked(i))
		}
	}
	return ts
}

// sourceLocked is the lowest-numbered ok leg: the copy resyncs read from
// and reads of unsynced regions use. There always is one (invariant 3).
func (l *Layer) sourceLocked() int {
	for i, lg := range l.legs {
		if lg.state == legOK {
			return i
		}
	}
	return -1
}

func (l *Layer) regionRange(r int64) (off, n int64) {
	off = r << l.shift
	return off, min(l.region, l.size.Load()-off)
}

// usable fails operations on a closed layer.
func (l *Layer) usable() error {
	if l.closed.Load() {
		return block.ErrClosed
	}
	return nil
}

// Size implements block.Device.
func (l *Layer) Size() int64 { return l.size.Load() }

// Capabilities implements block.Device: the legs' combined capabilities,
// fixed at open (legs that failed to open are not counted).
func (l *Layer) Capabilities() block.Capabilities { return l.caps }

// Children implements block.Parent.
func (l *Layer) Children() []block.Layer {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]block.Layer, len(l.legs))
	for i, lg := range l.legs {
		out[i] = lg.dev
	}
	return out
}

// TakeResynced implements block.ResyncCounter: bytes of the mirror copied
// onto other legs (rebuilds, and resyncs of regions dirty at a crash)
// since the previous call.
func (l *Layer) TakeResynced() int64 { return l.untaken.Swap(0) }

// NumCopies implements block.Copies.
func (l *Layer) NumCopies() int { return len(l.legs) }

// Describe implements block.Layer. A leg's node carries the mirror's view
// of it when that is worse than the leg's own (a leg whose data is stale
// reports failed or rebuilding even if its file is fine).
func (l *Layer) Describe() block.Node {
	l.mu.Lock()
	devs := make([]block.Layer, len(l.legs))
	states := l.states()
	for i, lg := range l.legs {
		devs[i] = lg.dev
	}
	// Regions not yet copied across the ok legs (dirty at a crash, or
	// refused by a full leg) are held by one leg only: one more loss
	// would lose them, whatever the legs' states say.
	unsynced := l.unsynced > 0
	l.mu.Unlock()
	kids := make([]block.Node, len(devs))
	healthy, degraded := 0, false
	for i, d := range devs {
		kids[i] = d.Describe()
		switch {
		case states[i] != legOK:
			kids[i].State = states[i]
			degraded = true
		case kids[i].State == block.StateFailed:
			degraded = true // its backing vanished while open
		default:
			healthy++
			degraded = degraded || kids[i].State != block.StateOK
		}
	}
	n := block.Node{Type: "mirror", Params: l.params, State: block.StateOK, Children: kids}
	switch {
	case healthy == 0:
		n.State = block.StateFailed
	case l.resyncing.Load():
		n.State = block.StateRebuilding
		pct := 0.0
		if t := l.progTotal.Load(); t > 0 {
			pct = 100 * float64(l.progDone.Load()) / float64(t)
		}
		n.Progress = &pct
	case degraded || unsynced:
		n.State = block.StateDegraded
	}
	return n
}

// Resize implements block.Resizer: every leg taking writes grows first
// (failed legs grow when Repair brings them back), then the maps, then the
// size is recorded.
func (l *Layer) Resize(n int64) error {
	if err := l.usable(); err != nil {
		return err
	}
	if l.readOnly {
		return block.ErrReadOnly
	}
	l.structMu.Lock()
	defer l.structMu.Unlock()
	cur := l.size.Load()
	if n < cur {
		return fmt.Errorf("mirror resize: cannot shrink from %d to %d bytes", cur, n)
	}
	if n == cur {
		return nil
	}
	if n > block.MaxSize {
		// The superblock could not record it (open refuses such a size),
		// and the region maps would be sized for it.
		return fmt.Errorf("mirror resize: %d bytes exceed the largest device size, %d", n, int64(block.MaxSize))
	}
	l.mu.Lock()
	ts := l.receiversLocked()
	l.mu.Unlock()
	defer release(ts)
	if err := l.growLegs(ts, n); err != nil {
		return err
	}
	nreg := (n + l.region - 1) >> l.shift
	if err := l.intent.Grow(nreg); err != nil {
		return err
	}
	for _, lg := range l.legs {
		if err := lg.stale.Grow(nreg); err != nil {
			return err
		}
	}
	l.mu.Lock()
	l.nreg, l.sbSize = nreg, n
	l.stateVer++
	l.mu.Unlock()
	if err := l.persist(); err != nil {
		return fmt.Errorf("mirror resize: %w", err)
	}
	l.size.Store(n)
	return nil
}

// growLegs grows the legs ts to n bytes. Growing a leg syncs it (a file's
// Resize fsyncs the new size), so it is a sync like a flush's (see
// Layer.syncs): a writeback that failed — for want of space, or otherwise
// — may have dropped writes the leg had taken since its last flush, or a
// rebuild's copies, and the file reports that to this sync alone, the
// leg's next flush succeeding. So a leg that fails to grow leaves every
// region with its intent bit set diverged (read from the source leg and
// copied across, stale for legs that are not ok, copies forgotten) before
// the sync lets a checkpoint or a flush clear anything.
func (l *Layer) growLegs(ts []target, n int64) error {
	// A leg that cannot grow is refused before any leg is synced.
	for _, t := range ts {
		if _, ok := t.dev.(block.Resizer); !ok && t.dev.Size() < n {
			return fmt.Errorf("mirror resize leg %d: a %s leg cannot grow", t.i, t.dev.Describe().Type)
		}
	}
	l.syncs.RLock()
	defer l.syncs.RUnlock()
	for _, t := range ts {
		if err := growLeg(t.dev, n); err != nil {
			l.diverged(nil)
			return fmt.Errorf("mirror resize leg %d: %w", t.i, err)
		}
	}
	return nil
}

func growLeg(d block.Layer, n int64) error {
	if d.Size() >= n {
		return nil
	}
	r, ok := d.(block.Resizer)
	if !ok {
		return fmt.Errorf("a %s leg cannot grow", d.Describe().Type)
	}
	return r.Resize(n)
}

// Close implements block.Device: it stops any resync (which resumes on the
// next open), flushes the legs and, when that succeeded, clears the
// write-intent map so a clean shutdown needs no resync.
func (l *Layer) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	l.bgCancel()
	l.work <- struct{}{} // wait for a running resync or Repair to stop
	l.bg.Wait()
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if !l.readOnly {
		if err := l.flushAll(true); err != nil {
			keep(err)
		} else {
			keep(l.intent.Sync())
		}
		for _, lg := range l.legs {
			keep(lg.stale.Sync())
		}
	}
	l.mu.Lock()
	devs := make([]block.Layer, len(l.legs))
	for i, lg := range l.legs {
		devs[i] = lg.dev
	}
	l.mu.Unlock()
	keep(l.meta.Close())
	keep(block.CloseAll(devs))
	return first
}
