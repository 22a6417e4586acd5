package objects

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// TestPutRacesDeleteBucket: a PUT whose bucket is deleted between its
// check of the bucket and its publication (the bucket was empty: the
// PUT's data was still in Work/tmp) answers NoSuchBucket, as it would a
// moment later. Before, its rename into the removed directory failed and
// it answered 500 InternalError. (The publication itself takes
// bucketLock, which DeleteBucket waits for: TestPublishHoldsBucketLock.)
func TestPutRacesDeleteBucket(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		const bucket = "prdb"
		mkBucket(t, e.alice, bucket)
		var once sync.Once
		onStep(t, func(op, name string) {
			if op == "publish" {
				once.Do(func() {
					if _, err := e.alice.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)}); err != nil {
						t.Errorf("DeleteBucket of an empty bucket: %v", err)
					}
				})
			}
		})
		_, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("a/k"),
			Body: strings.NewReader("data")})
		if c := code(err); c != "NoSuchBucket" {
			t.Fatalf("PUT racing DeleteBucket: %v (code %q), want NoSuchBucket", err, c)
		}
		// Nothing of the PUT is left for a bucket created again under
		// the name.
		for _, dir := range []string{filepath.Join(e.root, bucket), filepath.Join(e.work, "sidecar", bucket)} {
			if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s after the PUT that lost the race: %v (holding %v)", dir, err, files(t, dir))
			}
		}
	})
}
