package objects

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// writeTo is a PUT, or a copy from bucket "pblsrc", of data to bucket/key.
func writeTo(e *env, how, bucket, key, data string) error {
	if how == "put" {
		_, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key),
			Body: strings.NewReader(data)})
		return err
	}
	_, err := e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String(bucket), Key: aws.String(key),
		CopySource: aws.String("pblsrc/" + data)})
	return err
}

// TestPublishHoldsBucketLock: a DeleteBucket that comes while a PUT or
// copy publishes its object into the (so far empty) bucket waits for the
// publication, then finds the object and answers BucketNotEmpty; the
// object stays. Before, PUT and copy took no bucket lock: the
// DeleteBucket went ahead, removed the bucket under the write (which
// then answered NoSuchBucket) or, had the object landed between its
// check and its removal, failed blaming "files that are not S3 objects".
func TestPublishHoldsBucketLock(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		mkBucket(t, e.alice, "pblsrc")
		put(t, e.alice, "pblsrc", "src", "src")
		for _, how := range []string{"put", "copy"} {
			bucket, key := "pbl-"+how, "d/k"
			mkBucket(t, e.alice, bucket)
			var once sync.Once
			deleted := make(chan error, 1)
			onStep(t, func(op, name string) {
				if op != "publish rename" || name != key {
					return
				}
				once.Do(func() {
					go func() {
						_, err := e.alice.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)})
						deleted <- err
					}()
					select {
					case err := <-deleted:
						t.Errorf("%s: DeleteBucket answered (%v) while the write was publishing", how, err)
						deleted <- err
					case <-time.After(300 * time.Millisecond):
					}
				})
			})
			if err := writeTo(e, how, bucket, key, "src"); err != nil {
				t.Fatalf("%s racing DeleteBucket: %v", how, err)
			}
			stepHook.Store(nil)
			if err := <-deleted; code(err) != "BucketNotEmpty" || strings.Contains(err.Error(), "not S3 objects") {
				t.Errorf("%s: DeleteBucket after the write published: %v, want BucketNotEmpty", how, err)
			}
			if got := get(t, e.alice, bucket, key); got != "src" {
				t.Errorf("%s: GET %q after the race", how, got)
			}
		}
	})
}

// TestWriteAfterDeleteBucket: a PUT or copy whose bucket is deleted
// while its data is on the way (after it checked the bucket, before it
// publishes) answers NoSuchBucket and leaves nothing behind — also when
// a bucket of the same name is created again meanwhile: the write was
// let in (and its ACL checked) for the bucket that is gone. Before, in
// sidecar mode the write made the bucket's directory in Work/sidecar
// again and left it there, and a write whose bucket had been created
// again answered 500 InternalError, which clients retry (into the new
// bucket).
func TestWriteAfterDeleteBucket(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		mkBucket(t, e.alice, "pblsrc")
		put(t, e.alice, "pblsrc", "src", "src")
		for _, how := range []string{"put", "copy"} {
			for _, again := range []bool{false, true} {
				bucket := "wadb-" + how
				if again {
					bucket += "-again"
				}
				const key = "k"
				mkBucket(t, e.alice, bucket)
				var once sync.Once
				onStep(t, func(op, name string) {
					if op != "publish" || name != key {
						return
					}
					once.Do(func() {
						if _, err := e.alice.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)}); err != nil {
							t.Errorf("DeleteBucket of an empty bucket: %v", err)
						}
						if again {
							if _, err := e.alice.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
								t.Errorf("create bucket %s again: %v", bucket, err)
							}
						}
					})
				})
				err := writeTo(e, how, bucket, key, "src")
				stepHook.Store(nil)
				if c := code(err); c != "NoSuchBucket" {
					t.Errorf("%s (bucket created again: %t) after DeleteBucket: %v (code %q), want NoSuchBucket", how, again, err, c)
				}
				side := filepath.Join(e.work, "sidecar", bucket)
				if !again {
					for _, dir := range []string{filepath.Join(e.root, bucket), side} {
						if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
							t.Errorf("%s: %s after the write that lost the race: %v", how, dir, err)
						}
					}
					continue
				}
				if got := keys(t, e.alice, bucket, "", 1000); len(got) != 0 {
					t.Errorf("%s: the bucket created again holds %v", how, got)
				}
				for _, dir := range []string{filepath.Join(e.root, bucket), side} {
					if _, err := os.Stat(dir); err == nil {
						if left := files(t, dir); len(left) != 0 {
							t.Errorf("%s: %s holds %v", how, dir, left)
						}
					}
				}
				if _, err := os.Stat(side); err == nil {
					t.Errorf("%s: %s made for a bucket the write did not land in", how, side)
				}
			}
		}
	})
}
