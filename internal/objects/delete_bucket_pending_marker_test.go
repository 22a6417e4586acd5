package objects

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestDeleteBucketSettlesPendingMarker: a versioned DELETE that stops (a
// crash) after writing its marker aside and before renaming it into place
// leaves .basalt-pending-marker in the key's version directory: no
// version, which the next request on the key removes. DeleteBucket
// settles such leftovers itself and deletes a bucket that holds nothing
// else. Before, it answered BucketNotEmpty until some request touched
// the key. A bucket that also holds a real version stays BucketNotEmpty.
func TestDeleteBucketSettlesPendingMarker(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c := e.alice
		// leave writes what a DELETE of key that stopped there leaves.
		leave := func(bucket, key string) {
			t.Helper()
			dir := filepath.Join(e.root, bucket, versionsDir, filepath.FromSlash(key))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, pendingMarker), deleteNote(nil), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for _, status := range []types.BucketVersioningStatus{types.BucketVersioningStatusEnabled, types.BucketVersioningStatusSuspended} {
			bucket := "dbpending-" + string(status[0]|0x20)
			mkBucket(t, c, bucket)
			setVersioning(t, c, bucket, status)
			// A version made and deleted: the bucket held versions once.
			vid := aws.ToString(put(t, c, bucket, "gone", "x").VersionId)
			if vid == "" {
				t.Fatalf("%s: PUT answered no version id", status)
			}
			delVersion(t, c, bucket, "gone", vid)
			leave(bucket, "k")
			leave(bucket, "d/k")
			if _, err := c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)}); err != nil {
				t.Fatalf("%s: DeleteBucket of a bucket holding only markers written aside: %v", status, err)
			}
			if _, err := os.Stat(filepath.Join(e.root, bucket)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s: bucket directory after DeleteBucket: %v", status, err)
			}
		}

		// With a version too, the bucket is not empty.
		const bucket = "dbpending-v"
		mkBucket(t, c, bucket)
		setVersioning(t, c, bucket, types.BucketVersioningStatusEnabled)
		put(t, c, bucket, "v", "one")
		delVersion(t, c, bucket, "v", "") // the object becomes a version under a marker
		leave(bucket, "k")
		_, err := c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)})
		wantCode(t, err, "BucketNotEmpty")
	})
}
