package volume

import (
	"context"
	"fmt"

	"github.com/basalt-storage/basalt/internal/meta"
)

// Start resumes this node's interrupted workflows: every record left in a
// transitional status is driven to available or error. Call once, before
// serving requests.
func (s *Service) Start(ctx context.Context) error {
	vols, err := s.meta.Volumes(ctx)
	if err != nil {
		return fmt.Errorf("recover volumes: %w", err)
	}
	for _, v := range vols {
		if !s.mine(v.Node) {
			continue
		}
		var err error
		switch v.Status {
		case meta.StatusCreating:
			if v.Job != nil {
				err = s.resumeVolumeJob(ctx, v.ID)
			} else {
				_, err = s.finishCreate(ctx, v.ID)
			}
		case meta.StatusExtending:
			_, err = s.finishExtend(ctx, v.ID)
		case meta.StatusDeleting:
			err = s.finishDeleteVolume(ctx, v.ID)
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
		if !s.mine(sn.Node) {
			continue
		}
		var err error
		switch sn.Status {
		case meta.StatusCreating:
			err = s.resumeSnapshotJob(ctx, sn.ID)
		case meta.StatusDeleting:
			err = s.finishDeleteSnapshot(ctx, sn.ID)
		default:
			continue
		}
		s.logFor("snapshot", sn.ID).Info("recovered interrupted workflow", "status", sn.Status, "err", err)
	}
	return nil
}

func (s *Service) mine(node string) bool { return s.cfg.AdoptAll || node == s.cfg.Node }

// resumeVolumeJob counts an attempt and restarts the clone, or fails the
// record once it has been interrupted maxJobAttempts times.
func (s *Service) resumeVolumeJob(ctx context.Context, id string) error {
	var giveUp bool
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		v, err := tx.Volume(id)
		if err != nil || v == nil || v.Job == nil {
			return err
		}
		v.Job.Attempts++
		v.Job.DoneBytes = 0
		v.Job.Node, v.Node = s.cfg.Node, s.cfg.Node
		giveUp = v.Job.Attempts > maxJobAttempts
		tx.PutVolume(v)
		return nil
	})
	if err != nil {
		return err
	}
	if giveUp {
		return s.failVolume(ctx, id, fmt.Errorf("clone interrupted %d times; giving up", maxJobAttempts+1))
	}
	s.startJob(id, meta.JobClone, nil)
	return nil
}

func (s *Service) resumeSnapshotJob(ctx context.Context, id string) error {
	var giveUp bool
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		sn, err := tx.Snapshot(id)
		if err != nil || sn == nil || sn.Job == nil {
			return err
		}
		sn.Job.Attempts++
		sn.Job.DoneBytes = 0
		sn.Job.Node, sn.Node = s.cfg.Node, s.cfg.Node
		giveUp = sn.Job.Attempts > maxJobAttempts
		tx.PutSnapshot(sn)
		return nil
	})
	if err != nil {
		return err
	}
	if giveUp {
		return s.failSnapshot(ctx, id, fmt.Errorf("snapshot copy interrupted %d times; giving up", maxJobAttempts+1))
	}
	var volID string
	if sn, err := s.meta.Snapshot(ctx, id); err == nil && sn.Job != nil {
		volID = sn.Job.Source
	}
	gate := s.Gate(volID)
	gate.Lock() // Start runs before anything serves, so this does not wait
	s.startJob(id, meta.JobSnapshot, gate)
	return nil
}
