package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/cow"
	_ "github.com/basalt-storage/basalt/internal/block/layers" // every layer type
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// A volume's data is a live layer stack (package block), opened once per
// node while anything uses it — NBD connections, a snapshot, a job — and
// shared by all of them, so that every user sees one cow chain and one set
// of in-memory layer state. The last user to let go flushes and closes it.

type liveStack struct {
	l      *exact
	refs   int
	forget func() // unregisters its write fence
	// reader: opened read-only, for readers (ro attachments), by a node
	// that does not write the volume (see acquireReader).
	reader bool
}

// env is the build environment of a stack whose directory is dir.
func (s *Service) env(dir string) block.Env {
	return block.Env{Dir: dir, Images: s.store.ImagesDir(), Keys: s.cfg.Keys, Log: s.log}
}

func parseSpec(raw json.RawMessage) (block.Spec, error) {
	var spec block.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return spec, fmt.Errorf("stack spec: %w", err)
	}
	return spec, nil
}

// createStack builds volume v's stack for the first time (on base, the
// image of the snapshot it is cloned from, if any) and closes it. A
// directory left by an interrupted earlier attempt is removed first: the
// volume never became available, so nothing in it was acknowledged. With
// fence (an import, run as the volume's writer), nothing is removed or
// written unless fence allows it.
func (s *Service) createStack(v *meta.Volume, base string, fence block.Fence) error {
	spec, err := parseSpec(v.Stack)
	if err != nil {
		return err
	}
	if fence != nil {
		if err := fence.Enter(); err != nil {
			return err
		}
		defer fence.Exit() // the directory's removal and creation below
	}
	dir := s.store.VolumeDir(v.ID)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	env := s.env(dir)
	env.Size, env.Create, env.Base, env.Fence = v.SizeBytes, true, base, fence
	l, err := block.Build(env, spec)
	if err != nil {
		return fmt.Errorf("build stack: %w", err)
	}
	if err := l.Flush(); err != nil {
		l.Close()
		return err
	}
	if err := l.Close(); err != nil {
		return err
	}
	// The stack's files in the volume's directory, and that directory in
	// volumes/, durably named before the volume is reported created.
	if err := block.SyncDir(dir); err != nil {
		return err
	}
	return block.SyncDir(filepath.Dir(dir))
}

// acquireReader returns volume v's live stack for a reader (an ro
// attachment), opening it if needed; release must be called when done.
// It shares the stack open here, whoever opened it; one it opens itself
// is read-only — no layer writes anything through it, not even a
// mirror's resync, a checksum's repair or the metadata a close
// records — because this node does not hold the volume's write lease:
// another node may be writing the volume (a job: a snapshot, an extend, a
// flatten), and a stack that wrote from its own, older view of the layers'
// state would undo that node's. A writer that opens the volume here later
// does not use it (acquireAs).
func (s *Service) acquireReader(v *meta.Volume) (block.Layer, func(), error) {
	return s.acquireAs(v, 0)
}

// acquireAs returns volume v's live stack, opening it if needed, for a
// workflow that took v's write lease with token (0: none, a reader; see
// acquireReader); release must be called when done. A stack it opens for
// a writer writes only while that lease is held here (leases.fenceFor),
// and is read-only if the store's file system is (its Capabilities say
// which).
func (s *Service) acquireAs(v *meta.Volume, token int64) (block.Layer, func(), error) {
	defer s.lockOpen(v.ID)()
	s.liveMu.Lock()
	ls := s.live[v.ID]
	if ls != nil && ls.reader && token != 0 {
		// A writer never writes through a reader's read-only stack:
		// forgotten, its users finish on it, and the writer opens the
		// volume afresh. Its multiattach readers are told to reconnect
		// (they then share the writer's stack, which sees its writes);
		// those of a volume that is not multiattach have no writer of
		// data to miss — a job changes no byte the volume reads.
		delete(s.live, v.ID)
		ls = nil
		if x := s.exports.Load(); x != nil {
			defer x.revokeReaders(v.ID)
		}
	}
	if ls != nil && ls.l.Size() < v.SizeBytes {
		// The volume grew since this stack was opened, and a new user
		// must see it at the record's size. Grown here (this node's
		// extend resized it), only the presented size lags: it was
		// opened from a record read before the extend committed. Else it
		// was opened while another node extended the volume (for ro
		// attachments served here): stale, it is forgotten — its users
		// finish on it — and the volume is opened afresh.
		if ls.l.Layer.Size() >= v.SizeBytes {
			ls.l.grow(v.SizeBytes)
		} else {
			delete(s.live, v.ID)
			ls = nil
		}
	}
	if ls != nil {
		ls.refs++
		s.liveMu.Unlock()
	} else {
		s.liveMu.Unlock()
		var err error
		if ls, err = s.openLive(v, token); err != nil {
			return nil, nil, err
		}
		s.liveMu.Lock()
		s.live[v.ID] = ls
		s.liveMu.Unlock()
	}
	var once sync.Once
	return ls.l, func() { once.Do(func() { s.releaseLive(v.ID, ls) }) }, nil
}

// openLive opens volume v's stack for acquireAs: read-only for a reader
// (token 0), else read-write under a fence on the lease of token.
func (s *Service) openLive(v *meta.Volume, token int64) (*liveStack, error) {
	spec, err := parseSpec(v.Stack)
	if err != nil {
		return nil, err
	}
	env := s.env(s.store.VolumeDir(v.ID))
	forget := func() {}
	if token == 0 {
		env.ReadOnly = true
	} else {
		env.Fence, forget = s.leases.fenceFor(v.ID, token)
	}
	l, err := block.Build(env, spec)
	storeRO := false
	if errors.Is(err, syscall.EROFS) && !env.ReadOnly {
		// The store's file system has turned read-only (ext4 does
		// after an error): what it holds is served read-only — every
		// user of this stack gets it so, writes failing — until the
		// last lets go and the next open tries read-write again.
		env.ReadOnly = true
		var rerr error
		if l, rerr = block.Build(env, spec); rerr == nil {
			s.log.Warn("the store's file system is read-only: volume opened read-only", "volume", v.ID, "err", err)
			err, storeRO = nil, true
		}
	}
	if err != nil {
		forget()
		return nil, fmt.Errorf("open volume %s: %w", v.ID, err)
	}
	if l.Size() < v.SizeBytes {
		l.Close()
		forget()
		return nil, fmt.Errorf("open volume %s: its stack has %d bytes, the volume %d", v.ID, l.Size(), v.SizeBytes)
	}
	e := &exact{Layer: l, storeRO: storeRO}
	e.size.Store(v.SizeBytes)
	return &liveStack{l: e, forget: forget, refs: 1, reader: token == 0}, nil
}

// releaseLive drops one reference to volume vol's live stack ls; the last
// one flushes and closes it.
func (s *Service) releaseLive(vol string, ls *liveStack) {
	defer s.lockOpen(vol)() // the next open of vol waits for this close
	s.liveMu.Lock()
	ls.refs--
	last := ls.refs == 0
	if last && s.live[vol] == ls {
		delete(s.live, vol)
	}
	s.liveMu.Unlock()
	if !last {
		return
	}
	if err := ls.l.Flush(); err != nil {
		s.logFor("volume", vol).Warn("flush on close", "err", err)
	}
	if err := ls.l.Close(); err != nil {
		s.logFor("volume", vol).Warn("close stack", "err", err)
	}
	ls.forget()
}

// lockOpen locks the mutex under which volume vol's stack is opened and
// closed (see Service.liveMu), and returns its unlock.
func (s *Service) lockOpen(vol string) (unlock func()) {
	return lockKey(&s.openMus, vol)
}

// flushLive flushes volume vol's live stack, if one is open here. Under
// the volume's open lock (lockOpen): a stack being closed (its last
// reference gone, its final flush under way) is waited for, and one being
// opened is flushed once it is.
func (s *Service) flushLive(vol string) {
	defer s.lockOpen(vol)()
	ls := s.liveOf(vol)
	if ls == nil {
		return
	}
	if err := ls.l.Flush(); err != nil {
		s.logFor("volume", vol).Error("flush before giving the write lease up failed: writes acknowledged here may be lost", "err", err)
	}
}

// liveOf returns volume vol's live stack, nil if none is open here.
func (s *Service) liveOf(vol string) *liveStack {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	return s.live[vol]
}

// dropLive forgets volume vol's open stack after this node lost its write
// lease: its in-memory state may be stale once another node wrote. Users
// still holding it finish on the old (fenced) stack; the next acquire
// opens a fresh one.
func (s *Service) dropLive(vol string) {
	defer s.lockOpen(vol)() // an open under way is dropped once it is done
	s.liveMu.Lock()
	delete(s.live, vol)
	s.liveMu.Unlock()
}

// exact presents a stack at exactly the volume's size: layers may round
// their size up (a stripe to whole stripe units), but the volume is the
// size its record says. Smaller than the stack is safe: callers never go
// beyond Size().
type exact struct {
	block.Layer
	size atomic.Int64
	// storeRO: opened read-only because the store's file system was
	// (openLive), not because a layer of the volume's type is.
	storeRO bool
}

func (e *exact) Size() int64             { return e.size.Load() }
func (e *exact) Children() []block.Layer { return []block.Layer{e.Layer} }

// TryReadAt implements block.NoWaitReader when the stack does.
func (e *exact) TryReadAt(p []byte, off int64) bool { return block.TryReadAt(e.Layer, p, off) }

// SpliceTo implements block.Splicer when the stack does.
func (e *exact) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	return block.SpliceTo(e.Layer, pipe, off, n, nowait)
}

// SpliceFrom implements block.SpliceWriter when the stack does.
func (e *exact) SpliceFrom(pipe int, off int64, n int) int {
	return block.SpliceFrom(e.Layer, pipe, off, n)
}

// Resize grows the stack (if it is not big enough already) and then the
// presented size.
func (e *exact) Resize(n int64) error {
	if e.Layer.Size() < n {
		r, ok := e.Layer.(block.Resizer)
		if !ok {
			return errs.Invalid(errs.CodeNotSupportedByType, "its layer stack cannot grow: its %s layer cannot resize", e.Layer.Describe().Type)
		}
		if err := r.Resize(n); err != nil {
			return err
		}
	}
	e.grow(n)
	return nil
}

// grow raises the presented size to n, never lowering it (an acquire
// catching up with the record may race with a Resize to a larger size).
func (e *exact) grow(n int64) {
	for cur := e.size.Load(); cur < n && !e.size.CompareAndSwap(cur, n); cur = e.size.Load() {
	}
}

// find returns the first layer of the stack that is a T.
func find[T any](l block.Layer) (T, bool) {
	var out T
	found := false
	block.Walk(l, func(x block.Layer) bool {
		if t, ok := x.(T); ok {
			out, found = t, true
			return false
		}
		return true
	})
	return out, found
}

// Stack describes volume v's layer tree (type, params, state, progress,
// backing file paths): the live stack's if this node has it open, else
// the stack opened read-only for the moment, so that describing a volume
// never writes to it (another node may be serving it).
func (s *Service) Stack(ctx context.Context, v *meta.Volume) (*block.Node, error) {
	if len(v.Stack) == 0 || (v.Status != meta.StatusAvailable && v.Status != meta.StatusInUse && v.Status != meta.StatusExtending) {
		return nil, nil
	}
	s.liveMu.Lock()
	ls := s.live[v.ID]
	var n block.Node
	if ls != nil {
		n = ls.l.Describe()
	}
	s.liveMu.Unlock()
	if ls != nil {
		return &n, nil
	}
	spec, err := parseSpec(v.Stack)
	if err != nil {
		return nil, err
	}
	env := s.env(s.store.VolumeDir(v.ID))
	env.ReadOnly = true
	l, err := block.Build(env, spec)
	if err != nil {
		return nil, fmt.Errorf("describe volume %s: %w", v.ID, err)
	}
	defer l.Close()
	n = l.Describe()
	return &n, nil
}

// collect removes the stacks of volumes that have no record
// (sweepStacks), then the copy-on-write images no volume and no snapshot
// needs. Roots: every snapshot record's image, every volume's top, and
// the image a snapshot still being recorded has frozen (frozenRoots);
// images younger than the grace period are spared (another node may be
// creating them right now).
//
// This node's own creations (they hold gcMu for reading) are kept apart
// by holding gcMu only while the images are listed and the volumes' tops
// read: every image listed is then either some top's chain or garbage.
// The snapshot records are read before (a snapshot made since has its
// image in its volume's new top's chain), the sweep runs after.
func (s *Service) collect(ctx context.Context) {
	s.sweepStacks(ctx)
	roots, creating, err := s.snapshotImages(ctx)
	if err != nil {
		s.log.Warn("image collection skipped", "err", err)
		return
	}
	s.gcMu.Lock()
	listed, err := cow.ListImages(s.store.ImagesDir())
	var tops map[string]string
	if err == nil {
		tops, err = s.tops()
	}
	s.gcMu.Unlock()
	if err == nil {
		// Again: a snapshot committed after the first read whose volume
		// let go of its image before its top was read (deleted, or
		// flattened off it) is in neither read — its record was
		// committed before the tops were read, so it is in this one.
		var more []string
		var later []*meta.Snapshot
		if more, later, err = s.snapshotImages(ctx); err == nil {
			roots = append(roots, more...)
			roots = append(roots, s.frozenRoots(tops, append(creating, later...))...)
		}
	}
	if err != nil {
		s.log.Warn("image collection skipped", "err", err)
		return
	}
	live := roots
	for _, top := range tops {
		live = append(live, top)
	}
	removed, err := cow.Sweep(s.store.ImagesDir(), listed, live, s.cfg.ImageGrace)
	if len(removed) > 0 {
		s.log.Info("images removed", "count", len(removed), "images", removed)
	}
	if err != nil {
		s.log.Warn("image collection", "err", err)
		return
	}
	// What is left: propose collapses of deleted snapshots' images
	// (collapse.go; the job decides again).
	var left []string
	for _, im := range listed {
		if !slices.Contains(removed, im.ID) {
			left = append(left, im.ID)
		}
	}
	s.collapseCandidates(tops, roots, left)
}

// snapshotImages returns the images of every snapshot, and the
// snapshots still being created, read linearizably: a stale local copy
// (no quorum) may lack a snapshot taken through another node, whose image
// would then look unused.
func (s *Service) snapshotImages(ctx context.Context) (images []string, creating []*meta.Snapshot, err error) {
	rctx, ri := meta.WithReadInfo(ctx)
	snaps, err := s.meta.Snapshots(rctx)
	if err == nil && ri.Local {
		err = errors.New("no quorum: only a possibly stale copy of the snapshot records could be read")
	}
	if err != nil {
		return nil, nil, err
	}
	for _, sn := range snaps {
		images = append(images, sn.Image)
		if sn.Status == meta.StatusCreating {
			creating = append(creating, sn)
		}
	}
	return images, creating, nil
}

// frozenRoots returns the images that snapshots still being created have
// frozen already: a snapshot whose record lost the commit naming its
// image (stranded until a sweep finishes it, stranded.go) is held by
// nothing but its volume's chain, and a flatten that was running as it
// froze cuts the chain there. The volume's top (in tops, read after the
// records) names the image it froze while the snapshot started it — the
// image the sweep will record (cow's Snapshot returns it again).
func (s *Service) frozenRoots(tops map[string]string, creating []*meta.Snapshot) []string {
	var out []string
	for _, sn := range creating {
		top, ok := tops[sn.VolumeID]
		if !ok {
			continue
		}
		im, err := cow.ReadImage(s.store.ImagesDir(), top)
		if err == nil && im.Tag == sn.ID && im.Froze != "" {
			out = append(out, im.Froze)
		}
	}
	return out
}

// sweepStacks removes the stack directories of volumes that have no
// record: left by a create that failed or died before its commit, or by a
// delete that died (or could not remove them) after its commit. Spared:
// stacks younger than the image grace (another node may be about to
// commit their record) and those this node is creating (their claim).
// The directories are listed and the claims checked before the records
// are read, so a stack whose record is committed meanwhile is spared; the
// records must be read linearizably (never from a stale local copy).
func (s *Service) sweepStacks(ctx context.Context) {
	dir := filepath.Dir(s.store.VolumeDir("x"))
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("stack collection skipped", "err", err)
		}
		return
	}
	var old []string
	for _, d := range ents {
		info, err := d.Info()
		if err != nil || time.Since(info.ModTime()) < s.cfg.ImageGrace {
			continue // removed meanwhile, or young
		}
		if _, creating := s.claims.Load("create/" + d.Name()); creating {
			// Checked before the records are read: a create that has
			// released its claim has committed (or given up) by then.
			continue
		}
		old = append(old, d.Name())
	}
	if len(old) == 0 {
		return
	}
	// Only a current list will do: a node cut off from the quorum reads
	// its own copy, which may lack volumes created meanwhile elsewhere,
	// and would take their stacks for orphans.
	rctx, ri := meta.WithReadInfo(ctx)
	vols, err := s.meta.Volumes(rctx)
	if err == nil && ri.Local {
		err = errors.New("no quorum: only a possibly stale copy of the volume records could be read")
	}
	if err != nil {
		s.log.Warn("stack collection skipped", "err", err)
		return
	}
	recorded := make(map[string]bool, len(vols))
	for _, v := range vols {
		recorded[v.ID] = true
	}
	for _, id := range old {
		if recorded[id] {
			continue
		}
		if err := s.store.RemoveVolume(id); err != nil {
			s.log.Warn("stack collection", "volume", id, "err", err)
			continue
		}
		s.logFor("volume", id).Info("stack without a record removed")
	}
}

// tops reads the top image of every volume in the store, by volume id.
func (s *Service) tops() (map[string]string, error) {
	dir := filepath.Dir(s.store.VolumeDir("x"))
	vols, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	tops := map[string]string{}
	for _, e := range vols {
		top, err := cow.TopOf(filepath.Join(dir, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // a stack without cow, or one being created
		}
		if err != nil {
			return nil, fmt.Errorf("unreadable volume %s: %w", e.Name(), err)
		}
		tops[e.Name()] = top
	}
	return tops, nil
}

// notSupported is the error for an operation the volume's stack cannot do.
func notSupported(v *meta.Volume, what string) error {
	return errs.Invalid(errs.CodeNotSupportedByType, "volume %s (type %s) cannot %s: its layer stack has no layer that can", v.ID, v.Type, what)
}

// DefaultImageGrace is how long an unreferenced image is spared by
// collection (it may be being created by another node).
const DefaultImageGrace = 10 * time.Minute
