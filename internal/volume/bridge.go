package volume

// The bridge between volumes and objects: a snapshot exported as a raw
// image object (`snapshot export SNAP --to s3://B/K`), a volume made from
// one (`volume create --from-object s3://B/K`). Both are jobs with
// progress, recorded on the snapshot (Job) or on the creating volume, and
// resumed by Start after a restart. Data moves with block.CopyOut and
// block.CopyIn: file to file in the kernel (by reflink where the file
// system shares blocks) when the stack is cow over files, through the
// layers otherwise (crypt decrypts, checksum verifies). Either way the
// object and the volume are independent files afterwards: a write through
// one never changes the other.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/lock"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/objects"
	sizes "github.com/basalt-storage/basalt/internal/size"
	"github.com/versity/versitygw/auth"
)

// Objects is the object store of the bridge (objects.Backend).
type Objects interface {
	PutImage(ctx context.Context, in objects.ImageInput) (objects.ObjectInfo, error)
	OpenImage(ctx context.Context, bucket, key string) (*os.File, objects.ObjectInfo, error)
}

// CodeObjectStoreUnavailable: this node serves no object store (503).
const CodeObjectStoreUnavailable = "ObjectStoreUnavailable"

// ExportReport is an export job's report.
type ExportReport struct {
	Object string `json:"object"`
	ETag   string `json:"etag"`
	Size   int64  `json:"size_bytes"`
	block.CopyReport
}

// ImportReport is an import job's report.
type ImportReport struct {
	Object string `json:"object"`
	ETag   string `json:"etag"`
	block.CopyReport
}

func (s *Service) objectStore() (Objects, error) {
	if s.cfg.Objects == nil {
		return nil, errs.New(errs.KindUnavailable, CodeObjectStoreUnavailable, "this node serves no object store")
	}
	return s.cfg.Objects, nil
}

// CodeBucketReplaced: a job's bucket was deleted and created again since
// the job was asked for (409).
const CodeBucketReplaced = "BucketReplaced"

// ownBucket parses an s3:// URL and checks that c may use its bucket:
// the owner (by user id) or an administrator. It returns the bucket's
// record too.
func (s *Service) ownBucket(ctx context.Context, c Caller, url string) (bucket, key string, b *meta.Bucket, err error) {
	bucket, key, err = objects.ParseURL(url)
	if err != nil {
		return "", "", nil, err
	}
	b, err = s.bucket(ctx, bucket)
	if err != nil {
		return "", "", nil, err
	}
	if !c.Admin && b.OwnerID != c.ID {
		return "", "", nil, errs.New(errs.KindForbidden, "AccessDenied", "bucket %q belongs to another user", bucket)
	}
	return bucket, key, b, nil
}

func (s *Service) bucket(ctx context.Context, name string) (*meta.Bucket, error) {
	b, err := s.meta.Bucket(ctx, name)
	if errs.IsCode(err, errs.CodeNotFound) {
		return nil, errs.New(errs.KindNotFound, objects.CodeNoSuchBucket, "bucket %q does not exist", name)
	}
	return b, err
}

// sameBucket checks, as a job starts or resumes, that job's bucket is the
// one its call was checked against (meta.Job.BucketCreated): the owner
// may have deleted it since, and another user created one of that name,
// who must not receive a snapshot's data or give a volume theirs.
func (s *Service) sameBucket(ctx context.Context, job *meta.Job) error {
	if job.BucketCreated.IsZero() {
		return nil
	}
	bucket, _, err := objects.ParseURL(job.Object)
	if err != nil {
		return err
	}
	b, err := s.bucket(ctx, bucket)
	if err != nil {
		return err
	}
	if !b.CreatedAt.Equal(job.BucketCreated) {
		return errs.Conflict(CodeBucketReplaced, "bucket %q was deleted and created again (at %s) since the %s was asked for; the job does not use the new bucket",
			bucket, b.CreatedAt.UTC().Format(time.RFC3339Nano), job.Kind)
	}
	return nil
}

// ExportSnapshot starts writing snapshot ref into the object at url
// (s3://BUCKET/KEY, a bucket the caller owns) and returns the snapshot
// with the job recorded. The snapshot cannot be deleted meanwhile.
func (s *Service) ExportSnapshot(ctx context.Context, c Caller, ref, url string) (*meta.Snapshot, error) {
	if _, err := s.objectStore(); err != nil {
		return nil, err
	}
	sn, wl, err := s.lockedSnapshot(ctx, c, ref, lock.Read)
	if err != nil {
		return nil, err
	}
	defer wl.unlock()
	_, _, b, err := s.ownBucket(ctx, c, url)
	if err != nil {
		return nil, err
	}
	var out *meta.Snapshot
	err = s.meta.Update(ctx, func(tx *meta.Tx) error {
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
		if cur.Status != meta.StatusAvailable {
			return snapshotUnusable(cur, "exported")
		}
		if cur.Job != nil {
			return errs.Conflict(errs.CodeSnapshotInUse, "snapshot %s is already being exported to %s", cur.ID, cur.Job.Object)
		}
		cur.Job = &meta.Job{Kind: meta.JobExport, Node: s.cfg.Node, StartedAt: now(), Object: url, Total: cur.SizeBytes, Phase: "copy",
			BucketCreated: b.CreatedAt}
		cur.UpdatedAt = now()
		tx.PutSnapshot(cur)
		out = cur
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.logFor("snapshot", sn.ID).Info("export started", "to", url)
	s.startExport(sn.ID)
	return out, nil
}

func (s *Service) startExport(id string) {
	if !s.claim("export/" + id) {
		return // runs already
	}
	s.background(func() {
		again := s.runExport(s.ctx, id)
		s.unclaim("export/" + id)
		if again {
			s.startExport(id)
		}
	})
}

// sameRun reports whether job is the run that started as run (an export,
// or a volume's job): one adopted by another node (orphans.go) names that
// node, and a new one has a new start. A run that is not the job's any
// more (its node was paused or cut off long enough to be taken for gone)
// neither publishes its object, nor records progress or outcome.
func sameRun(job, run *meta.Job) bool {
	return job != nil && job.Node == run.Node && job.StartedAt.Equal(run.StartedAt)
}

// errNotThisRun: the export was adopted, or replaced by a new one, while
// this run copied.
var errNotThisRun = errs.Conflict(errs.CodeSnapshotInUse, "the export was taken over by another node (this one was taken for gone) or replaced by a new one; this run publishes nothing")

// runExport runs the export recorded on snapshot id if it is this node's;
// again reports that the record then holds another export of this node's,
// recorded while this one ran, for the caller to start.
func (s *Service) runExport(ctx context.Context, id string) (again bool) {
	log := s.logFor("snapshot", id)
	sn, err := s.meta.Snapshot(ctx, id)
	if err != nil || sn.Job == nil {
		log.Error("export: cannot read record", "err", err)
		return false
	}
	if sn.Job.Node != s.cfg.Node {
		return false // another node's, or adopted by one
	}
	run := *sn.Job
	start := time.Now()
	report, err := s.export(ctx, sn)
	if ctx.Err() != nil {
		return false // interrupted by shutdown: run again at next start
	}
	res := &meta.JobResult{Kind: meta.JobExport, Report: report, Finished: now()}
	if err != nil {
		res.Error = err.Error()
	}
	uerr := s.meta.Update(context.Background(), func(tx *meta.Tx) error {
		again = false
		cur, err := tx.Snapshot(id)
		if err != nil || cur == nil {
			return err
		}
		if !sameRun(cur.Job, &run) {
			// Adopted by another node, which found this one gone
			// (orphans.go), or a new export of this node's.
			again = cur.Job != nil && cur.Job.Node == s.cfg.Node
			return nil
		}
		cur.Job, cur.LastJob, cur.UpdatedAt = nil, res, now()
		tx.PutSnapshot(cur)
		return nil
	})
	if uerr != nil {
		log.Error("cannot record export outcome", "err", uerr)
	}
	if err != nil {
		log.Error("export failed", "to", sn.Job.Object, "err", err)
		return again
	}
	log.Info("export done", "to", sn.Job.Object, "took", time.Since(start).String(), "report", report)
	return again
}

// export reads the snapshot's image in place (read-only, through its
// volume's stack) into a new object.
func (s *Service) export(ctx context.Context, sn *meta.Snapshot) (*ExportReport, error) {
	if err := s.sameBucket(ctx, sn.Job); err != nil {
		return nil, err
	}
	o, err := s.objectStore()
	if err != nil {
		return nil, err
	}
	bucket, key, err := objects.ParseURL(sn.Job.Object)
	if err != nil {
		return nil, err
	}
	spec, err := parseSpec(sn.Stack)
	if err != nil {
		return nil, err
	}
	// Layer metadata above cow belongs to the volume's present, not to
	// the snapshot: an empty directory gives every such layer none.
	dir, err := os.MkdirTemp("", "basalt-export-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	env := s.env(dir)
	env.ReadOnly, env.Base, env.Size = true, sn.Image, sn.SizeBytes
	l, err := block.Build(env, spec)
	if err != nil {
		return nil, fmt.Errorf("open snapshot %s: %w", sn.ID, err)
	}
	defer l.Close()
	writer, err := s.account(ctx, sn.Owner, sn.OwnerID)
	if err != nil {
		return nil, err
	}
	rep := &ExportReport{Object: sn.Job.Object, Size: sn.SizeBytes}
	oi, err := o.PutImage(ctx, objects.ImageInput{
		Bucket: bucket, Key: key, Writer: writer, ContentType: "application/octet-stream",
		Metadata: map[string]string{"basalt-snapshot": sn.ID, "basalt-volume": sn.VolumeID},
		Fill: func(f *os.File) error {
			var err error
			rep.CopyReport, err = block.CopyOut(l, f, sn.SizeBytes, s.snapshotProgress(ctx, sn.ID, sn.Job, "copy"))
			return err
		},
		Progress: s.snapshotProgress(ctx, sn.ID, sn.Job, "checksum"),
		Check:    func() error { return s.mayPublish(ctx, sn.ID, sn.Job) },
	})
	if err != nil {
		return rep, err
	}
	rep.ETag = oi.ETag
	return rep, nil
}

// mayPublish is asked, under the object key's lock, just before the
// export run of snapshot id publishes its object: the record must still
// hold that run, and the job's bucket must still be the one its call was
// checked against — the owner may have deleted it while the copy ran, and
// another user created one of that name, which the object's directory,
// opened after the check at the start, may then be. Both are read
// linearizably: a node cut off from the quorum answers from its own copy,
// which still shows this run after another node adopted the export (this
// one taken for gone), finished it and the user wrote the object since.
// Such a node publishes nothing until it can tell.
func (s *Service) mayPublish(ctx context.Context, id string, run *meta.Job) error {
	rctx, ri := meta.WithReadInfo(ctx)
	cur, err := s.meta.Snapshot(rctx, id)
	if err != nil {
		return fmt.Errorf("export of snapshot %s: read its record before publishing: %w", id, err)
	}
	// A copy that is behind shows this run or an older state, never a
	// newer one: another run it shows is there for certain.
	if !sameRun(cur.Job, run) {
		return errNotThisRun
	}
	if err := s.sameBucket(rctx, run); err != nil {
		return err
	}
	if ri.Local {
		return errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"export of snapshot %s: no quorum of the metadata cluster answers, so this node cannot tell whether the export is still its own; it publishes nothing", id)
	}
	return nil
}

// account is the S3 account of user name, whose record id is id, for the
// uid its objects are given; a user deleted since has none (the file stays
// the server's), nor has another user created under the same name since.
func (s *Service) account(ctx context.Context, name, id string) (auth.Account, error) {
	u, err := s.meta.User(ctx, name)
	if errs.IsCode(err, errs.CodeNotFound) || err == nil && u.ID != id {
		return auth.Account{}, nil
	}
	if err != nil {
		return auth.Account{}, err
	}
	return objects.Account(u), nil
}

// snapshotProgress persists the progress of export run at most once per
// progressEvery, while it is the snapshot's job.
func (s *Service) snapshotProgress(ctx context.Context, id string, run *meta.Job, phase string) block.Progress {
	return throttled(func(done, total int64) {
		err := s.meta.Update(ctx, func(tx *meta.Tx) error {
			cur, err := tx.Snapshot(id)
			if err != nil || cur == nil || !sameRun(cur.Job, run) {
				return err
			}
			cur.Job.Done, cur.Job.Total, cur.Job.Phase = done, total, phase
			tx.PutSnapshot(cur)
			return nil
		})
		if err != nil && ctx.Err() == nil {
			s.log.Warn("cannot persist export progress", "err", err)
		}
	})
}

// throttled calls save at most once per progressEvery, and at the end.
func throttled(save block.Progress) block.Progress {
	var last time.Time
	return func(done, total int64) {
		if time.Since(last) < progressEvery && done != total {
			return
		}
		last = time.Now()
		save(done, total)
	}
}

// checkImport validates a create from an object: the caller's bucket, an
// object that is valid now, and the volume's size (0: the object's,
// rounded up to 512 bytes). It returns the size.
func (s *Service) checkImport(ctx context.Context, c Caller, url string, size int64) (int64, *meta.Bucket, error) {
	o, err := s.objectStore()
	if err != nil {
		return 0, nil, err
	}
	bucket, key, b, err := s.ownBucket(ctx, c, url)
	if err != nil {
		return 0, nil, err
	}
	f, oi, err := o.OpenImage(ctx, bucket, key)
	if err != nil {
		return 0, nil, err
	}
	f.Close()
	if oi.Size == 0 {
		return 0, nil, errs.Invalid(errs.CodeInvalidSize, "object %s is empty; a volume needs at least 512 bytes", url)
	}
	if size == 0 {
		size = (oi.Size + 511) &^ 511
	}
	if size < oi.Size {
		return 0, nil, errs.Invalid(errs.CodeInvalidSize, "size %s is smaller than object %s (%s)", sizes.Bytes(size), url, sizes.Bytes(oi.Size))
	}
	return size, b, nil
}

// startImport finishes creating a volume from an object in the
// background (the copy takes time; the volume shows it as a job).
func (s *Service) startImport(id string) {
	if !s.claim("import/" + id) {
		return // runs already
	}
	s.background(func() {
		defer s.unclaim("import/" + id)
		v, err := s.meta.Volume(s.ctx, id)
		if err == nil {
			_, err = s.finishImport(s.ctx, v)
		}
		if errors.Is(err, errAdopted) {
			s.logFor("volume", id).Info("import taken by another node meanwhile")
		} else if err != nil && s.ctx.Err() == nil {
			s.logFor("volume", id).Error("create from object failed", "err", err)
		}
	})
}

// importObject fills v's new stack from its source object.
func (s *Service) importObject(ctx context.Context, v *meta.Volume, token int64) (*ImportReport, error) {
	if v.Job != nil {
		if err := s.sameBucket(ctx, v.Job); err != nil {
			return nil, err
		}
	}
	o, err := s.objectStore()
	if err != nil {
		return nil, err
	}
	bucket, key, err := objects.ParseURL(v.SourceObject)
	if err != nil {
		return nil, err
	}
	f, oi, err := o.OpenImage(ctx, bucket, key)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if v.Job != nil {
		// Again now that the file is open: the bucket may have been
		// deleted, and its name taken by another user whose object
		// this opened, since the check above. Still the same bucket
		// now, it was when the file was opened.
		if err := s.sameBucket(ctx, v.Job); err != nil {
			return nil, err
		}
	}
	if oi.Size > v.SizeBytes {
		return nil, fmt.Errorf("object %s has grown to %d bytes, beyond the volume's %d", v.SourceObject, oi.Size, v.SizeBytes)
	}
	l, release, err := s.acquireWriter(v, token)
	if err != nil {
		return nil, err
	}
	defer release()
	var dev block.Device = l
	if e, ok := l.(*exact); ok {
		dev = e.Layer // the stack itself, with its FileCopier if it has one
	}
	rep := &ImportReport{Object: v.SourceObject, ETag: oi.ETag}
	rep.CopyReport, err = block.CopyIn(dev, f, oi.Size, s.progress(ctx, v.ID, func(j *meta.Job) bool { return j.Node == v.Node }))
	if err != nil {
		return rep, err
	}
	// A PUT replaces the file by a rename (the descriptor keeps the old
	// one); only a write in place behind S3 can change what was read.
	return rep, objects.StillSame(f, oi)
}
