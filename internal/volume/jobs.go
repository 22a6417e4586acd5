package volume

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/store"
)

// progressEvery is how often a running job persists its progress.
const progressEvery = time.Second

// startJob runs a record's job in the background. The job stops when the
// service stops; its record keeps the job so that Start resumes it. A
// snapshot job receives its volume's write gate, locked, and unlocks it when
// the copy ends.
func (s *Service) startJob(id, kind string, gate *sync.RWMutex) {
	s.jobs.Add(1)
	go func() {
		defer s.jobs.Done()
		switch kind {
		case meta.JobSnapshot:
			defer gate.Unlock()
			s.runSnapshotJob(s.ctx, id)
		case meta.JobClone:
			s.runCloneJob(s.ctx, id)
		}
	}()
}

// progress returns a Copy progress callback that persists progress through
// save at most once per progressEvery.
func (s *Service) progress(ctx context.Context, save func(tx *meta.Tx, done int64) error) func(done, total int64) {
	last := time.Now()
	return func(done, total int64) {
		if time.Since(last) < progressEvery || done == total {
			return
		}
		last = time.Now()
		if err := s.meta.Update(ctx, func(tx *meta.Tx) error { return save(tx, done) }); err != nil && ctx.Err() == nil {
			s.log.Warn("cannot persist job progress", "err", err)
		}
	}
}

func (s *Service) runSnapshotJob(ctx context.Context, id string) {
	sn, err := s.meta.Snapshot(ctx, id)
	if err != nil {
		s.log.Error("snapshot job: cannot read record", "snapshot", id, "err", err)
		return
	}
	if sn.Job == nil {
		s.failSnapshot(context.Background(), id, fmt.Errorf("snapshot record has no copy job"))
		return
	}
	start := time.Now()
	err = s.store.Copy(ctx, s.store.VolumePath(sn.Job.Source), s.store.SnapshotPath(id), store.CopyOptions{
		BytesPerSecond: s.cfg.JobBandwidth,
		Progress: s.progress(ctx, func(tx *meta.Tx, done int64) error {
			cur, err := tx.Snapshot(id)
			if err != nil || cur == nil || cur.Job == nil {
				return err
			}
			cur.Job.DoneBytes = done
			tx.PutSnapshot(cur)
			return nil
		}),
	})
	if ctx.Err() != nil {
		return // interrupted by shutdown: resumed at next start
	}
	if err != nil {
		s.failSnapshot(context.Background(), id, fmt.Errorf("copy volume %s: %w", sn.Job.Source, err))
		return
	}
	err = s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Snapshot(id)
		if err != nil || cur == nil {
			return err
		}
		if err := dropFromVolume(tx, cur.VolumeID, id); err != nil {
			return err
		}
		cur.Status, cur.Job, cur.Node, cur.UpdatedAt = meta.StatusAvailable, nil, "", now()
		tx.PutSnapshot(cur)
		return nil
	})
	if err != nil {
		s.failSnapshot(context.Background(), id, err)
		return
	}
	s.logFor("snapshot", id).Info("snapshot available", "took", time.Since(start).String())
}

func (s *Service) runCloneJob(ctx context.Context, id string) {
	v, err := s.meta.Volume(ctx, id)
	if err != nil {
		s.log.Error("clone job: cannot read record", "volume", id, "err", err)
		return
	}
	if v.Job == nil {
		s.failVolume(context.Background(), id, fmt.Errorf("volume record has no clone job"))
		return
	}
	start := time.Now()
	dst := s.store.VolumePath(id)
	err = s.store.Copy(ctx, s.store.SnapshotPath(v.Job.Source), dst, store.CopyOptions{
		BytesPerSecond: s.cfg.JobBandwidth,
		Progress: s.progress(ctx, func(tx *meta.Tx, done int64) error {
			cur, err := tx.Volume(id)
			if err != nil || cur == nil || cur.Job == nil {
				return err
			}
			cur.Job.DoneBytes = done
			tx.PutVolume(cur)
			return nil
		}),
	})
	if ctx.Err() != nil {
		return
	}
	if err == nil && v.SizeBytes > v.Job.Total {
		err = s.store.Resize(dst, v.SizeBytes)
	}
	if err != nil {
		s.failVolume(context.Background(), id, fmt.Errorf("copy snapshot %s: %w", v.Job.Source, err))
		return
	}
	err = s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Volume(id)
		if err != nil || cur == nil {
			return err
		}
		if err := dropFromSnapshot(tx, cur.Job.Source, id); err != nil {
			return err
		}
		cur.Status, cur.Job, cur.Node, cur.UpdatedAt = resting(cur), nil, "", now()
		tx.PutVolume(cur)
		return nil
	})
	if err != nil {
		s.failVolume(context.Background(), id, err)
		return
	}
	s.logFor("volume", id).Info("volume available", "from", v.SourceSnapshot, "took", time.Since(start).String())
}
