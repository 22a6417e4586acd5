package volume

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/cow"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/lock"
	"github.com/basalt-storage/basalt/internal/meta"
)

// replaySnapshotWithoutVolume answers a create that could not find its
// volume (err, deleted since) with the snapshot a first call made with
// the same client token, if there is one (see replayWithoutSource). The
// token's fingerprint holds the volume's id: a volume named by its name
// is not known any more, so only the snapshot's name is compared then.
func (s *Service) replaySnapshotWithoutVolume(ctx context.Context, c Caller, volumeRef, name, token string, err error) (*meta.Snapshot, error) {
	if e, ok := errs.As(err); token == "" || !ok || e.Kind != errs.KindNotFound {
		return nil, err
	}
	r, terr := tokenHolder(ctx, s, meta.NameSnapshot, c, token, (*meta.Tx).Snapshot)
	if terr != nil {
		return nil, terr
	}
	if r == nil {
		return nil, err
	}
	if r.Name != name || volumeIDRE.MatchString(volumeRef) && r.TokenParams != fingerprint(volumeRef, name) {
		return nil, tokenMismatch(token, r.ID)
	}
	return r, nil
}

// CreateSnapshot snapshots a volume: with the volume's writers stopped, its
// cow layer freezes the top image and starts a new one (O(1) whatever the
// size). The snapshot holds exactly the writes acknowledged before the call.
//
// Only the node that writes the volume can stop its writers: when another
// node holds the volume's write lease, the snapshot is recorded for that
// node (Node), which takes it (see delegated), and this call waits for it.
func (s *Service) CreateSnapshot(ctx context.Context, c Caller, volumeRef, name, token string) (*meta.Snapshot, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := checkToken(token); err != nil {
		return nil, err
	}
	v, wl, err := s.lockedVolume(ctx, c, volumeRef, lock.Update)
	if err != nil {
		return s.replaySnapshotWithoutVolume(ctx, c, volumeRef, name, token, err)
	}
	defer wl.unlock()
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
		// The token is the caller's: an admin's retry must find it after
		// the volume, and with it the owner, is gone.
		sn.TokenParams, sn.TokenHolder = fingerprint(v.ID, name), c.ID
	}
	if token != "" {
		// A replay returns at once.
		var r *meta.Snapshot
		err := s.meta.Update(ctx, func(tx *meta.Tx) error {
			var err error
			if id := tx.TokenOwner(meta.NameSnapshot, c.ID, token); id != "" {
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
	if len(v.Stack) > 0 {
		spec, err := parseSpec(v.Stack)
		if err != nil {
			return nil, err
		}
		if !hasLayer(spec, "cow") {
			return nil, notSupported(v, "be snapshotted")
		}
	}
	// Only the volume's writer freezes it: this node, holding the write
	// lease for the freeze (taken if no node holds it, so that no other
	// node takes the volume for an rw attachment meanwhile), or the node
	// that holds it.
	holder, leaseToken, err := s.useLease(ctx, v.ID)
	if err != nil {
		return nil, err
	} else if holder != s.cfg.Node {
		sn.Node, sn.RequestedBy = holder, s.cfg.Node
	} else {
		defer s.leases.unuse(context.Background(), v.ID)
		// Stop the volume's writers until the snapshot exists: writes
		// acknowledged after this call returns must not reach it. (After
		// use: see asWriter.)
		defer s.closeGate(v.ID)()
	}
	// From the recording on, the snapshot is this node's to take (or the
	// writer's, delegated) whatever becomes of the caller: recorded for
	// this node, this call takes it (claimed before the commit, so that a
	// sweep for stranded workflows leaves it alone: stranded.go), and
	// until then the volume refuses its other workflows.
	if sn.Node == s.cfg.Node {
		s.claim("snapshot/" + sn.ID) // a new id: never taken
		defer s.unclaim("snapshot/" + sn.ID)
	}
	wctx, done := s.detach(ctx)
	defer done()
	var replay *meta.Snapshot
	err = s.meta.Update(wctx, func(tx *meta.Tx) error {
		replay = nil
		if id := tx.TokenOwner(meta.NameSnapshot, c.ID, token); id != "" {
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
		if err := wl.check(tx); err != nil {
			return err
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
		sn.SizeBytes, sn.Stack, sn.Type = cur.SizeBytes, cur.Stack, cur.Type
		cur.Snapshotting = append(cur.Snapshotting, sn.ID)
		tx.PutVolume(cur)
		tx.PutToken(meta.NameSnapshot, c.ID, token, sn.ID)
		tx.PutSnapshot(sn)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if replay != nil {
		return replay, nil
	}
	s.logFor("snapshot", sn.ID).Info("snapshot create", "volume", v.ID, "size", sn.SizeBytes, "by", sn.Node)
	if sn.Node != s.cfg.Node {
		// Taken by the volume's writer (delegate.go). Its failure is this
		// call's, as when this node takes it: the snapshot stays, in error
		// (returned with the error).
		out, err := s.awaitSnapshot(ctx, sn.ID)
		if err == nil && out.Status == meta.StatusError {
			err = snapshotFailed(out)
		}
		return out, err
	}
	if testHookSnapshotRecorded != nil {
		testHookSnapshotRecorded(sn)
	}
	out, err := s.finishSnapshot(wctx, sn.ID, sn.Node, leaseToken)
	switch {
	case errors.Is(err, errAdopted):
		return s.snapshotTakenOver(wctx, sn.ID)
	case errors.Is(err, errLeaseLost):
		// This node could not renew its etcd lease in time (cut off
		// from the metadata cluster, or paused) and stopped writing the
		// volume before the freeze: foreseeable, and the snapshot is
		// failed (or, if that record did not commit, the stranded sweep
		// fails it), so a new one may be taken.
		return out, errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"snapshot %s was not taken: this node lost volume %s's write lease before freezing it (its metadata session lapsed: a partition or a long pause), "+
				"so another node may write the volume now; the snapshot is left in error; take it again", sn.ID, v.ID)
	}
	return out, err
}

// testHookSnapshotRecorded, when set, runs after a snapshot this node
// takes is recorded and before it is taken (tests make another node take
// it over there, or the write lease lapse).
var testHookSnapshotRecorded func(*meta.Snapshot)

// snapshotTakenOver answers a create whose snapshot, recorded for this
// node, another node took over meanwhile: this node was cut off from the
// metadata cluster after the recording (a partition or a long pause),
// and a node that found it gone adopted the snapshot (orphans.go) or
// failed it as it took the volume for writing (failPassedSnapshots). The
// outcome is that node's, as for a delegated snapshot: the record, 202
// while it is being taken there, or the failure. It answered the bare
// errAdopted, a 500 InternalError that said nothing of the snapshot.
func (s *Service) snapshotTakenOver(ctx context.Context, id string) (*meta.Snapshot, error) {
	sn, err := s.meta.Snapshot(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s, taken over by another node: %w", id, err)
	}
	s.logFor("snapshot", id).Info("snapshot taken over by another node meanwhile", "status", sn.Status, "by", sn.Node)
	switch sn.Status {
	case meta.StatusCreating, meta.StatusAvailable:
		return sn, nil
	case meta.StatusError:
		return sn, snapshotFailed(sn)
	}
	return sn, errs.Conflict(errs.CodeVolumeBusy, "snapshot %s was taken over by another node while this node was cut off from the metadata cluster, and is %s now", sn.ID, sn.Status)
}

// snapshotFailed is the error of a create call whose snapshot another
// node failed. When the volume's writer changed before the snapshot was
// taken (staleSnapshot), a conflict the caller can act on — the volume is
// written elsewhere now; take the snapshot again — not an internal error.
func snapshotFailed(sn *meta.Snapshot) error {
	if strings.Contains(sn.StatusMessage, staleSnapshot) {
		return errs.Conflict(errs.CodeVolumeBusy, "snapshot %s was not taken, because the volume's writer changed meanwhile: %s", sn.ID, sn.StatusMessage)
	}
	return sn.Failure.Err("snapshot "+sn.ID, sn.StatusMessage)
}

// finishSnapshot freezes the volume's top image for snapshot id, being
// created by node (this one, or one this node adopted it from: the record
// must still say so), and marks the snapshot available. The caller holds
// the volume's write lease (taken with token) and gate. Repeating it after an interruption
// finds the freeze done (the cow layer knows the snapshot's tag) and
// finishes the record.
func (s *Service) finishSnapshot(ctx context.Context, id, node string, token int64) (*meta.Snapshot, error) {
	sn, err := s.meta.Snapshot(ctx, id)
	if err != nil {
		return nil, err
	}
	if sn.Status != meta.StatusCreating || sn.Node != node {
		// Taking the lease may have waited out a partition during which
		// a node that found this one gone adopted the snapshot and took
		// it (orphans.go): freezing now would give it later writes.
		return sn, errAdopted
	}
	v, err := s.meta.Volume(ctx, sn.VolumeID)
	if err != nil {
		return nil, s.failSnapshot(ctx, id, node, err)
	}
	start := time.Now()
	image, err := s.freeze(v, id, token)
	if err != nil {
		return nil, s.failSnapshot(ctx, id, node, err)
	}
	var out *meta.Snapshot
	err = s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Snapshot(id)
		if err != nil || cur == nil {
			return err
		}
		if cur.Status != meta.StatusCreating || cur.Node != node {
			return errAdopted
		}
		if err := dropFromVolume(tx, cur.VolumeID, id); err != nil {
			return err
		}
		cur.Status, cur.Image, cur.Node, cur.UpdatedAt = meta.StatusAvailable, image, "", now()
		tx.PutSnapshot(cur)
		out = cur
		return nil
	})
	if err != nil {
		return nil, s.failSnapshot(ctx, id, node, err)
	}
	s.logFor("snapshot", id).Info("snapshot available", "image", image, "took", time.Since(start).String())
	return out, nil
}

// freeze runs the cow layer's snapshot on v's live stack, as the writer
// that took v's lease with token.
func (s *Service) freeze(v *meta.Volume, tag string, token int64) (string, error) {
	l, release, err := s.acquireWriter(v, token)
	if err != nil {
		return "", err
	}
	defer release()
	c, ok := find[*cow.Layer](l)
	if !ok {
		return "", notSupported(v, "be snapshotted")
	}
	// Layers above cow may hold writes back until a flush (checksum's
	// tables): flush the whole stack first, so that the frozen image holds
	// everything written so far, not only what reached cow. The caller
	// keeps writers out meanwhile.
	if l.Capabilities().Flush {
		if err := l.Flush(); err != nil {
			return "", fmt.Errorf("flush before snapshot: %w", err)
		}
	}
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	return c.Snapshot(tag)
}

func hasLayer(spec block.Spec, typ string) bool {
	if spec.Type == typ {
		return true
	}
	for _, c := range spec.Children {
		if hasLayer(c, typ) {
			return true
		}
	}
	return false
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

// snapshotUnusable refuses a workflow that needs snapshot sn available
// (a clone builds on its image, an export reads it), saying whether
// waiting helps: a snapshot being taken becomes available, but one being
// deleted or failed never will, and "clone it when it is available" sent
// callers retrying a clone of a snapshot on its way out until they gave
// up. what is the past participle of the workflow: "cloned", "exported".
func snapshotUnusable(sn *meta.Snapshot, what string) error {
	switch sn.Status {
	case meta.StatusDeleting:
		return errs.Conflict(errs.CodeSnapshotNotReady,
			"snapshot %s is being deleted and will not become available again, so it cannot be %s", sn.ID, what)
	case meta.StatusError:
		why := ""
		if sn.StatusMessage != "" {
			why = " (" + sn.StatusMessage + ")"
		}
		return errs.Conflict(errs.CodeSnapshotNotReady,
			"snapshot %s failed%s and will never become available, so it cannot be %s; delete it and take another", sn.ID, why, what)
	case meta.StatusCreating:
		return errs.Conflict(errs.CodeSnapshotNotReady,
			"snapshot %s is still being taken; it can be %s when it is available", sn.ID, what)
	case meta.StatusAvailable: // but records no image to read
		return errs.Conflict(errs.CodeSnapshotNotReady, "snapshot %s records no image, so it cannot be %s", sn.ID, what)
	}
	return errs.Conflict(errs.CodeSnapshotNotReady, "snapshot %s is %s, not available, so it cannot be %s", sn.ID, sn.Status, what)
}

// Snapshots lists the snapshots the caller may see, optionally of one
// volume, oldest first (lists.go).
func (s *Service) Snapshots(ctx context.Context, c Caller, volumeRef string) ([]*meta.Snapshot, error) {
	return s.SnapshotsPage(ctx, c, volumeRef, meta.Page{})
}

// DeleteSnapshot deletes a snapshot. Clones made from it keep the data they
// need: the snapshot's image lives on as their base until they are deleted
// or flattened, and is collected after.
func (s *Service) DeleteSnapshot(ctx context.Context, c Caller, ref string) error {
	sn, wl, err := s.lockedSnapshot(ctx, c, ref, lock.Write)
	if err != nil {
		return err
	}
	defer wl.unlock()
	// From the marking on, the delete is this node's to finish whatever
	// becomes of the caller: the name is released with it, so a retry by
	// name would not find the record, whose bytes stay provisioned until
	// the deletion ends. Claimed for the sweeps (stranded.go); a sweep
	// finishing it already is no harm, as finishing is idempotent.
	if s.claim("snapshot/" + sn.ID) {
		defer s.unclaim("snapshot/" + sn.ID)
	}
	wctx, done := s.detach(ctx)
	defer done()
	err = s.meta.Update(wctx, func(tx *meta.Tx) error {
		if err := wl.check(tx); err != nil {
			return err
		}
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
		if cur.Job != nil {
			return errs.Conflict(errs.CodeSnapshotInUse, "snapshot %s is being exported to %s; delete it when that finishes", cur.ID, cur.Job.Object)
		}
		tx.ReleaseName(meta.NameSnapshot, cur.OwnerID, cur.Name, cur.ID)
		tx.DeleteToken(meta.NameSnapshot, cur.TokenUser(), cur.ClientToken)
		cur.Status, cur.Node, cur.UpdatedAt = meta.StatusDeleting, s.cfg.Node, now()
		tx.PutSnapshot(cur)
		return nil
	})
	if err != nil {
		return err
	}
	return s.finishDeleteSnapshot(wctx, sn.ID)
}

func (s *Service) finishDeleteSnapshot(ctx context.Context, id string) error {
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
		s.collectSoon()
	}
	return err
}

// failSnapshot records the failure of snapshot id's creation by node and
// returns cause; nothing if the record no longer says node creates it.
func (s *Service) failSnapshot(ctx context.Context, id, node string, cause error) error {
	if errors.Is(cause, errAdopted) {
		return cause
	}
	s.logFor("snapshot", id).Error("snapshot workflow failed", "err", cause)
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		sn, err := tx.Snapshot(id)
		if err != nil || sn == nil || sn.Status != meta.StatusCreating || sn.Node != node {
			return err
		}
		if err := dropFromVolume(tx, sn.VolumeID, id); err != nil {
			return err
		}
		sn.Status, sn.StatusMessage, sn.Node, sn.UpdatedAt = meta.StatusError, cause.Error(), "", now()
		sn.Failure = meta.FailureOf(cause)
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
