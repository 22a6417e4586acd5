package volume

// Stranded workflows. A workflow recorded for this node is driven by the
// call that recorded it, by this node's watcher when another node handed
// it over (delegate.go), by an adoption (orphans.go), or by Start after a
// restart. A call that fails after its record was committed leaves the
// workflow to nobody until the node restarts — and the record meanwhile
// refuses every other workflow on the volume. That happens when etcd
// answers a commit with an unknown outcome (it timed out, or its leader
// changed, after the proposal was made: the call reports an error, the
// record is there), and when a later commit of the workflow (marking it
// done or failed) fails the same way.
//
// So each orphan sweep also resumes this node's records that have been in
// a transition for longer than strandedAfter and that no driver of this
// process claims. Every driver claims its workflow (delegate.go's claim)
// before the commit that records it, or as it starts one already recorded;
// the age keeps a sweep away from a record made a moment ago that its
// driver (a watcher reacting to it) has not claimed yet.
//
// A stranded workflow is resumed as Start resumes it, with one exception:
// a snapshot this node has not frozen yet fails instead of being frozen.
// The node has served the volume since the snapshot was asked for, so a
// freeze now would hold writes made after it. One frozen already (only the
// commit after the freeze failed) is finished: its freeze was exact.

import (
	"context"
	"errors"
	"time"

	"github.com/basalt-storage/basalt/internal/block/cow"
	"github.com/basalt-storage/basalt/internal/meta"
)

// strandedAfter is how long a record stays in a transition, driven by
// nobody here, before a sweep resumes it.
var strandedAfter = time.Minute

// errNotFrozen is why a stranded snapshot that was never frozen fails.
var errNotFrozen = errors.New("the request that took this snapshot failed after recording it and before the volume was frozen " +
	"(the metadata cluster did not confirm the record in time); the volume has been served since, so a freeze now " +
	"would hold writes made after the snapshot was asked for: delete it and take it again")

// resumeStranded resumes this node's stranded workflows.
func (s *Service) resumeStranded(ctx context.Context) {
	vols, err := s.meta.Volumes(ctx)
	if err != nil {
		s.log.Warn("stranded workflows: cannot list volumes", "err", err)
		return
	}
	snaps, err := s.meta.Snapshots(ctx)
	if err != nil {
		s.log.Warn("stranded workflows: cannot list snapshots", "err", err)
		return
	}
	stranded := func(node string, since time.Time, key string) bool {
		return s.mine(node) && time.Since(since) > strandedAfter && !s.claimed(key)
	}
	// Snapshots first, as at Start: one under way on a volume with a job
	// is settled before the job can change the chain under it.
	for _, sn := range snaps {
		if !stranded(sn.Node, sn.UpdatedAt, "snapshot/"+sn.ID) {
			continue
		}
		switch sn.Status {
		case meta.StatusCreating:
			s.logFor("snapshot", sn.ID).Warn("resuming a stranded snapshot", "status", sn.Status, "since", sn.UpdatedAt)
			s.background(func() { s.settleSnapshot(s.ctx, sn) })
		case meta.StatusDeleting:
			s.logFor("snapshot", sn.ID).Warn("resuming a stranded snapshot", "status", sn.Status, "since", sn.UpdatedAt)
			s.background(func() {
				if !s.claim("snapshot/" + sn.ID) {
					return
				}
				defer s.unclaim("snapshot/" + sn.ID)
				if err := s.finishDeleteSnapshot(s.ctx, sn.ID); err != nil && s.ctx.Err() == nil {
					s.logFor("snapshot", sn.ID).Error("stranded delete failed", "err", err)
				}
			})
		}
	}
	for _, v := range vols {
		if v.Status == meta.StatusExtending && stranded(v.Node, v.UpdatedAt, "extend/"+v.ID) {
			s.logFor("volume", v.ID).Warn("resuming a stranded extend", "since", v.UpdatedAt)
			s.background(func() {
				if _, err := s.runExtend(s.ctx, v.ID); err != nil && s.ctx.Err() == nil {
					s.logFor("volume", v.ID).Error("stranded extend failed", "err", err)
				}
			})
		}
	}
	// Jobs, imports and exports claim as they start: starting one that
	// runs already does nothing, so these need no age.
	for _, sn := range snaps {
		if sn.Job != nil && sn.Status == meta.StatusAvailable && s.mine(sn.Job.Node) {
			s.startExport(sn.ID)
		}
	}
	for _, v := range vols {
		switch {
		case v.Status == meta.StatusCreating && s.mine(v.Node):
			s.startImport(v.ID)
		case v.Job != nil && v.Status != meta.StatusCreating && s.mine(v.Job.Node):
			s.startJob(v.ID)
		}
	}
}

// claimed reports whether a driver of this process claims workflow key.
func (s *Service) claimed(key string) bool {
	_, ok := s.claims.Load(key)
	return ok
}

// settleSnapshot ends the creation of snapshot sn, stranded: finished if
// this node froze the volume for it already, else failed (errNotFrozen).
func (s *Service) settleSnapshot(ctx context.Context, sn *meta.Snapshot) {
	s.asSnapshotWriter(ctx, sn, func(token int64) {
		frozen, err := s.frozenFor(ctx, sn, token)
		switch {
		case err != nil:
			s.failSnapshot(ctx, sn.ID, sn.Node, err)
		case !frozen:
			s.failSnapshot(ctx, sn.ID, sn.Node, errNotFrozen)
		default:
			if _, err := s.finishSnapshot(ctx, sn.ID, sn.Node, token); err != nil && s.ctx.Err() == nil {
				s.logFor("snapshot", sn.ID).Error("stranded snapshot failed", "err", err)
			}
		}
	})
}

// frozenFor reports whether the volume's cow layer has frozen its top for
// snapshot sn (its tag is the snapshot's id), as the writer holding the
// volume's lease with token.
func (s *Service) frozenFor(ctx context.Context, sn *meta.Snapshot, token int64) (bool, error) {
	v, err := s.meta.Volume(ctx, sn.VolumeID)
	if err != nil {
		return false, err
	}
	l, release, err := s.acquireWriter(v, token)
	if err != nil {
		return false, err
	}
	defer release()
	c, ok := find[*cow.Layer](l)
	return ok && c.FrozenFor(sn.ID), nil
}
