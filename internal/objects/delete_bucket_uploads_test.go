package objects

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// noUploadsLeft fails if anything of bucket's multipart uploads is left
// under Work/uploads.
func noUploadsLeft(t *testing.T, e *env, bucket, what string) {
	t.Helper()
	dir := filepath.Join(e.work, "uploads", bucket)
	if _, err := os.Stat(dir); err == nil {
		t.Fatalf("%s: %s is left, holding %v", what, dir, files(t, dir))
	} else if !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	if tombs, _ := filepath.Glob(filepath.Join(e.work, "uploads", "*"+removedSuffix)); len(tombs) != 0 {
		t.Fatalf("%s: removed uploads directories left: %v", what, tombs)
	}
}

// TestDeleteBucketRacesUploads: DeleteBucket removes a bucket's pending
// multipart uploads (S3 deletes a bucket that holds incomplete uploads
// and discards them). The upload requests racing it — CreateMultipartUpload,
// UploadPart, CompleteMultipartUpload, Abort — take their turn with it:
// each either lands before the deletion (whose removal then takes it
// along, or which sees the completed object and answers BucketNotEmpty)
// or answers NoSuchBucket / NoSuchUpload; no upload outlives its bucket's
// deletion, to reappear in a bucket created again under that name. Before,
// a CreateMultipartUpload that had checked the bucket before DeleteBucket
// removed it created the upload's directory again afterwards, and
// answered success for an upload of a deleted bucket, which a new bucket
// of that name — another user's — then listed and could complete.
func TestDeleteBucketRacesUploads(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "dbu")
	deleted := make(chan error, 1)
	var once sync.Once
	onStep(t, func(op, name string) {
		if op == "create upload" {
			once.Do(func() {
				go func() {
					_, err := e.alice.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String("dbu")})
					deleted <- err
				}()
				// Give the DeleteBucket time to land inside the create.
				time.Sleep(300 * time.Millisecond)
			})
		}
	})
	up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("dbu"), Key: aws.String("k")})
	if err != nil && code(err) != "NoSuchBucket" {
		t.Fatalf("CreateMultipartUpload racing DeleteBucket: %v", err)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("DeleteBucket of a bucket holding only an upload: %v", err)
	}
	stepHook.Store(nil)
	noUploadsLeft(t, e, "dbu", "CreateMultipartUpload racing DeleteBucket")
	// Another user's bucket of the same name has no uploads of alice's.
	mkBucket(t, e.bob, "dbu")
	l, err := e.bob.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("dbu")})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Uploads) != 0 {
		t.Fatalf("a new bucket lists the deleted bucket's upload: %+v", l.Uploads)
	}
	if up != nil && up.UploadId != nil {
		_, err = e.bob.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("dbu"), Key: aws.String("k"),
			UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: strings.NewReader("p")})
		wantCode(t, err, "NoSuchUpload")
	}
	if _, err := e.bob.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String("dbu")}); err != nil {
		t.Fatal(err)
	}

	// Racing for real: parts, a Complete, an Abort and a new upload
	// against DeleteBucket.
	for round := range 25 {
		bucket := fmt.Sprint("dbu-", round)
		mkBucket(t, e.alice, bucket)
		start := func(key string) *string {
			up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key)})
			if err != nil {
				t.Fatal(err)
			}
			return up.UploadId
		}
		done, aborted := start("done"), start("aborted")
		part, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String("done"),
			UploadId: done, PartNumber: aws.Int32(1), Body: strings.NewReader("the part")})
		if err != nil {
			t.Fatal(err)
		}
		ok := func(what string, err error, allowed ...string) {
			if c := code(err); err != nil && !strings.Contains(strings.Join(allowed, " "), c) {
				t.Errorf("round %d: %s racing DeleteBucket: %v", round, what, err)
			}
		}
		begin := make(chan struct{})
		var wg sync.WaitGroup
		var completed bool
		wg.Go(func() {
			<-begin
			_, err := e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String(bucket),
				Key: aws.String("done"), UploadId: done, MultipartUpload: &types.CompletedMultipartUpload{
					Parts: []types.CompletedPart{{PartNumber: aws.Int32(1), ETag: part.ETag}}}})
			completed = err == nil
			ok("CompleteMultipartUpload", err, "NoSuchUpload", "NoSuchBucket")
		})
		wg.Go(func() {
			<-begin
			_, err := e.alice.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(bucket),
				Key: aws.String("aborted"), UploadId: aborted})
			ok("AbortMultipartUpload", err, "NoSuchUpload", "NoSuchBucket")
		})
		for n := range 4 {
			wg.Go(func() {
				<-begin
				_, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String("done"),
					UploadId: done, PartNumber: aws.Int32(int32(2 + n)), Body: strings.NewReader("more")})
				ok("UploadPart", err, "NoSuchUpload", "NoSuchBucket")
			})
		}
		wg.Go(func() {
			<-begin
			_, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String("new")})
			ok("CreateMultipartUpload", err, "NoSuchBucket")
		})
		var derr error
		wg.Go(func() {
			<-begin
			time.Sleep(time.Duration(round%5) * time.Millisecond)
			_, derr = e.alice.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)})
			ok("DeleteBucket", derr, "BucketNotEmpty")
		})
		close(begin)
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		if derr == nil {
			noUploadsLeft(t, e, bucket, fmt.Sprint("round ", round))
			if completed {
				t.Fatalf("round %d: the Complete and the DeleteBucket both succeeded", round)
			}
			continue
		}
		// The completed object kept the bucket: remove it, then the
		// bucket, with the uploads left.
		if !completed {
			t.Fatalf("round %d: DeleteBucket: %v, but no object was completed", round, derr)
		}
		if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String("done")}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.alice.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)}); err != nil {
			t.Fatalf("round %d: DeleteBucket once empty: %v", round, err)
		}
		noUploadsLeft(t, e, bucket, fmt.Sprint("round ", round, ", deleted again"))
	}
	noTempLeft(t, e)
}

// TestDeleteBucketUploadsCrash: DeleteBucket moves the bucket's uploads
// and sidecar records out of reach before it deletes the bucket's
// record, and a removal a crash interrupted is finished when the store
// opens.
func TestDeleteBucketUploadsCrash(t *testing.T) {
	dir := t.TempDir()
	root, work := filepath.Join(dir, "r"), filepath.Join(dir, "w")
	tomb := filepath.Join(work, "uploads", ".bkt.0123abcd"+removedSuffix)
	sidecars := filepath.Join(work, "sidecar", ".bkt.0123abcd"+removedSuffix)
	live := filepath.Join(work, "uploads", "bkt", "4567cdef")
	for _, d := range []string{filepath.Join(tomb, "89abcdef"), filepath.Join(sidecars, "ab"), live} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "info.json"), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, err := New(Config{Root: root, Work: work, Buckets: &memBuckets{}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	if _, err := os.Stat(tomb); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a deleted bucket's uploads are still there: %v", err)
	}
	if _, err := os.Stat(sidecars); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a deleted bucket's sidecar records are still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("live upload: %v", err)
	}
}
