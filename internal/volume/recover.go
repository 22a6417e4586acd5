package volume

import (
	"context"
	"fmt"

	"github.com/basalt-storage/basalt/internal/meta"
)

// Start resumes this node's interrupted workflows: every record left in a
// transitional status is driven to available or error, and recorded jobs
// run again; the collection it asks for removes the stacks of volume
// creates and deletes that were interrupted (they have no record). With
// AdoptOrphans it then adopts those of nodes that are gone, and goes on
// watching for them (orphans.go). Call once, before serving requests.
func (s *Service) Start(ctx context.Context) error {
	s.leases.renew(ctx) // a lease before the first attachment opens
	// The watch for workflows delegated to this node starts at or before
	// the lists below: a record handed here between the two is seen by
	// one of them at least (by both, at worst: claims keep a workflow
	// from running twice at once, and each finishes only once).
	from, err := s.meta.Revision(ctx)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	s.jobs.Add(2)
	go func() {
		defer s.jobs.Done()
		s.leases.run(s.ctx)
	}()
	go func() {
		defer s.jobs.Done()
		s.delegated(s.ctx, from+1)
	}()
	vols, err := s.meta.Volumes(ctx)
	if err != nil {
		return fmt.Errorf("recover volumes: %w", err)
	}
	for _, v := range vols {
		if !s.atStart(v.Node) {
			continue
		}
		var err error
		switch v.Status {
		case meta.StatusCreating: // only imports have a record while creating
			s.startImport(v.ID) // long: in the background, as at create
			continue
		case meta.StatusExtending:
			if !s.claim("extend/" + v.ID) {
				continue // the delegation watch runs it
			}
			_, err = s.finishExtend(ctx, v.ID)
			s.unclaim("extend/" + v.ID)
		default:
			continue
		}
		s.logFor("volume", v.ID).Info("recovered interrupted workflow", "status", v.Status, "err", err)
	}
	snaps, err := s.meta.Snapshots(ctx)
	if err != nil {
		return fmt.Errorf("recover snapshots: %w", err)
	}
	for _, sn := range snaps {
		if !s.atStart(sn.Node) {
			continue
		}
		var err error
		switch sn.Status {
		case meta.StatusCreating:
			// Nothing serves here yet, so the volume has had no writes
			// through this node since the interruption: the freeze, done
			// now, is still exact — unless another node took the volume
			// for writing meanwhile, and then the snapshot fails.
			if !s.claim("snapshot/" + sn.ID) {
				continue // the delegation watch takes it
			}
			var done func()
			var token int64
			if done, token, err = s.asWriter(ctx, sn.VolumeID); err == nil {
				_, err = s.finishSnapshot(ctx, sn.ID, sn.Node, token)
				done()
			} else {
				s.failSnapshot(ctx, sn.ID, sn.Node, err)
			}
			s.unclaim("snapshot/" + sn.ID)
		case meta.StatusDeleting:
			err = s.finishDeleteSnapshot(ctx, sn.ID)
		default:
			continue
		}
		s.logFor("snapshot", sn.ID).Info("recovered interrupted workflow", "status", sn.Status, "err", err)
	}
	// Jobs last: a snapshot interrupted on a volume with a flatten job
	// is finished before the flatten can change the chain under it.
	for _, sn := range snaps {
		if sn.Job != nil && sn.Status == meta.StatusAvailable && s.atStart(sn.Job.Node) {
			s.logFor("snapshot", sn.ID).Info("resuming export", "to", sn.Job.Object)
			s.startExport(sn.ID)
		}
	}
	for _, v := range vols {
		if v.Job != nil && v.Status != meta.StatusCreating && s.atStart(v.Job.Node) {
			s.logFor("volume", v.ID).Info("resuming job", "job", v.Job.Kind)
			s.startJob(v.ID)
		}
	}
	s.collectSoon() // what an earlier run of this node left asked for
	if s.cfg.AdoptOrphans {
		s.background(func() { s.watchOrphans(s.ctx) })
	}
	return nil
}

// mine reports whether node, a workflow's, is this one: only it runs the
// workflow (another adopts it only once this one is gone: orphans.go).
func (s *Service) mine(node string) bool { return node == s.cfg.Node }

// atStart reports whether Start resumes a workflow of node's: this
// node's, and in a cluster of one member (AdoptAll) everyone's — decided
// when the service starts, so only then: nodes may join right after.
func (s *Service) atStart(node string) bool { return s.cfg.AdoptAll || s.mine(node) }
