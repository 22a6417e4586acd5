package volume

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/objects"
)

// TestExportPublishNeedsCurrentRecord: an export publishes its object only
// once a current read of the snapshot's record says the job is still this
// run's. A node cut off from the quorum answers from its own copy, which
// still shows its run after another node adopted the export, finished it
// and the user wrote the object since: it must not publish its copy over
// that. (A stale read stands in for the lost quorum: both are answered
// from the local copy.)
func TestExportPublishNeedsCurrentRecord(t *testing.T) {
	e := newEnv(t)
	alice := caller("alice")
	be, bucket := e.objectStore(alice)
	a := e.started(Config{Objects: be})
	s := e.service(Config{Node: uniq("b"), Objects: be}) // the test runs its export
	ctx := ctxT(t)
	v, _ := e.filledVolume(a, alice, 1<<20, 9)
	sn, err := a.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	e.editSnapshot(sn.ID, func(cur *meta.Snapshot) {
		cur.Job = &meta.Job{Kind: meta.JobExport, Node: s.cfg.Node, StartedAt: now(), Object: "s3://" + bucket + "/s.raw",
			Total: cur.SizeBytes, Phase: "copy"}
	})
	_, err = s.export(meta.Stale(ctx), e.snapshot(sn.ID))
	wantCode(t, err, errs.CodeMetadataUnavailable)
	if f, _, err := be.OpenImage(ctx, bucket, "s.raw"); err == nil {
		f.Close()
		t.Fatal("an export published its object on the word of the node's own copy of the records")
	}
	// With a current read it publishes.
	if _, err := s.export(ctx, e.snapshot(sn.ID)); err != nil {
		t.Fatalf("export with a current check: %v", err)
	}
}

// bucketSwap is an object store that has the bucket deleted and created
// again by another user (with an object of theirs at key, if data is
// set) just before the bridge's call into it number at (counting from 1):
// the owner deleted the bucket and someone else took its name meanwhile.
type bucketSwap struct {
	*objects.Backend
	e           *env
	bucket, key string
	data        []byte
	taker       Caller
	at          int32
	calls       atomic.Int32
}

func (b *bucketSwap) swap(ctx context.Context) {
	if b.calls.Add(1) != b.at {
		return
	}
	if _, err := b.Backend.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &b.bucket, Key: &b.key}); err != nil {
		b.e.t.Errorf("delete the owner's object: %v", err)
	}
	if err := b.Backend.DeleteBucket(ctx, b.bucket); err != nil {
		b.e.t.Errorf("delete the owner's bucket: %v", err)
		return
	}
	b.e.update(func(tx *meta.Tx) error {
		tx.PutUser(&meta.User{Name: b.taker.Name, ID: b.taker.ID, CreatedAt: now()})
		return nil
	})
	buckets := objects.MetaBuckets{Meta: b.e.meta}
	if err := buckets.CreateBucket(ctx, objects.Bucket{Name: b.bucket, Owner: b.taker.Name, CreatedAt: now()}); err != nil {
		b.e.t.Errorf("create the bucket again: %v", err)
		return
	}
	if err := os.Mkdir(filepath.Join(b.e.st.BucketsDir(), b.bucket), 0o755); err != nil {
		b.e.t.Errorf("bucket directory: %v", err)
		return
	}
	if b.data != nil {
		b.put(ctx, b.data)
	}
}

// put writes data as the object at b's key.
func (b *bucketSwap) put(ctx context.Context, data []byte) {
	if _, err := b.Backend.PutImage(ctx, objects.ImageInput{Bucket: b.bucket, Key: b.key, Fill: func(f *os.File) error {
		_, err := f.Write(data)
		return err
	}}); err != nil {
		b.e.t.Errorf("put %s/%s: %v", b.bucket, b.key, err)
	}
}

func (b *bucketSwap) PutImage(ctx context.Context, in objects.ImageInput) (objects.ObjectInfo, error) {
	b.swap(ctx)
	return b.Backend.PutImage(ctx, in)
}

func (b *bucketSwap) OpenImage(ctx context.Context, bucket, key string) (*os.File, objects.ObjectInfo, error) {
	b.swap(ctx)
	return b.Backend.OpenImage(ctx, bucket, key)
}

// TestExportKeepsToItsBucketUntilPublished: the bucket an export's call
// was checked against may be deleted, and its name taken by another user,
// after the job checked it as it began: the snapshot's data must not be
// published into the new owner's bucket.
func TestExportKeepsToItsBucketUntilPublished(t *testing.T) {
	e := newEnv(t)
	alice, mallory := caller("alice"), caller("mallory")
	be, bucket := e.objectStore(alice)
	// The first call is the export's PutImage, the object's writer.
	swap := &bucketSwap{Backend: be, e: e, bucket: bucket, key: "s.raw", taker: mallory, at: 1}
	s := e.started(Config{Objects: swap})
	ctx := ctxT(t)
	v, _ := e.filledVolume(s, alice, 1<<20, 9)
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ExportSnapshot(ctx, alice, sn.ID, "s3://"+bucket+"/s.raw"); err != nil {
		t.Fatal(err)
	}
	got := waitRecord(t, "export", func() *meta.Snapshot { return e.snapshot(sn.ID) },
		func(sn *meta.Snapshot) bool { return sn.Job == nil })
	if f, oi, err := be.OpenImage(ctx, bucket, "s.raw"); err == nil {
		f.Close()
		t.Fatalf("the snapshot was published into the bucket another user created under its name (%d bytes)", oi.Size)
	}
	if lj := got.LastJob; lj == nil || !strings.Contains(lj.Error, "created again") {
		t.Fatalf("outcome of an export whose bucket was replaced: %+v, want %s", lj, CodeBucketReplaced)
	}
}

// TestImportKeepsToItsBucket: an import reads its object only from the
// bucket its call was checked against: one deleted, and created again by
// another user with an object of theirs at the key, after the job checked
// the bucket as it began, must not give the volume its data.
func TestImportKeepsToItsBucket(t *testing.T) {
	e := newEnv(t)
	alice, mallory := caller("alice"), caller("mallory")
	be, bucket := e.objectStore(alice)
	theirs := pattern(66, 1<<20)
	// The first call is the create's check of the object, the second the
	// import job's open of it.
	swap := &bucketSwap{Backend: be, e: e, bucket: bucket, key: "in.raw", data: theirs, taker: mallory, at: 2}
	s := e.started(Config{Objects: swap})
	ctx := ctxT(t)
	swap.put(ctx, pattern(11, 1<<20))
	v, err := s.CreateVolume(ctx, alice, CreateVolume{FromObject: "s3://" + bucket + "/in.raw"})
	if err != nil {
		t.Fatal(err)
	}
	got := waitRecord(t, "import", func() *meta.Volume { return e.volume(v.ID) },
		func(v *meta.Volume) bool { return v.Status != meta.StatusCreating })
	if got.Status != meta.StatusError {
		if sameBytes(e.readVolume(s, v.ID), theirs) {
			t.Fatal("the volume was filled from the object of the user who took the bucket's name")
		}
		t.Fatalf("import from a replaced bucket ended %s: %+v", got.Status, got.LastJob)
	}
	if lj := got.LastJob; lj == nil || !strings.Contains(lj.Error, "created again") {
		t.Fatalf("outcome of an import whose bucket was replaced: %+v", lj)
	}
}
