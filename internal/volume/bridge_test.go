package volume

import (
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestAccountByRecord: an export writes its object as the snapshot's owner
// only while that user's record is the one the snapshot was made under; a
// user created since under the same name is someone else.
func TestAccountByRecord(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	e.update(func(tx *meta.Tx) error {
		tx.PutUser(&meta.User{Name: "bob", ID: "bob-2", AccessKeyID: "AKBOB2", CreatedAt: now()})
		return nil
	})
	if a, err := s.account(ctx, "bob", "bob-2"); err != nil || a.Access != "AKBOB2" {
		t.Fatalf("the owner's own record: %+v, %v", a, err)
	}
	if a, err := s.account(ctx, "bob", "bob-1"); err != nil || a.Access != "" {
		t.Fatalf("a namesake's record: %+v, %v", a, err)
	}
	if a, err := s.account(ctx, "carol", "carol-1"); err != nil || a.Access != "" {
		t.Fatalf("a deleted user: %+v, %v", a, err)
	}
}

// TestJobKeepsToItsBucket: an export or import runs (or resumes) only in
// the bucket its call was checked against. A bucket deleted and created
// again under its name since, by another user, must neither receive the
// snapshot's data nor give the volume its own.
func TestJobKeepsToItsBucket(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	first := now().Add(-time.Hour)
	bucket := uniq("b")
	e.update(func(tx *meta.Tx) error {
		tx.PutBucket(&meta.Bucket{Name: bucket, OwnerID: "mallory-1", Owner: "mallory", CreatedAt: now()})
		return nil
	})
	job := &meta.Job{Kind: meta.JobExport, Object: "s3://" + bucket + "/img", BucketCreated: first}
	if _, err := s.export(ctx, &meta.Snapshot{ID: "snap-x", Job: job}); !errs.IsCode(err, CodeBucketReplaced) {
		t.Fatalf("export into a bucket created again since: %v, want %s", err, CodeBucketReplaced)
	}
	job = &meta.Job{Kind: meta.JobImport, Object: "s3://" + bucket + "/img", BucketCreated: first}
	v := &meta.Volume{ID: "vol-x", SourceObject: job.Object, Job: job}
	if _, err := s.importObject(ctx, v, 0); !errs.IsCode(err, CodeBucketReplaced) {
		t.Fatalf("import from a bucket created again since: %v, want %s", err, CodeBucketReplaced)
	}
	// The bucket the call saw passes.
	b, err := s.meta.Bucket(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	job.BucketCreated = b.CreatedAt
	if err := s.sameBucket(ctx, job); err != nil {
		t.Fatalf("the same bucket: %v", err)
	}
}
