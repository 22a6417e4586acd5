package volume

// Reclaiming what deleted snapshots held. A snapshot freezes the volume's
// top image and starts a new one on it, so the volume's chain keeps
// passing through the snapshot's image after the snapshot is deleted: the
// chunks the volume overwrote since stay allocated there. Once nothing but
// the volume's top needs that image — no snapshot record names it, no
// clone's image sits on it — the volume's collapse job merges it with the
// top (cow.Layer.Collapse: the few chunks written since the snapshot are
// copied down into it, and it becomes the top), and the collector then
// removes the old top with every chunk the snapshot alone held.
//
// Who starts it: the collector, which sees every volume's top and every
// image's parent, proposes volumes whose top's parent looks unreferenced
// (collapseCandidates) and starts their jobs as the system. The job decides
// again, authoritatively, on the volume's live stack (collapseJob):
//
//  1. the top T and its parent P, from the live cow layer;
//  2. then the volume record, read linearizably: no snapshot of it is
//     being taken. A snapshot freezes the top before its record names the
//     frozen image; it is recorded in the volume's Snapshotting before
//     that freeze, so a freeze that made P the parent is seen here;
//  3. then the snapshot records, read linearizably: none names P. A
//     snapshot only ever names a top, and P stopped being one before T
//     existed, so no record read later can name P either; and a clone of P
//     needs such a record, so no clone of P can start later;
//  4. then the image directories: none but T has P as parent (the clones
//     made before P's snapshot was deleted, which finished under its read
//     lock before the delete), and none is unreadable (one being created,
//     or a clone's whose superblock cannot be read right now, could have P
//     as parent; an old leftover is removed by the collector first).
//
// A snapshot of the volume taken between the decision and the collapse's
// commit changes T: Collapse then refuses (cow.ErrChainChanged) and the
// job ends as a no-op; the next collection proposes it again. So it does
// while the volume whose snapshot froze P (flattened off it since) still
// has P open read-write (cow.ErrFrozenOpen).
//
// The job holds the volume's write lease while it runs (taking it if no
// node holds it): the lease holder is the one node that writes a volume,
// and a node that took the lease meanwhile for an rw attachment would go
// on writing the old top after the switch, losing those writes when the
// old top is collected. If another node holds the lease, the job is
// skipped here (the holder's own collector proposes it).
//
// The job holds the volume's job slot while it runs; user jobs and a
// volume delete that meet it wait for it (pastCollapse) rather than fail.
// It leaves the volume's last_job alone unless it fails: it is
// housekeeping, and a user's last repair report should stay visible.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/cow"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// CollapseReport is what a collapse job did.
type CollapseReport struct {
	Collapsed string `json:"collapsed,omitempty"` // the image that became the top
	Skipped   string `json:"skipped,omitempty"`   // why nothing was done
}

// readImage reads an image's superblock (cow.ReadImage; tests count the
// reads).
var readImage = cow.ReadImage

// errCollapsing: the volume runs a collapse job; the caller waits for it.
var errCollapsing = errors.New("volume is running a collapse job")

// collapseCandidates starts the collapse job of every volume (vol -> top)
// whose top's parent no snapshot names (roots) and no other image of
// images has as parent. Only the tops' superblocks are read, unless some
// top's parent is named by no snapshot: then every image's, to count
// children (a collection runs after every delete; most find nothing to
// collapse and should cost nothing more).
func (s *Service) collapseCandidates(tops map[string]string, roots []string, images []string) {
	dir := s.store.ImagesDir()
	named := map[string]bool{}
	for _, r := range roots {
		named[r] = true
	}
	parentOf := map[string]string{} // vol -> its top's parent, if no snapshot names it
	for vol, top := range tops {
		if r, err := cow.ReadImage(dir, top); err == nil && r.Parent != "" && !named[r.Parent] {
			parentOf[vol] = r.Parent
		}
	}
	if len(parentOf) == 0 {
		return
	}
	children := map[string]int{}
	for _, id := range images {
		r, err := cow.ReadImage(dir, id)
		if err != nil {
			return // it may sit on any image: decide next time
		}
		if r.Parent != "" {
			children[r.Parent]++
		}
	}
	for vol, p := range parentOf {
		// A volume that runs a job here, or whose job an earlier
		// collection is still starting, is left to the next collection:
		// its job would only be refused, after taking the volume's
		// workflow lock and reading its record for nothing.
		if children[p] != 1 || s.claimed("job/"+vol) || !s.claim("propose/"+vol) {
			continue
		}
		s.jobs.Add(1)
		go func() {
			defer s.jobs.Done()
			defer s.unclaim("propose/" + vol)
			_, err := s.StartJob(s.ctx, systemCaller, vol, meta.JobCollapse)
			switch {
			case err == nil:
				s.logFor("volume", vol).Info("collapse started", "image", p)
			case errs.IsCode(err, errs.CodeVolumeBusy) || errs.IsCode(err, errs.CodeNotFound) || s.ctx.Err() != nil:
				// Busy or gone: the next collection proposes it again.
			default:
				s.logFor("volume", vol).Warn("cannot start a collapse", "image", p, "err", err)
			}
		}()
	}
}

// collapseJob runs a collapse on live stack l (see the file comment).
func (s *Service) collapseJob(ctx context.Context, vol string, l block.Layer, p block.Progress) (any, error) {
	c, ok := find[*cow.Layer](l)
	if !ok {
		return nil, fmt.Errorf("no cow layer")
	}
	top := c.Top()
	ti, err := cow.ReadImage(s.store.ImagesDir(), top)
	if err != nil {
		return nil, err
	}
	parent := ti.Parent
	if parent == "" {
		return CollapseReport{Skipped: "the top has no parent"}, nil
	}
	if why, err := s.needed(ctx, vol, parent, top); err != nil || why != "" {
		return CollapseReport{Skipped: why}, err
	}
	err = c.Collapse(ctx, parent, p)
	if errors.Is(err, cow.ErrChainChanged) || errors.Is(err, cow.ErrFrozenOpen) {
		// A later collection proposes it again: the chain may call for
		// it still, and the volume that froze the image will have
		// closed its stack.
		return CollapseReport{Skipped: err.Error()}, nil
	}
	if err != nil {
		return nil, err
	}
	s.collectSoon() // the old top is garbage now
	return CollapseReport{Collapsed: parent}, nil
}

// needed says why image parent is needed by something besides volume
// vol's top ("": it is not), by steps 2 to 4 of the file comment. Steps 3
// and 4 read the whole store — every snapshot record, every image's
// superblock — so the jobs deciding at the same time (a burst of
// snapshot deletes proposes one per volume) share those reads: each
// joins the next collapseScan to begin, which reads after its step 2.
func (s *Service) needed(ctx context.Context, vol, parent, top string) (string, error) {
	rctx, ri := meta.WithReadInfo(ctx)
	v, err := s.meta.Volume(rctx, vol)
	if err == nil && ri.Local {
		err = errors.New("no quorum: the volume record read may be stale")
	}
	if err != nil {
		return "", err
	}
	if len(v.Snapshotting) > 0 {
		return "snapshot " + v.Snapshotting[0] + " of the volume is being taken", nil
	}
	sc, err := s.collapseScans.get(ctx)
	if err != nil {
		return "", err
	}
	if sc.local {
		return "", errors.New("no quorum: the snapshot records read may be stale")
	}
	if sn, ok := sc.named[parent]; ok {
		return "snapshot " + sn + " holds the image", nil
	}
	for _, im := range sc.images {
		if im.ID == top || im.ID == parent {
			continue
		}
		if im.err != nil {
			if time.Since(im.Modified) < s.cfg.ImageGrace {
				return "image " + im.ID + " is being created", nil
			}
			// Old and unreadable: a failed creation's leftover, or a
			// live clone's image that cannot be read right now (an
			// I/O error, no descriptor left) and may sit on parent.
			// As for the collector (cow.Sweep), what it names is
			// unknown: decide once it reads, or once the collector
			// has removed it as a leftover.
			return "image " + im.ID + " cannot be read (" + im.err.Error() + ")", nil
		}
		if im.parent == parent {
			return "image " + im.ID + " is built on it (a clone)", nil
		}
	}
	return "", nil
}

// collapseScan is what steps 3 and 4 of a collapse decision read: the
// snapshot records (linearizably; local if only a possibly stale copy
// answered), then every image of the store with its parent, in the
// store's listing order.
type collapseScan struct {
	local  bool
	named  map[string]string // image -> the first snapshot (by id) that names it
	images []scannedImage
}

type scannedImage struct {
	cow.Listed
	parent string
	err    error // its superblock could not be read
}

// scanForCollapse reads a collapseScan: the snapshot records first, the
// images after (the order of steps 3 and 4).
func (s *Service) scanForCollapse(ctx context.Context) (*collapseScan, error) {
	rctx, ri := meta.WithReadInfo(ctx)
	snaps, err := s.meta.Snapshots(rctx)
	if err != nil {
		return nil, err
	}
	sc := &collapseScan{local: ri.Local, named: map[string]string{}}
	if sc.local {
		return sc, nil
	}
	for _, sn := range snaps {
		if _, ok := sc.named[sn.Image]; !ok && sn.Image != "" {
			sc.named[sn.Image] = sn.ID
		}
	}
	images := s.store.ImagesDir()
	listed, err := cow.ListImages(images)
	if err != nil {
		return nil, err
	}
	sc.images = make([]scannedImage, 0, len(listed))
	for _, im := range listed {
		r, err := readImage(images, im.ID)
		sc.images = append(sc.images, scannedImage{Listed: im, parent: r.Parent, err: err})
	}
	return sc, nil
}

// sharedScan shares a read of the whole store among the callers that
// want one at about the same time. A caller gets the result of a run
// that began after it asked — never of one already under way, which may
// have read before the caller's own earlier reads — so it may wait for
// the run under way and then the next; every caller that asked during
// one run shares the next. Runs go one at a time, with ctx (the
// service's: a caller that gives up does not fail the others).
type sharedScan[T any] struct {
	ctx   context.Context
	fn    func(context.Context) (T, error)
	spawn func(func()) // runs the runner in the background

	mu      sync.Mutex
	running bool
	next    *scanRun[T] // the run the callers asking now join; not begun
}

type scanRun[T any] struct {
	done    chan struct{}
	waiters int
	val     T
	err     error
}

func newSharedScan[T any](ctx context.Context, fn func(context.Context) (T, error), spawn func(func())) *sharedScan[T] {
	return &sharedScan[T]{ctx: ctx, fn: fn, spawn: spawn}
}

// get returns the result of a run that begins after the call.
func (sc *sharedScan[T]) get(ctx context.Context) (T, error) {
	sc.mu.Lock()
	r := sc.next
	if r == nil {
		r = &scanRun[T]{done: make(chan struct{})}
		sc.next = r
	}
	r.waiters++
	if !sc.running {
		sc.running, sc.next = true, nil
		sc.spawn(func() { sc.run(r) })
	}
	sc.mu.Unlock()
	select {
	case <-r.done:
		return r.val, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// run performs r, then every run callers joined meanwhile, one at a time.
func (sc *sharedScan[T]) run(r *scanRun[T]) {
	for r != nil {
		r.val, r.err = sc.fn(sc.ctx)
		close(r.done)
		sc.mu.Lock()
		r, sc.next = sc.next, nil
		sc.running = r != nil
		sc.mu.Unlock()
	}
}

// pending is how many callers wait for a run not begun yet (tests).
func (sc *sharedScan[T]) pending() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.next == nil {
		return 0
	}
	return sc.next.waiters
}

// pastCollapse runs op until it no longer fails with errCollapsing,
// waiting out the collapse job of volume *id between tries, up to lockWait
// in all. One collapse may follow another (deleting two snapshots of a
// chain proposes two), so one wait and one retry are not enough. A
// collapse that outlasts the wait is VolumeBusy. id is a pointer because
// DeleteVolume learns it from op's first run.
func (s *Service) pastCollapse(ctx context.Context, id *string, op func() error) error {
	deadline := time.Now().Add(lockWait)
	for {
		err := op()
		if !errors.Is(err, errCollapsing) {
			return err
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is still collapsing a deleted snapshot's image; retry", *id)
		}
		// Housekeeping goes first, and is short: wait for it.
		s.awaitCollapse(ctx, *id, deadline)
		time.Sleep(20 * time.Millisecond) // should the wait end at once (a read failed)
	}
}

// awaitCollapse waits, until deadline, for volume id to run no collapse
// job.
func (s *Service) awaitCollapse(ctx context.Context, id string, deadline time.Time) {
	for time.Now().Before(deadline) {
		v, err := s.meta.Volume(ctx, id)
		if err != nil || v == nil || v.Job == nil || v.Job.Kind != meta.JobCollapse {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}
