package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	var srcLock *workflowLock  // nil: not a clone
	var srcBucket *meta.Bucket // the bucket of FromObject
	var notReady error         // a clone's snapshot has no image to build on
	var stack json.RawMessage
	if req.FromSnapshot != "" {
		var err error
		if src, srcLock, err = s.lockedSnapshot(ctx, c, req.FromSnapshot, lock.Read); err != nil {
			return s.replayWithoutSource(ctx, c, req, err)
		}
		defer srcLock.unlock()
		// Read again now that the lock is held, and only an available
		// snapshot will do: the stack is built on src.Image, which a
		// snapshot still being taken does not have yet (its freeze,
		// which takes no lock on the snapshot, may end before the
		// commit below, whose status check alone would then accept a
		// clone built on nothing — an empty volume).
		if src, err = s.meta.Snapshot(ctx, src.ID); err != nil {
			if errs.IsCode(err, errs.CodeNotFound) {
				return s.replayWithoutSource(ctx, c, req, errs.NotFound("snapshot", req.FromSnapshot))
			}
			return nil, fmt.Errorf("clone: read snapshot: %w", err)
		}
		if src.Status != meta.StatusAvailable || src.Image == "" {
			// Nothing to build on; refused by the transaction, after
			// its token check (a replay still returns its volume).
			notReady = snapshotUnusable(src, "cloned")
		}
		if req.SizeBytes == 0 {
			req.SizeBytes = src.SizeBytes
		}
		if req.SizeBytes < src.SizeBytes {
			return nil, errs.Invalid(errs.CodeInvalidSize, "size %s is smaller than snapshot %s (%s)", size.Bytes(req.SizeBytes), src.ID, size.Bytes(src.SizeBytes))
		}
		// A clone reads its snapshot's images, so it has the source's stack.
		if req.Type != "" && req.Type != src.Type {
			return nil, errs.Invalid(errs.CodeInvalidRequest, "a clone of snapshot %s has its volume's type %q, not %q", src.ID, src.Type, req.Type)
		}
		req.Type, stack = src.Type, src.Stack
	} else {
		if req.FromObject != "" {
			if req.ClientToken != "" {
				// A repeat is answered before the object is read: a
				// size left out is the object's, which may have been
				// written again since with another size, or changed
				// or removed — the request is the same all the same.
				if r, err := s.replayByRecord(ctx, c, req); err != nil || r != nil {
					return r, err
				}
			}
			var err error
			if req.SizeBytes, srcBucket, err = s.checkImport(ctx, c, req.FromObject, req.SizeBytes); err != nil {
				return s.replayWithoutSource(ctx, c, req, err)
			}
		}
		if req.Type == "" {
			req.Type = DefaultType
		}
		t, err := s.VolumeType(ctx, req.Type)
		if err != nil {
			return s.replayWithoutSource(ctx, c, req, err)
		}
		stack = t.Stack
	}
	limit, err := s.Limit()
	if err != nil {
		return nil, err
	}
	if req.SizeBytes > limit {
		// Refused before a stack is built (the transaction checks the
		// rest): none this big could ever be provisioned.
		return nil, errs.New(errs.KindInsufficientStorage, errs.CodeInsufficientCapacity,
			"not enough capacity: %s requested, %s provisionable in all", size.Bytes(req.SizeBytes), size.Bytes(limit))
	}
	t := now()
	v := &meta.Volume{
		ID: newID("vol-"), Name: req.Name, Owner: c.Name, OwnerID: c.ID, SizeBytes: req.SizeBytes,
		Status: meta.StatusAvailable, Type: req.Type, Stack: stack, Multiattach: req.Multiattach,
		ClientToken: req.ClientToken, CreatedAt: t, UpdatedAt: t,
	}
	if req.ClientToken != "" {
		v.TokenParams = fingerprint(req.Name, req.SizeBytes, req.Type, req.FromSnapshot, req.Multiattach, req.FromObject)
	}
	if src != nil {
		v.SourceSnapshot = src.ID
	}
	if req.FromObject != "" {
		// An import takes time: its record comes first, creating, and
		// names this node to finish it (recover.go).
		v.Status, v.Node, v.SourceObject = meta.StatusCreating, s.cfg.Node, req.FromObject
		v.Job = &meta.Job{Kind: meta.JobImport, Node: s.cfg.Node, StartedAt: t, Object: req.FromObject,
			BucketCreated: srcBucket.CreatedAt}
	} else if notReady == nil {
		// The stack first, then the record, available, in one commit: a
		// record never names a stack that is not there, and a stack
		// without a record (a failed commit, a crash in between) is an
		// orphan the collector removes (sweepStacks). The claim keeps
		// this node's collector off it meanwhile; other nodes' spare it
		// for the image grace.
		key := "create/" + v.ID
		s.claim(key)
		defer s.unclaim(key)
		base := ""
		if src != nil {
			base = src.Image
		}
		s.gcMu.RLock()
		err := s.createStack(v, base, nil)
		s.gcMu.RUnlock()
		if err != nil {
			s.discardStack(v.ID)
			return nil, fmt.Errorf("create volume %s: %w", v.ID, err)
		}
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
		if notReady != nil {
			return notReady
		}
		if err := tx.ClaimName(meta.NameVolume, v.OwnerID, v.Name, v.ID); err != nil {
			return err
		}
		if src != nil {
			// Held under the snapshot's read lock, so still there; the
			// checks are the transaction's proof of it.
			if err := srcLock.check(tx); err != nil {
				return err
			}
			sn, err := tx.Snapshot(src.ID)
			if err != nil {
				return err
			}
			if sn == nil {
				return errs.NotFound("snapshot", req.FromSnapshot)
			}
			if sn.Status != meta.StatusAvailable {
				return snapshotUnusable(sn, "cloned")
			}
			if sn.Image != src.Image {
				// The stack was built on the image read above.
				return errs.Conflict(errs.CodeSnapshotNotReady, "snapshot %s changed while the clone was made; retry", src.ID)
			}
		}
		if err := tx.Provision(v.SizeBytes, limit); err != nil {
			return err
		}
		tx.PutToken(meta.NameVolume, c.ID, req.ClientToken, v.ID)
		tx.PutVolume(v)
		return nil
	})
	if err != nil || replay != nil {
		if v.SourceObject == "" && (replay != nil || refused(err)) {
			// Surely not committed. After any other error the commit
			// may have happened: the stack stays, for the collector to
			// remove if no record names it.
			s.discardStack(v.ID)
		}
		if err != nil {
			return nil, err
		}
		return replay, nil
	}
	s.logFor("volume", v.ID).Info("volume create", "owner", v.Owner, "size", v.SizeBytes, "type", v.Type,
		"from", v.SourceSnapshot, "from_object", v.SourceObject)
	if v.SourceObject != "" {
		s.startImport(v.ID)
	}
	return v, nil
}

// replayWithoutSource answers a create that could not find its source
// (err: the snapshot, the object or the volume type is gone) with the
// volume a first call made with the same client token, if there is one:
// a client whose first answer was lost must learn that its volume exists
// (it holds capacity), not that the create failed. The token's
// fingerprint holds the size and type resolved from the source: without
// it they are taken from the record where the request leaves them out
// (a volume extended since then no longer matches a request without a
// size: refused as a mismatch, not replayed).
func (s *Service) replayWithoutSource(ctx context.Context, c Caller, req CreateVolume, err error) (*meta.Volume, error) {
	if e, ok := errs.As(err); req.ClientToken == "" || !ok || e.Kind != errs.KindNotFound {
		return nil, err
	}
	r, terr := s.replayByRecord(ctx, c, req)
	if terr != nil || r != nil {
		return r, terr
	}
	return nil, err
}

// replayByRecord returns the volume a first call made with req's client
// token (nil if none), compared with req on what the volume records where
// req leaves the size or type out (see replayWithoutSource).
func (s *Service) replayByRecord(ctx context.Context, c Caller, req CreateVolume) (*meta.Volume, error) {
	r, err := tokenHolder(ctx, s, meta.NameVolume, c, req.ClientToken, (*meta.Tx).Volume)
	if err != nil || r == nil {
		return nil, err
	}
	size, typ := req.SizeBytes, req.Type
	if size == 0 {
		size = r.SizeBytes
	}
	if typ == "" {
		typ = r.Type
	}
	if r.TokenParams != fingerprint(req.Name, size, typ, req.FromSnapshot, req.Multiattach, req.FromObject) {
		return nil, tokenMismatch(req.ClientToken, r.ID)
	}
	return r, nil
}

// tokenHolder returns the record of kind (meta.NameVolume, ...) that a
// first call by c made with client token token, read by get; nil if
// there is none.
func tokenHolder[R any](ctx context.Context, s *Service, kind string, c Caller, token string, get func(*meta.Tx, string) (*R, error)) (*R, error) {
	var r *R
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		r = nil
		id := tx.TokenOwner(kind, c.ID, token)
		if id == "" {
			return nil
		}
		var err error
		r, err = get(tx, id)
		return err
	})
	return r, err
}

// refused reports whether err is a transaction's own refusal (a name
// taken, no capacity, a token mismatch), which commits nothing — unlike a
// failure to reach the metadata store, after which a commit may or may
// not have happened.
func refused(err error) bool {
	e, ok := errs.As(err)
	return ok && e.Kind != errs.KindInternal && e.Kind != errs.KindUnavailable
}

// discardStack removes the stack of volume id, which has no record, and
// asks for a collection of the images it used; a stack it cannot remove
// is left to that collection.
func (s *Service) discardStack(id string) {
	if err := s.store.RemoveVolume(id); err != nil {
		s.logFor("volume", id).Warn("stack left for the collector", "err", err)
	}
	s.collectSoon()
}

// finishImport builds the stack of v, a volume record read in status
// creating, fills it from its object and marks the volume available. It
// writes the stack as the volume's writer, so that a node which adopts
// the import from this one (orphans.go) writes only once this one is
// fenced.
func (s *Service) finishImport(ctx context.Context, v *meta.Volume) (*meta.Volume, error) {
	id := v.ID
	start := time.Now()
	done, token, err := s.asWriter(ctx, id)
	if err != nil {
		return nil, s.failImport(ctx, v, err)
	}
	// Taking the lease may have waited out a partition during which a
	// node that found this one gone adopted the import, finished it, and
	// the volume was written (orphans.go): build nothing then.
	cur, err := s.meta.Volume(ctx, id)
	if err == nil && (cur.Status != meta.StatusCreating || cur.Node != v.Node) {
		err = errAdopted
	}
	if err == nil {
		// The directory is removed and built again: only while this
		// node may write the volume, as the writer that took the lease.
		fence, forget := s.leases.fenceFor(id, token)
		s.gcMu.RLock()
		err = s.createStack(v, "", fence)
		s.gcMu.RUnlock()
		forget()
	}
	if err != nil {
		done()
		return nil, s.failImport(ctx, v, err)
	}
	rep, err := s.importObject(ctx, v, token)
	done()
	if ctx.Err() != nil {
		return nil, ctx.Err() // shutdown: Start imports again
	}
	if err != nil {
		return nil, s.failImport(ctx, v, fmt.Errorf("import %s: %w", v.SourceObject, err))
	}
	imported := &meta.JobResult{Kind: meta.JobImport, Report: rep, Finished: now()}
	out, err := s.transitionVolume(ctx, id, meta.StatusCreating, v.Node, func(v *meta.Volume) {
		v.Status = resting(v)
		v.Job, v.LastJob = nil, imported
	})
	if err == nil {
		s.logFor("volume", id).Info("volume available", "from_object", v.SourceObject, "took", time.Since(start).String())
	}
	return out, err
}

// transitionVolume applies fn to a volume that is still in status from,
// driven by node (this one, or one this node adopted the workflow from).
func (s *Service) transitionVolume(ctx context.Context, id, from, node string, fn func(*meta.Volume)) (*meta.Volume, error) {
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
		if v.Node != node {
			return errAdopted
		}
		v.StatusMessage, v.Failure = "", nil // they describe the last failure; this transition succeeded
		fn(v)
		v.Node = ""
		v.UpdatedAt = now()
		tx.PutVolume(v)
		out = v
		return nil
	})
	return out, err
}

// failImport records the failure of the import v, a record read in
// status creating, and returns cause; nothing if the record no longer
// says that import (adopted by another node).
func (s *Service) failImport(ctx context.Context, v *meta.Volume, cause error) error {
	id := v.ID
	if errors.Is(cause, errAdopted) {
		return cause
	}
	s.logFor("volume", id).Error("volume workflow failed", "err", cause)
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Volume(id)
		if err != nil || cur == nil || cur.Status != meta.StatusCreating || cur.Node != v.Node {
			return err
		}
		if cur.Job != nil && cur.Job.Kind == meta.JobImport {
			cur.Job, cur.LastJob = nil, &meta.JobResult{Kind: meta.JobImport, Error: cause.Error(), Finished: now()}
		}
		cur.Status, cur.StatusMessage, cur.Node, cur.UpdatedAt = meta.StatusError, cause.Error(), "", now()
		cur.Failure = meta.FailureOf(cause)
		tx.PutVolume(cur)
		return nil
	})
	if err != nil {
		s.logFor("volume", id).Error("cannot record failure", "err", err)
	}
	return cause
}

// Volume returns a volume the caller may see, by id or name.
func (s *Service) Volume(ctx context.Context, c Caller, ref string) (*meta.Volume, error) {
	return s.resolveVolume(ctx, c, ref)
}

// volumeIn is resolveVolume inside a transaction.
func volumeIn(tx *meta.Tx, c Caller, ref string) (*meta.Volume, error) {
	id := ref
	if !volumeIDRE.MatchString(ref) {
		if id = tx.NameOwner(meta.NameVolume, c.ID, ref); id == "" {
			return nil, errs.NotFound("volume", ref)
		}
	}
	v, err := tx.Volume(id)
	if err != nil {
		return nil, err
	}
	if v == nil || !c.sees(v.OwnedBy()) {
		return nil, errs.NotFound("volume", ref)
	}
	return v, nil
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

// Volumes lists the volumes the caller may see, oldest first (lists.go).
func (s *Service) Volumes(ctx context.Context, c Caller) ([]*meta.Volume, error) {
	return s.VolumesPage(ctx, c, meta.Page{})
}

// ExtendVolume grows a volume to newSize bytes.
func (s *Service) ExtendVolume(ctx context.Context, c Caller, ref string, newSize int64) (*meta.Volume, error) {
	v, wl, err := s.lockedVolume(ctx, c, ref, lock.Write)
	if err != nil {
		return nil, err
	}
	defer wl.unlock()
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
		if cur.Job != nil && cur.Job.Kind == meta.JobCollapse {
			return errCollapsing // its commit grows the image it makes the top to the size it finds
		}
		if newSize <= cur.SizeBytes {
			return errs.Invalid(errs.CodeShrinkNotAllowed, "volume %s is %s; the new size %s must be larger (volumes never shrink)", cur.ID, size.Bytes(cur.SizeBytes), size.Bytes(newSize))
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
	}
	// From the recording on, the extend is this node's to finish (or
	// the writer's, delegated) whatever becomes of the caller: recorded
	// for this node, this call drives it — claimed before the commit, so
	// that a sweep for stranded workflows (stranded.go) leaves it alone.
	if writer == s.cfg.Node {
		if !s.claim("extend/" + v.ID) {
			return nil, errs.Conflict(errs.CodeVolumeBusy, "volume %s is being extended by this node; retry when that ends", v.ID)
		}
		defer s.unclaim("extend/" + v.ID)
	}
	wctx, done := s.detach(ctx)
	defer done()
	err = s.pastCollapse(ctx, &v.ID, func() error { return s.meta.Update(wctx, record) })
	if err != nil {
		return nil, err
	}
	if writer != s.cfg.Node {
		// The volume's writer extends it (delegate.go). Its failure is this
		// call's, as when this node extends: the record at rest at a
		// smaller size (the lock keeps any other extend out meanwhile).
		// Only the wait is the caller's.
		out, err := s.awaitExtend(ctx, v.ID)
		if err == nil && out.Status != meta.StatusExtending && out.SizeBytes < newSize {
			return nil, out.Failure.Err("volume "+out.ID, out.StatusMessage)
		}
		return out, err
	}
	out, err := s.finishExtend(wctx, v.ID)
	switch {
	case errors.Is(err, errAdopted):
		return s.extendTakenOver(wctx, v.ID, newSize)
	case errors.Is(err, errLeaseLost):
		// This node could not renew its etcd lease in time (cut off from
		// the metadata cluster, or paused) and stopped writing the
		// volume: foreseeable, and the extend is undone (finishExtend),
		// so it may be asked again.
		return out, errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"volume %s was not extended: this node lost its write lease before growing it (its metadata session lapsed: a partition or a long pause), "+
				"so another node may write the volume now; it keeps its size %s; retry", v.ID, size.Bytes(v.SizeBytes))
	}
	return out, err
}

// extendTakenOver answers an extend, recorded for this node, that another
// node took over meanwhile: this node was cut off from the metadata
// cluster after the recording (a partition or a long pause), and a node
// that found it gone adopted the extend (orphans.go). The outcome is that
// node's, as for a delegated extend: the volume, still extending there
// (202) or extended (200), or the failure. It answered the bare
// errAdopted, a 500 InternalError that said nothing of the extend.
func (s *Service) extendTakenOver(ctx context.Context, id string, newSize int64) (*meta.Volume, error) {
	v, err := s.meta.Volume(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("volume %s, its extend taken over by another node: %w", id, err)
	}
	switch {
	case v.Status == meta.StatusExtending && v.TargetSize == newSize:
		return v, nil
	case v.Status != meta.StatusExtending && v.SizeBytes >= newSize:
		return v, nil
	case v.Status != meta.StatusExtending:
		return nil, v.Failure.Err("volume "+id+": its extend was taken over by another node while this node was cut off from the metadata cluster, and failed there",
			v.StatusMessage)
	}
	return nil, errs.Conflict(errs.CodeVolumeBusy,
		"volume %s: its extend to %s was taken over by another node while this node was cut off from the metadata cluster; it is being extended to %s now",
		id, size.Bytes(newSize), size.Bytes(v.TargetSize))
}

func (s *Service) finishExtend(ctx context.Context, id string) (*meta.Volume, error) {
	v, err := s.meta.Volume(ctx, id)
	if err != nil {
		return nil, err
	}
	if v.Status != meta.StatusExtending {
		// Finished already, by another node that adopted it (the caller
		// that recorded it answers as extendTakenOver says) or by this
		// one: Start's list and the delegation watch may both see one
		// extend (recover.go).
		return v, errAdopted
	}
	err = s.resize(ctx, v)
	if errors.Is(err, errAdopted) {
		s.logFor("volume", id).Info("extend taken by another node meanwhile")
		return nil, err
	}
	if err != nil {
		// The data is intact at the old size: return to rest, say why, and
		// give the provisioned bytes back, in one transaction.
		s.logFor("volume", id).Error("extend failed", "err", err)
		uerr := s.meta.Update(ctx, func(tx *meta.Tx) error {
			cur, terr := tx.Volume(id)
			if terr != nil || cur == nil || !sameExtend(cur, v) {
				return terr
			}
			if terr := tx.Provision(cur.SizeBytes-cur.TargetSize, 0); terr != nil {
				return terr
			}
			cur.Status, cur.StatusMessage = resting(cur), fmt.Sprintf("extend to %d bytes failed: %v", cur.TargetSize, err)
			cur.Failure = meta.FailureOf(err)
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
	return s.transitionVolume(ctx, id, meta.StatusExtending, v.Node, func(v *meta.Volume) {
		v.SizeBytes, v.TargetSize, v.Status, v.RequestedBy = v.TargetSize, 0, resting(v), ""
	})
}

// sameExtend reports whether cur still records the extend v, read when
// it began: not adopted by another node (orphans.go), not another extend.
func sameExtend(cur, v *meta.Volume) bool {
	return cur.Status == meta.StatusExtending && cur.Node == v.Node && cur.TargetSize == v.TargetSize
}

// resize grows v's live stack to its target size, as its writer.
func (s *Service) resize(ctx context.Context, v *meta.Volume) error {
	done, token, err := s.asWriter(ctx, v.ID)
	if err != nil {
		// Another node writing the volume now may be the one that
		// adopted the extend while this one was cut off: the extend is
		// its own then, not failed here.
		if cur, rerr := s.meta.Volume(ctx, v.ID); rerr == nil && !sameExtend(cur, v) {
			return errAdopted
		}
		return err
	}
	defer done()
	// Taking the lease may have waited out a partition during which a
	// node that found this one gone adopted the extend (orphans.go).
	if cur, err := s.meta.Volume(ctx, v.ID); err != nil {
		return err
	} else if !sameExtend(cur, v) {
		return errAdopted
	}
	l, release, err := s.acquireWriter(v, token)
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
// One commit removes the record, its name and its provisioned bytes; the
// stack goes after it (a stack left by a crash or a failed removal is an
// orphan the collector removes, sweepStacks). Most deletes meet no other
// workflow on their volume: then that transaction also proves the
// volume's lock queue empty (at its commit), which excludes every workflow
// as the write lock would — one that queues later finds no volume —
// without the lock's two commits. When the queue is not empty, the delete
// takes the write lock as other workflows do. Of two deletes of one
// volume, one commits and the other finds no volume: NotFound. The volume
// is resolved inside the transaction, so a delete makes no read of its
// own before it.
func (s *Service) DeleteVolume(ctx context.Context, c Caller, ref string) error {
	var id string
	err := s.pastCollapse(ctx, &id, func() error {
		r := ref
		if id != "" {
			r = id // the name may have passed to another volume meanwhile
		}
		var err error
		id, err = s.deleteRecord(ctx, c, r, nil)
		return err
	})
	if errors.Is(err, errLocked) {
		wl, lerr := s.lockFor(ctx, "volume", id, lock.Write)
		if lerr != nil {
			return lerr
		}
		// By id: the name may have passed to another volume meanwhile.
		err = s.pastCollapse(ctx, &id, func() error {
			_, err := s.deleteRecord(ctx, c, id, wl)
			return err
		})
		wl.unlock()
	}
	if err != nil {
		return err
	}
	s.discardStack(id)
	s.logFor("volume", id).Info("volume deleted")
	return nil
}

// errLocked: the delete must take the volume's workflow lock.
var errLocked = errors.New("volume workflow lock needed")

// deleteRecord deletes the record of the volume ref names, if the caller
// sees it and it may be deleted, and returns its id. Without wl (the
// volume's workflow lock, in write mode) it fails with errLocked when the
// volume's lock queue is not empty.
func (s *Service) deleteRecord(ctx context.Context, c Caller, ref string, wl *workflowLock) (string, error) {
	var id string
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := volumeIn(tx, c, ref)
		if err != nil {
			return err
		}
		id = cur.ID
		if wl == nil && !tx.Empty(lock.QueuePrefix(meta.LocksPrefix, "volume/"+cur.ID)) {
			return errLocked
		}
		if err := wl.check(tx); err != nil {
			return err
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
			if cur.Job.Kind == meta.JobCollapse {
				return errCollapsing
			}
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is running a %s job; delete it when that finishes", cur.ID, cur.Job.Kind)
		}
		tx.ReleaseName(meta.NameVolume, cur.OwnerID, cur.Name, cur.ID)
		tx.DeleteToken(meta.NameVolume, cur.OwnerID, cur.ClientToken)
		tx.DeleteVolume(cur.ID)
		return tx.Provision(-cur.SizeBytes, 0)
	})
	return id, err
}
