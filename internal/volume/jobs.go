package volume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/cow"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/lock"
	"github.com/basalt-storage/basalt/internal/meta"
)

// Jobs are long operations on a volume's live stack: flatten (cow), repair
// (mirror, parity) and scrub (checksum). A job is recorded on the volume
// (Job, with progress) so `volume show` follows it and a restarted node
// runs it again; its outcome is kept in LastJob. The volume stays usable
// meanwhile. A job runs on the node that writes the volume, holding its
// write lease for the whole run (leases.use; taken if no node holds it),
// so no other node can take the volume for an rw attachment and write its
// files alongside; if another node took the lease before the job began,
// the job is handed to that node.

// progressEvery is how often a running job persists its progress.
const progressEvery = time.Second

// StartJob starts job kind on a volume and returns the volume with the job
// recorded.
func (s *Service) StartJob(ctx context.Context, c Caller, ref, kind string) (*meta.Volume, error) {
	v, wl, err := s.lockedVolume(ctx, c, ref, lock.Update)
	if err != nil {
		return nil, err
	}
	defer wl.unlock()
	spec, err := parseSpec(v.Stack)
	if err != nil {
		return nil, err
	}
	var able bool
	switch kind {
	case meta.JobFlatten, meta.JobCollapse:
		able = hasLayer(spec, "cow")
	case meta.JobRepair:
		able = hasLayer(spec, "mirror") || hasLayer(spec, "parity")
	case meta.JobScrub:
		able = hasLayer(spec, "checksum")
	default:
		return nil, errs.Invalid(errs.CodeInvalidRequest, "unknown job %q", kind)
	}
	if !able {
		return nil, notSupported(v, kind)
	}
	writer, err := s.writer(ctx, v.ID) // the job runs where the volume is written
	if err != nil {
		return nil, err
	}
	var out *meta.Volume
	record := func(tx *meta.Tx) error {
		if err := wl.check(tx); err != nil {
			return err
		}
		cur, err := tx.Volume(v.ID)
		if err != nil {
			return err
		}
		if cur == nil {
			return errs.NotFound("volume", ref)
		}
		if cur.Status != meta.StatusAvailable && cur.Status != meta.StatusInUse {
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is %s; only an available or in-use volume can %s", cur.ID, cur.Status, kind)
		}
		if cur.Job != nil {
			if cur.Job.Kind == meta.JobCollapse && kind != meta.JobCollapse {
				return errCollapsing
			}
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is already running a %s job", cur.ID, cur.Job.Kind)
		}
		if kind == meta.JobFlatten && len(cur.Snapshotting) > 0 {
			// A snapshot frozen but not recorded yet (its commit may
			// be stranded) is held by nothing but the volume's chain:
			// a flatten would cut it off, and the collection after it
			// remove the image the snapshot is then recorded with.
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is being snapshotted (%s); flatten it when the snapshot is available", cur.ID, cur.Snapshotting[0])
		}
		cur.Job = &meta.Job{Kind: kind, Node: writer, StartedAt: now()}
		if writer != s.cfg.Node {
			cur.Job.RequestedBy = s.cfg.Node
		}
		cur.UpdatedAt = now()
		tx.PutVolume(cur)
		out = cur
		return nil
	}
	err = s.pastCollapse(ctx, &v.ID, func() error { return s.meta.Update(ctx, record) })
	if err != nil {
		return nil, err
	}
	s.logFor("volume", v.ID).Info("job started", "job", kind, "on", writer)
	if writer == s.cfg.Node {
		s.startJob(out.ID)
	}
	return out, nil
}

// startJob runs a volume's recorded job in the background, unless it runs
// already. Stopping the service interrupts it; the record keeps the job,
// so Start runs it again.
func (s *Service) startJob(id string) {
	if !s.claim("job/" + id) {
		return
	}
	s.jobs.Add(1)
	go func() {
		defer s.jobs.Done()
		ended := s.runJob(s.ctx, id)
		s.unclaim("job/" + id)
		if !ended {
			return
		}
		// A job recorded for this node while this one was finishing (a
		// collapse proposed as soon as the slot was free) found the claim
		// taken, and was left to this goroutine: run it.
		if v, err := s.meta.Volume(s.ctx, id); err == nil && v != nil && v.Job != nil && v.Job.Node == s.cfg.Node && v.Status != meta.StatusCreating {
			s.startJob(id)
		}
	}()
}

// runJob runs volume id's recorded job here, and reports whether it ended
// with its outcome recorded (else it was handed over, interrupted, or its
// outcome could not be recorded).
func (s *Service) runJob(ctx context.Context, id string) bool {
	v, err := s.meta.Volume(ctx, id)
	if err != nil {
		s.logFor("volume", id).Error("job: cannot read record", "err", err)
		return false
	}
	if v.Job == nil {
		// It ended (or was handed on) between its start and this read:
		// nothing to run.
		s.logFor("volume", id).Debug("job: none recorded any more; not run")
		return false
	}
	// run is the job as the record names it now: its node is this one,
	// or one whose job this node resumes (Start) or adopted. Should the
	// record name another node later, that node adopted the job
	// (orphans.go) and records its outcome; should it hold a job of
	// another start, this run's was adopted and ended meanwhile and a new
	// one was asked for (sameRun): that one is not this run's to touch.
	run := *v.Job
	kind := run.Kind
	start := time.Now()
	var report any
	holder, token, err := s.useLease(ctx, id)
	switch {
	case err != nil:
	case holder != s.cfg.Node && kind == meta.JobCollapse:
		report = CollapseReport{Skipped: "the volume is written by node " + holder} // whose collector proposes it
	case holder != s.cfg.Node:
		if err = s.handJob(ctx, id, holder, &run); err == nil {
			return false
		}
	default:
		defer s.leases.unuse(context.Background(), id)
		// Taking the lease may have waited out a partition, during which
		// a node that found this one gone adopted the job (orphans.go) —
		// and finished it, and a new job may have been recorded for this
		// node since, whose start found this run's claim: the caller
		// looks again (true) and runs that one as it was asked for.
		if cur, err := s.meta.Volume(ctx, id); err != nil || !sameRun(cur.Job, &run) {
			s.logFor("volume", id).Info("job no longer this run's: not run", "err", err)
			return err == nil && cur.Job != nil && cur.Job.Node == s.cfg.Node
		}
		jctx, cancel := context.WithCancelCause(ctx)
		stop := s.leases.watchLoss(id, cancel)
		var l block.Layer
		var release func()
		l, release, err = s.acquireWriter(v, token)
		if err == nil {
			report, err = s.job(jctx, id, l, kind, s.progress(ctx, id, func(j *meta.Job) bool { return sameRun(j, &run) }))
			release()
		}
		stop()
		if cause := context.Cause(jctx); errors.Is(cause, errLeaseLost) {
			err = cause
		}
		cancel(nil)
	}
	if ctx.Err() != nil {
		return false // interrupted by shutdown: run again at next start
	}
	res := &meta.JobResult{Kind: kind, Report: report, Finished: now()}
	if err != nil {
		res.Error = err.Error()
	}
	uerr := s.meta.Update(context.Background(), func(tx *meta.Tx) error {
		cur, err := tx.Volume(id)
		if err != nil || cur == nil || !sameRun(cur.Job, &run) {
			return err // adopted by the node that took the lease over (adoptJob) or found this one gone
		}
		cur.Job, cur.UpdatedAt = nil, now()
		if kind != meta.JobCollapse || res.Error != "" {
			cur.LastJob = res // a collapse is housekeeping: only its failure is news
		}
		tx.PutVolume(cur)
		return nil
	})
	if uerr != nil {
		s.logFor("volume", id).Error("cannot record job outcome", "job", kind, "err", uerr)
	}
	log := s.logFor("volume", id).With("job", kind, "took", time.Since(start).String())
	if err != nil {
		log.Error("job failed", "err", err)
		return uerr == nil
	}
	log.Info("job done", "report", report)
	if kind == meta.JobFlatten {
		s.collectSoon()
	}
	return uerr == nil
}

// useLease takes volume id's write lease for a workflow that writes its
// stack here (leases.use: the holder and, held here, the token), waiting out a metadata cluster that cannot
// answer for now (a job resumed at start, a leader election) or a lease
// being handed over, up to a minute, rather than failing for good.
func (s *Service) useLease(ctx context.Context, id string) (string, int64, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		holder, token, err := s.leases.use(ctx, id)
		e, ok := errs.As(err)
		if err == nil || !ok || e.Kind != errs.KindUnavailable || time.Now().After(deadline) {
			return holder, token, err
		}
		select {
		case <-ctx.Done():
			return "", 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// stages makes one progress of the maintainers a job calls one after
// another (the top's stack, then each base image's): done counts across
// all of them, so it never goes back, and total grows by each one's own
// as it reports it.
type stages struct {
	p          block.Progress
	base, last int64 // done by the maintainers before; the current one's total
}

// next is the progress to hand the next maintainer.
func (s *stages) next() block.Progress {
	if s.p == nil {
		return nil
	}
	s.base += s.last
	s.last = 0
	return func(done, total int64) {
		s.last = total
		s.p(s.base+done, s.base+total)
	}
}

// handJob records volume id's job run, recorded for this node, for node
// holder, which took the volume's write lease meanwhile: only the holder
// writes the volume, and its watcher runs the job (delegated). Should the
// holder die before it ran it, the node that takes the lease over adopts
// it (adoptJob).
func (s *Service) handJob(ctx context.Context, id, holder string, run *meta.Job) error {
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Volume(id)
		if err != nil || cur == nil || !sameRun(cur.Job, run) {
			return err
		}
		cur.Job.Node, cur.Job.RequestedBy = holder, s.cfg.Node
		tx.PutVolume(cur)
		return nil
	})
	if err != nil {
		return fmt.Errorf("hand the job to node %s, which writes the volume now: %w", holder, err)
	}
	s.logFor("volume", id).Info("job handed to the volume's writer", "node", holder)
	return nil
}

// adoptJob makes volume vol's job, if one is recorded for another node,
// this node's and runs it: this node has just taken the volume's write
// lease over from that node, which can no longer write the volume (a job
// it still runs is fenced, and does not record its outcome over ours).
func (s *Service) adoptJob(ctx context.Context, vol string) {
	adopted := false
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		adopted = false
		cur, err := tx.Volume(vol)
		if err != nil || cur == nil || cur.Job == nil || cur.Job.Node == s.cfg.Node || cur.Status == meta.StatusCreating {
			return err
		}
		cur.Job.RequestedBy, cur.Job.Node = cur.Job.Node, s.cfg.Node
		tx.PutVolume(cur)
		adopted = true
		return nil
	})
	if err != nil {
		s.logFor("volume", vol).Error("cannot adopt the previous writer's job", "err", err)
		return
	}
	if adopted {
		s.logFor("volume", vol).Info("adopted the previous writer's job")
		s.startJob(vol)
	}
}

// job runs one job on volume vol's live stack l and returns its report.
func (s *Service) job(ctx context.Context, vol string, l block.Layer, kind string, p block.Progress) (any, error) {
	switch kind {
	case meta.JobCollapse:
		return s.collapseJob(ctx, vol, l, p)
	case meta.JobFlatten:
		c, ok := find[*cow.Layer](l)
		if !ok {
			return nil, fmt.Errorf("no cow layer")
		}
		return nil, c.Flatten(ctx, p)
	case meta.JobRepair:
		var err error
		n := 0
		st := &stages{p: p}
		var report *block.RepairReport
		// WalkMaintain: the bases of a cow chain (snapshots' and a
		// clone's source's images) have mirrors and parities too.
		werr := block.WalkMaintain(ctx, l, func(x block.Layer) bool {
			if r, ok := x.(block.Repairer); ok {
				n++
				err = r.Repair(ctx, st.next())
				if c, ok := x.(block.ResyncCounter); ok {
					if report == nil {
						report = &block.RepairReport{}
					}
					report.ResyncedBytes += c.TakeResynced()
				}
			}
			return err == nil
		})
		if err == nil {
			err = werr
		}
		if err == nil && n == 0 {
			err = fmt.Errorf("no mirror or parity layer")
		}
		if report == nil {
			return nil, err
		}
		return *report, err
	case meta.JobScrub:
		var total block.ScrubReport
		var err error
		n := 0
		st := &stages{p: p}
		werr := block.WalkMaintain(ctx, l, func(x block.Layer) bool {
			if sc, ok := x.(block.Scrubber); ok {
				n++
				var r block.ScrubReport
				r, err = sc.Scrub(ctx, st.next())
				total.Checked += r.Checked
				total.Bad += r.Bad
				total.Repaired += r.Repaired
			}
			return err == nil
		})
		if err == nil {
			err = werr
		}
		if err == nil && n == 0 {
			err = fmt.Errorf("no checksum layer")
		}
		return total, err
	}
	return nil, fmt.Errorf("unknown job %q", kind)
}

// progress persists the progress of volume id's job at most once per
// progressEvery, while ours says the record's job is the caller's.
func (s *Service) progress(ctx context.Context, id string, ours func(*meta.Job) bool) block.Progress {
	return throttled(func(done, total int64) {
		err := s.meta.Update(ctx, func(tx *meta.Tx) error {
			cur, err := tx.Volume(id)
			if err != nil || cur == nil || cur.Job == nil || !ours(cur.Job) {
				return err
			}
			cur.Job.Done, cur.Job.Total = done, total
			tx.PutVolume(cur)
			return nil
		})
		if err != nil && ctx.Err() == nil {
			s.log.Warn("cannot persist job progress", "err", err)
		}
	})
}
