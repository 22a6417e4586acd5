package volume

import (
	"context"
	"slices"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// CreateSnapshot starts a snapshot of a volume. Until the copy-on-write layer
// exists, the snapshot is a copy made by a job (a reflink where the file
// system can); the record is `creating` until the copy is complete.
func (s *Service) CreateSnapshot(ctx context.Context, c Caller, volumeRef, name, token string) (*meta.Snapshot, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := checkToken(token); err != nil {
		return nil, err
	}
	v, err := s.resolveVolume(ctx, c, volumeRef)
	if err != nil {
		return nil, err
	}
	limit, err := s.Limit()
	if err != nil {
		return nil, err
	}
	t := now()
	sn := &meta.Snapshot{
		ID: newID("snap-"), Name: name, Owner: v.Owner, OwnerID: v.OwnerID, VolumeID: v.ID, Status: meta.StatusCreating,
		ClientToken: token, CreatedAt: t, UpdatedAt: t, Node: s.cfg.Node,
	}
	if token != "" {
		sn.TokenParams = fingerprint(v.ID, name)
	}
	if token != "" {
		// A replay returns at once, even while its copy is running.
		var r *meta.Snapshot
		err := s.meta.Update(ctx, func(tx *meta.Tx) error {
			var err error
			if id := tx.TokenOwner(meta.NameSnapshot, sn.OwnerID, token); id != "" {
				r, err = tx.Snapshot(id)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		if r != nil {
			if r.TokenParams != sn.TokenParams {
				return nil, tokenMismatch(token, r.ID)
			}
			return r, nil
		}
	}
	if len(v.Snapshotting) > 0 {
		// Refuse rather than queue behind the gate: the running copy may
		// take minutes and this request would hang meanwhile.
		return nil, errs.Conflict(errs.CodeVolumeBusy, "volume %s is being snapshotted (%s); try again when that snapshot is available", v.ID, v.Snapshotting[0])
	}
	// Stop the volume's writers before the snapshot exists: writes
	// acknowledged after this call returns must not reach the snapshot. The
	// job releases the gate when its copy is complete.
	gate := s.Gate(v.ID)
	gate.Lock()
	handedOver := false
	defer func() {
		if !handedOver {
			gate.Unlock()
		}
	}()
	var replay *meta.Snapshot
	err = s.meta.Update(ctx, func(tx *meta.Tx) error {
		replay = nil
		if id := tx.TokenOwner(meta.NameSnapshot, sn.OwnerID, token); id != "" {
			r, err := tx.Snapshot(id)
			if err != nil {
				return err
			}
			if r != nil {
				if r.TokenParams != sn.TokenParams {
					return tokenMismatch(token, r.ID)
				}
				replay = r
				return nil
			}
		}
		cur, err := tx.Volume(v.ID)
		if err != nil {
			return err
		}
		if cur == nil {
			return errs.NotFound("volume", volumeRef)
		}
		if cur.Status != meta.StatusAvailable && cur.Status != meta.StatusInUse {
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is %s; only an available or in-use volume can be snapshotted", cur.ID, cur.Status)
		}
		if len(cur.Snapshotting) > 0 {
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is being snapshotted (%s); try again when that snapshot is available", cur.ID, cur.Snapshotting[0])
		}
		if err := tx.ClaimName(meta.NameSnapshot, sn.OwnerID, sn.Name, sn.ID); err != nil {
			return err
		}
		if err := tx.Provision(cur.SizeBytes, limit); err != nil {
			return err
		}
		sn.SizeBytes = cur.SizeBytes
		sn.Job = &meta.Job{Kind: meta.JobSnapshot, Node: s.cfg.Node, Source: cur.ID, Total: cur.SizeBytes, StartedAt: t}
		cur.Snapshotting = append(cur.Snapshotting, sn.ID)
		tx.PutVolume(cur)
		tx.PutToken(meta.NameSnapshot, sn.OwnerID, token, sn.ID)
		tx.PutSnapshot(sn)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if replay != nil {
		return replay, nil
	}
	s.logFor("snapshot", sn.ID).Info("snapshot create", "volume", v.ID, "size", sn.SizeBytes)
	handedOver = true
	s.startJob(sn.ID, meta.JobSnapshot, gate)
	return sn, nil
}

// Snapshot returns a snapshot the caller may see, by id or name.
func (s *Service) Snapshot(ctx context.Context, c Caller, ref string) (*meta.Snapshot, error) {
	return s.resolveSnapshot(ctx, c, ref)
}

func (s *Service) resolveSnapshot(ctx context.Context, c Caller, ref string) (*meta.Snapshot, error) {
	id := ref
	if !snapshotIDRE.MatchString(ref) {
		var err error
		if id, err = s.meta.LookupName(ctx, meta.NameSnapshot, c.ID, ref); err != nil {
			return nil, err
		}
		if id == "" {
			return nil, errs.NotFound("snapshot", ref)
		}
	}
	return fetchVisible(c, "snapshot", ref, func() (*meta.Snapshot, error) { return s.meta.Snapshot(ctx, id) })
}

// Snapshots lists the snapshots the caller may see, optionally of one volume.
func (s *Service) Snapshots(ctx context.Context, c Caller, volumeRef string) ([]*meta.Snapshot, error) {
	volID, err := s.volumeFilter(ctx, c, volumeRef)
	if err != nil {
		return nil, err
	}
	all, err := s.meta.Snapshots(ctx)
	if err != nil {
		return nil, err
	}
	return visible(c, all, func(sn *meta.Snapshot) bool { return volID == "" || sn.VolumeID == volID }), nil
}

// DeleteSnapshot deletes a snapshot that no clone is being made from.
func (s *Service) DeleteSnapshot(ctx context.Context, c Caller, ref string) error {
	sn, err := s.resolveSnapshot(ctx, c, ref)
	if err != nil {
		return err
	}
	err = s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Snapshot(sn.ID)
		if err != nil {
			return err
		}
		if cur == nil {
			return errs.NotFound("snapshot", ref)
		}
		switch cur.Status {
		case meta.StatusAvailable, meta.StatusError:
		case meta.StatusDeleting:
			return nil
		default:
			return errs.Conflict(errs.CodeSnapshotNotReady, "snapshot %s is %s; delete it when that finishes", cur.ID, cur.Status)
		}
		if len(cur.Cloning) > 0 {
			return errs.Conflict(errs.CodeSnapshotInUse, "volume %s is being created from snapshot %s; delete it when that finishes", cur.Cloning[0], cur.ID)
		}
		tx.ReleaseName(meta.NameSnapshot, cur.OwnerID, cur.Name, cur.ID)
		tx.DeleteToken(meta.NameSnapshot, cur.OwnerID, cur.ClientToken)
		cur.Status, cur.Node, cur.UpdatedAt = meta.StatusDeleting, s.cfg.Node, now()
		tx.PutSnapshot(cur)
		return nil
	})
	if err != nil {
		return err
	}
	return s.finishDeleteSnapshot(ctx, sn.ID)
}

func (s *Service) finishDeleteSnapshot(ctx context.Context, id string) error {
	path := s.store.SnapshotPath(id)
	if err := s.store.Remove(path); err != nil {
		return s.failSnapshot(ctx, id, err)
	}
	if err := s.store.Remove(s.store.TempPath(path)); err != nil {
		return err
	}
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		sn, err := tx.Snapshot(id)
		if err != nil || sn == nil {
			return err
		}
		tx.DeleteSnapshot(id)
		return tx.Provision(-sn.SizeBytes, 0)
	})
	if err == nil {
		s.logFor("snapshot", id).Info("snapshot deleted")
	}
	return err
}

// failSnapshot records a snapshot workflow failure and returns cause.
func (s *Service) failSnapshot(ctx context.Context, id string, cause error) error {
	s.logFor("snapshot", id).Error("snapshot workflow failed", "err", cause)
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		sn, err := tx.Snapshot(id)
		if err != nil || sn == nil {
			return err
		}
		if err := dropFromVolume(tx, sn.VolumeID, id); err != nil {
			return err
		}
		sn.Status, sn.StatusMessage, sn.Job, sn.Node, sn.UpdatedAt = meta.StatusError, cause.Error(), nil, "", now()
		tx.PutSnapshot(sn)
		return nil
	})
	if err != nil {
		s.logFor("snapshot", id).Error("cannot record failure", "err", err)
	}
	return cause
}

func dropFromVolume(tx *meta.Tx, volID, snapID string) error {
	v, err := tx.Volume(volID)
	if err != nil || v == nil {
		return err
	}
	v.Snapshotting = slices.DeleteFunc(v.Snapshotting, func(x string) bool { return x == snapID })
	tx.PutVolume(v)
	return nil
}
