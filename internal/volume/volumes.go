package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/lock"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/size"
)

// CreateVolume is a validated create request.
type CreateVolume struct {
	Name         string
	SizeBytes    int64 // 0 with FromSnapshot: the snapshot's size
	Type         string
	FromSnapshot string // id or name
	FromObject   string // s3://BUCKET/KEY: a raw image (bridge.go)
	Multiattach  bool
	ClientToken  string
}

// CreateVolume creates a volume: empty, or with FromSnapshot a clone of a
// snapshot — both O(1) (a new copy-on-write image), so synchronous — or
// with FromObject filled from an object, which takes time: the volume is
// returned creating, with an import job, and becomes available when done.
func (s *Service) CreateVolume(ctx context.Context, c Caller, req CreateVolume) (*meta.Volume, error) {
	if err := checkName(req.Name); err != nil {
		return nil, err
	}
	if err := checkToken(req.ClientToken); err != nil {
		return nil, err
	}
	if req.FromSnapshot != "" && req.FromObject != "" {
		return nil, errs.Invalid(errs.CodeInvalidRequest, "from_snapshot and from_object exclude each other")
	}
	if req.SizeBytes < 0 || (req.SizeBytes == 0 && req.FromSnapshot == "" && req.FromObject == "") {
		return nil, errs.Invalid(errs.CodeInvalidSize, "size must be greater than zero")
	}
	if req.SizeBytes > size.Max {
		return nil, errs.Invalid(errs.CodeInvalidSize, "size %d exceeds the maximum of 1 EiB", req.SizeBytes)
	}
	if req.SizeBytes%512 != 0 {
		return nil, errs.Invalid(errs.CodeInvalidSize, "size %d is not a multiple of 512 bytes", req.SizeBytes)
	}
	var src *meta.Snapshot
	var stack json.RawMessage
	if req.FromSnapshot != "" {
		var unlock func()
		var err error
		if src, unlock, err = s.lockedSnapshot(ctx, c, req.FromSnapshot, lock.Read); err != nil {
			return nil, err
		}
		defer unlock()
		if req.SizeBytes == 0 {
			req.SizeBytes = src.SizeBytes
		}
		if req.SizeBytes < src.SizeBytes {
			return nil, errs.Invalid(errs.CodeInvalidSize, "size %d is smaller than snapshot %s (%d bytes)", req.SizeBytes, src.ID, src.SizeBytes)
		}
		// A clone reads its snapshot's images, so it has the source's stack.
		if req.Type != "" && req.Type != src.Type {
			return nil, errs.Invalid(errs.CodeInvalidRequest, "a clone of snapshot %s has its volume's type %q, not %q", src.ID, src.Type, req.Type)
		}
		req.Type, stack = src.Type, src.Stack
	} else {
		if req.FromObject != "" {
			var err error
			if req.SizeBytes, err = s.checkImport(ctx, c, req.FromObject, req.SizeBytes); err != nil {
				return nil, err
			}
		}
		if req.Type == "" {
			req.Type = DefaultType
		}
		t, err := s.VolumeType(ctx, req.Type)
		if err != nil {
			return nil, err
		}
		stack = t.Stack
	}
	limit, err := s.Limit()
	if err != nil {
		return nil, err
	}
	t := now()
	v := &meta.Volume{
		ID: newID("vol-"), Name: req.Name, Owner: c.Name, OwnerID: c.ID, SizeBytes: req.SizeBytes,
		Status: meta.StatusCreating, Type: req.Type, Stack: stack, Multiattach: req.Multiattach,
		ClientToken: req.ClientToken, CreatedAt: t, UpdatedAt: t, Node: s.cfg.Node,
	}
	if req.ClientToken != "" {
		v.TokenParams = fingerprint(req.Name, req.SizeBytes, req.Type, req.FromSnapshot, req.Multiattach, req.FromObject)
	}
	if src != nil {
		v.SourceSnapshot = src.ID
	}
	if req.FromObject != "" {
		v.SourceObject = req.FromObject
		v.Job = &meta.Job{Kind: meta.JobImport, Node: s.cfg.Node, StartedAt: t, Object: req.FromObject}
	}
	var replay *meta.Volume
	err = s.meta.Update(ctx, func(tx *meta.Tx) error {
		replay = nil
		if id := tx.TokenOwner(meta.NameVolume, c.ID, req.ClientToken); id != "" {
			r, err := tx.Volume(id)
			if err != nil {
				return err
			}
			if r != nil {
				if r.TokenParams != v.TokenParams {
					return tokenMismatch(req.ClientToken, r.ID)
				}
				replay = r
				return nil
			}
		}
		if err := tx.ClaimName(meta.NameVolume, v.OwnerID, v.Name, v.ID); err != nil {
			return err
		}
		if src != nil {
			// Held until the clone exists: the snapshot (and so its
			// image) cannot be deleted meanwhile.
			sn, err := tx.Snapshot(src.ID)
			if err != nil {
				return err
			}
			if sn == nil || sn.Status != meta.StatusAvailable {
				return errs.Conflict(errs.CodeSnapshotNotReady, "snapshot %s is not available", src.ID)
			}
			sn.Cloning = append(sn.Cloning, v.ID)
			tx.PutSnapshot(sn)
		}
		if err := tx.Provision(v.SizeBytes, limit); err != nil {
			return err
		}
		tx.PutToken(meta.NameVolume, c.ID, req.ClientToken, v.ID)
		tx.PutVolume(v)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if replay != nil {
		return replay, nil
	}
	s.logFor("volume", v.ID).Info("volume create", "owner", v.Owner, "size", v.SizeBytes, "type", v.Type,
		"from", v.SourceSnapshot, "from_object", v.SourceObject)
	if v.SourceObject != "" {
		s.startImport(v.ID)
		return v, nil
	}
	return s.finishCreate(ctx, v)
}

// finishCreate builds the stack of v, a volume record read in status
// creating (on its snapshot's image for a clone; filled from its object for
// an import), and marks the volume available.
func (s *Service) finishCreate(ctx context.Context, v *meta.Volume) (*meta.Volume, error) {
	id := v.ID
	var base string
	if v.SourceSnapshot != "" {
		sn, err := s.meta.Snapshot(ctx, v.SourceSnapshot)
		if err != nil {
			return nil, s.failVolume(ctx, id, fmt.Errorf("snapshot %s: %w", v.SourceSnapshot, err))
		}
		base = sn.Image
	}
	start := time.Now()
	s.gcMu.RLock()
	err := s.createStack(v, base)
	s.gcMu.RUnlock()
	if err != nil {
		return nil, s.failVolume(ctx, id, err)
	}
	var imported *meta.JobResult
	if v.SourceObject != "" {
		rep, err := s.importObject(ctx, v)
		if ctx.Err() != nil {
			return nil, ctx.Err() // shutdown: Start imports again
		}
		if err != nil {
			return nil, s.failVolume(ctx, id, fmt.Errorf("import %s: %w", v.SourceObject, err))
		}
		imported = &meta.JobResult{Kind: meta.JobImport, Report: rep, Finished: now()}
	}
	out, err := s.transitionVolume(ctx, id, meta.StatusCreating, func(v *meta.Volume) {
		v.Status = resting(v)
		if imported != nil {
			v.Job, v.LastJob = nil, imported
		}
	}, func(tx *meta.Tx, v *meta.Volume) error {
		return dropFromSnapshot(tx, v.SourceSnapshot, v.ID)
	})
	if err == nil {
		s.logFor("volume", id).Info("volume available", "from", v.SourceSnapshot, "took", time.Since(start).String())
	}
	return out, err
}

// transitionVolume applies fn to a volume that is still in status from,
// and runs also (if any) in the same transaction.
func (s *Service) transitionVolume(ctx context.Context, id, from string, fn func(*meta.Volume), also ...func(*meta.Tx, *meta.Volume) error) (*meta.Volume, error) {
	var out *meta.Volume
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		v, err := tx.Volume(id)
		if err != nil {
			return err
		}
		if v == nil {
			return errs.NotFound("volume", id)
		}
		if v.Status != from {
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is %s, expected %s", id, v.Status, from)
		}
		v.StatusMessage = "" // a message describes the last failure; this transition succeeded
		fn(v)
		for _, f := range also {
			if err := f(tx, v); err != nil {
				return err
			}
		}
		v.Node = ""
		v.UpdatedAt = now()
		tx.PutVolume(v)
		out = v
		return nil
	})
	return out, err
}

// failVolume records a workflow failure on the record and returns cause.
func (s *Service) failVolume(ctx context.Context, id string, cause error) error {
	s.logFor("volume", id).Error("volume workflow failed", "err", cause)
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		v, err := tx.Volume(id)
		if err != nil || v == nil {
			return err
		}
		if v.Status == meta.StatusCreating {
			if err := dropFromSnapshot(tx, v.SourceSnapshot, id); err != nil {
				return err
			}
			if v.Job != nil && v.Job.Kind == meta.JobImport {
				v.Job, v.LastJob = nil, &meta.JobResult{Kind: meta.JobImport, Error: cause.Error(), Finished: now()}
			}
		}
		v.Status, v.StatusMessage, v.Node, v.UpdatedAt = meta.StatusError, cause.Error(), "", now()
		tx.PutVolume(v)
		return nil
	})
	if err != nil {
		s.logFor("volume", id).Error("cannot record failure", "err", err)
	}
	return cause
}

func dropFromSnapshot(tx *meta.Tx, snapID, volID string) error {
	if snapID == "" {
		return nil
	}
	sn, err := tx.Snapshot(snapID)
	if err != nil || sn == nil {
		return err
	}
	sn.Cloning = slices.DeleteFunc(sn.Cloning, func(x string) bool { return x == volID })
	tx.PutSnapshot(sn)
	return nil
}

// Volume returns a volume the caller may see, by id or name.
func (s *Service) Volume(ctx context.Context, c Caller, ref string) (*meta.Volume, error) {
	return s.resolveVolume(ctx, c, ref)
}

func (s *Service) resolveVolume(ctx context.Context, c Caller, ref string) (*meta.Volume, error) {
	id := ref
	if !volumeIDRE.MatchString(ref) {
		var err error
		if id, err = s.meta.LookupName(ctx, meta.NameVolume, c.ID, ref); err != nil {
			return nil, err
		}
		if id == "" {
			return nil, errs.NotFound("volume", ref)
		}
	}
	return fetchVisible(c, "volume", ref, func() (*meta.Volume, error) { return s.meta.Volume(ctx, id) })
}

// Volumes lists the volumes the caller may see, oldest first.
func (s *Service) Volumes(ctx context.Context, c Caller) ([]*meta.Volume, error) {
	all, err := s.meta.Volumes(ctx)
	if err != nil {
		return nil, err
	}
	return visible(c, all, nil), nil
}

// ExtendVolume grows a volume to newSize bytes.
func (s *Service) ExtendVolume(ctx context.Context, c Caller, ref string, newSize int64) (*meta.Volume, error) {
	v, unlock, err := s.lockedVolume(ctx, c, ref, lock.Write)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if newSize <= 0 || newSize > size.Max || newSize%512 != 0 {
		return nil, errs.Invalid(errs.CodeInvalidSize, "size %d must be a positive multiple of 512 bytes, at most 1 EiB", newSize)
	}
	limit, err := s.Limit()
	if err != nil {
		return nil, err
	}
	writer, err := s.writer(ctx, v.ID)
	if err != nil {
		return nil, err
	}
	err = s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Volume(v.ID)
		if err != nil {
			return err
		}
		if cur == nil {
			return errs.NotFound("volume", ref)
		}
		if newSize <= cur.SizeBytes {
			return errs.Invalid(errs.CodeShrinkNotAllowed, "volume %s is %d bytes; the new size %d must be larger (volumes never shrink)", cur.ID, cur.SizeBytes, newSize)
		}
		if cur.Status != meta.StatusAvailable && cur.Status != meta.StatusInUse {
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is %s; only an available or in-use volume can be extended", cur.ID, cur.Status)
		}
		if len(cur.Snapshotting) > 0 {
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is being snapshotted (%s); extend it when the snapshot is available", cur.ID, cur.Snapshotting[0])
		}
		if err := tx.Provision(newSize-cur.SizeBytes, limit); err != nil {
			return err
		}
		cur.Status, cur.TargetSize, cur.Node, cur.UpdatedAt = meta.StatusExtending, newSize, writer, now()
		cur.RequestedBy = ""
		if writer != s.cfg.Node {
			cur.RequestedBy = s.cfg.Node
		}
		tx.PutVolume(cur)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if writer != s.cfg.Node {
		return s.awaitExtend(ctx, v.ID) // the volume's writer extends it (delegate.go)
	}
	return s.runExtend(ctx, v.ID)
}

func (s *Service) finishExtend(ctx context.Context, id string) (*meta.Volume, error) {
	v, err := s.meta.Volume(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := s.resize(v); err != nil {
		// The data is intact at the old size: return to rest, say why, and
		// give the provisioned bytes back, in one transaction.
		s.logFor("volume", id).Error("extend failed", "err", err)
		uerr := s.meta.Update(ctx, func(tx *meta.Tx) error {
			cur, terr := tx.Volume(id)
			if terr != nil || cur == nil || cur.Status != meta.StatusExtending {
				return terr
			}
			if terr := tx.Provision(cur.SizeBytes-cur.TargetSize, 0); terr != nil {
				return terr
			}
			cur.Status, cur.StatusMessage = resting(cur), fmt.Sprintf("extend to %d bytes failed: %v", cur.TargetSize, err)
			cur.TargetSize, cur.Node, cur.RequestedBy, cur.UpdatedAt = 0, "", "", now()
			tx.PutVolume(cur)
			return nil
		})
		if uerr != nil {
			s.logFor("volume", id).Error("cannot record failed extend", "err", uerr)
		}
		return nil, err
	}
	s.logFor("volume", id).Info("volume extended", "size", v.TargetSize)
	return s.transitionVolume(ctx, id, meta.StatusExtending, func(v *meta.Volume) {
		v.SizeBytes, v.TargetSize, v.Status, v.RequestedBy = v.TargetSize, 0, resting(v), ""
	})
}

// resize grows v's live stack to its target size.
func (s *Service) resize(v *meta.Volume) error {
	l, release, err := s.acquire(v)
	if err != nil {
		return err
	}
	defer release()
	if l.Size() >= v.TargetSize {
		return nil // done before an interruption
	}
	return l.(block.Resizer).Resize(v.TargetSize) // acquire returns an *exact
}

// DeleteVolume deletes a volume and its data. Snapshots of it stay.
//
// Most deletes meet no other workflow on their volume. Then the transaction
// that marks the volume deleting also proves its lock queue empty (at its
// commit), which excludes every workflow as the write lock would — one that
// queues later finds the volume deleting and refuses — without the lock's
// two commits. When the queue is not empty, the delete takes the write lock
// as other workflows do. A delete that finds the volume already being
// deleted waits for that deletion, as for any other workflow, and then
// answers NotFound: one volume, one successful delete.
func (s *Service) DeleteVolume(ctx context.Context, c Caller, ref string) error {
	v, err := s.resolveVolume(ctx, c, ref)
	if err != nil {
		return err
	}
	err = s.markDeleting(ctx, v.ID, ref, lock.QueuePrefix(meta.LocksPrefix, "volume/"+v.ID))
	if errors.Is(err, errLocked) {
		unlock, lerr := s.lockFor(ctx, "volume", v.ID, lock.Write)
		if lerr != nil {
			return lerr
		}
		if err = s.markDeleting(ctx, v.ID, ref, ""); err == nil {
			defer unlock()
			return s.finishDeleteVolume(ctx, v.ID)
		}
		unlock()
	}
	if errors.Is(err, errBeingDeleted) {
		return s.awaitDeleted(ctx, v.ID, ref)
	}
	if err != nil {
		return err
	}
	return s.finishDeleteVolume(ctx, v.ID)
}

var (
	// errLocked: the delete must take the volume's workflow lock.
	errLocked = errors.New("volume workflow lock needed")
	// errBeingDeleted: another delete marked the volume deleting.
	errBeingDeleted = errors.New("volume being deleted")
)

// awaitDeleted waits up to lockWait for another request's delete of volume
// id to end and answers NotFound. A volume still deleting after that lost
// its deleter (a node that died mid-delete, and was not restarted): this
// call finishes the deletion, under the write lock so that two such calls
// do not run at once.
func (s *Service) awaitDeleted(ctx context.Context, id, ref string) error {
	for deadline := time.Now().Add(lockWait); time.Now().Before(deadline); {
		if _, err := s.meta.Volume(ctx, id); errs.IsCode(err, errs.CodeNotFound) {
			return errs.NotFound("volume", ref)
		} else if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	unlock, err := s.lockFor(ctx, "volume", id, lock.Write)
	if err != nil {
		return err
	}
	defer unlock()
	s.logFor("volume", id).Warn("finishing a deletion another request left unfinished")
	return s.finishDeleteVolume(ctx, id)
}

// markDeleting marks volume id deleting and releases its name, if it may
// be deleted. With a queue (the volume's lock queue: the delete does not
// hold the lock) it fails with errLocked unless the queue is empty; a
// volume already deleting fails with errBeingDeleted.
func (s *Service) markDeleting(ctx context.Context, id, ref, queue string) error {
	return s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Volume(id)
		if err != nil {
			return err
		}
		if cur == nil {
			return errs.NotFound("volume", ref)
		}
		if cur.Status == meta.StatusDeleting {
			return errBeingDeleted
		}
		if queue != "" && !tx.Empty(queue) {
			return errLocked
		}
		switch cur.Status {
		case meta.StatusAvailable, meta.StatusError:
		case meta.StatusInUse:
			return errs.Conflict(errs.CodeVolumeInUse, "volume %s is attached; detach it first", cur.ID)
		default:
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is %s; delete it when that finishes", cur.ID, cur.Status)
		}
		if len(cur.Snapshotting) > 0 {
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is being snapshotted (%s); delete it when the snapshot is available", cur.ID, cur.Snapshotting[0])
		}
		if cur.Job != nil {
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is running a %s job; delete it when that finishes", cur.ID, cur.Job.Kind)
		}
		tx.ReleaseName(meta.NameVolume, cur.OwnerID, cur.Name, cur.ID)
		tx.DeleteToken(meta.NameVolume, cur.OwnerID, cur.ClientToken)
		cur.Status, cur.Node, cur.UpdatedAt = meta.StatusDeleting, s.cfg.Node, now()
		tx.PutVolume(cur)
		return nil
	})
}

func (s *Service) finishDeleteVolume(ctx context.Context, id string) error {
	if err := s.store.RemoveVolume(id); err != nil {
		return s.failVolume(ctx, id, err)
	}
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		v, err := tx.Volume(id)
		if err != nil || v == nil {
			return err
		}
		tx.DeleteVolume(id)
		return tx.Provision(-v.SizeBytes, 0)
	})
	if err == nil {
		s.logFor("volume", id).Info("volume deleted")
		s.collectSoon()
	}
	return err
}
