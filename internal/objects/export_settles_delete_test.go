package objects

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// crashDelete runs a versioned DELETE of bucket/key that stops at step
// (failAtStep), as a crash there would.
func crashDelete(t *testing.T, c *s3.Client, bucket, key, step string) {
	t.Helper()
	failAtStep(t, step)
	_, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: &key})
	fsFault.Store(nil)
	if err == nil {
		t.Fatalf("%s: the DELETE did not reach step %q", key, step)
	}
}

// versionFiles lists the files in key's version directory (none if it
// is gone: an empty one is pruned).
func versionFiles(t *testing.T, e *env, bucket, key string) []string {
	t.Helper()
	dir := filepath.Join(e.root, bucket, versionsDir, filepath.FromSlash(key))
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return files(t, dir)
}

// TestExportSettlesUnfinishedDelete: a DELETE that stopped before its
// commit point (the object's unlink) had no effect, but left a marker
// naming the object and a hard link of it among the versions. Exporting
// the object again settles that first, as every S3 write of the key
// does. Before, the export answered HardLinkedFile (the link was the
// file's second name) until some S3 request on the key settled it.
func TestExportSettlesUnfinishedDelete(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c, bk := e.alice, "expsettle"
		mkBucket(t, c, bk)
		setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
		for _, key := range []string{"k", "d/k"} {
			v1 := *put(t, c, bk, key, "one").VersionId
			v2 := *put(t, c, bk, key, "two").VersionId
			want := []string{key + "@" + v2 + "*", key + "@" + v1}
			crashDelete(t, c, bk, key, "delete marker made")
			oi, err := e.be.Export(ctx, bk, key)
			if err != nil {
				t.Fatalf("%s: export after a DELETE stopped before its unlink: %v", key, err)
			}
			if oi.ETag != md5hex("two") {
				t.Errorf("%s: exported ETag %s, want %s", key, oi.ETag, md5hex("two"))
			}
			if got := versions(t, c, bk, key, 1000); !slices.Equal(got, want) {
				t.Fatalf("%s: versions after the export %v, want %v", key, got, want)
			}
			if got, err := getVersion(t, c, bk, key, v2); err != nil || got != "two" {
				t.Fatalf("%s: GET ?versionId=%s after the export: %q %v", key, v2, got, err)
			}
			markersSettled(t, e, bk, key)
			if got := versionFiles(t, e, bk, key); !slices.Equal(got, []string{versionPrefix + v1}) {
				t.Fatalf("%s: version directory holds %v, want only version %s", key, got, v1)
			}
		}
		verify(t, e, bk, VerifyOptions{Content: true})
	})
}

// TestUnexportSettlesUnfinishedDelete: unexport of an object whose DELETE
// stopped before its commit point settles that DELETE first, so that
// the key ends as after any unexport: its file no object, its older
// versions as they were. Before, the record's removal put the stopped
// DELETE's marker in effect (it named an object the key no longer held):
// a delete marker no DELETE had made, listed on top of the kept link as
// if the DELETE had completed (with xattrs the link, the same inode, had
// lost its record too and was a file among the versions that is no
// version), and deleting that marker was refused, the link being in the
// way of the unexported file.
func TestUnexportSettlesUnfinishedDelete(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c, bk := e.alice, "unexpsettle"
		mkBucket(t, c, bk)
		setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
		for _, key := range []string{"k", "d/k"} {
			v1 := *put(t, c, bk, key, "one").VersionId
			v2 := *put(t, c, bk, key, "two").VersionId
			crashDelete(t, c, bk, key, "delete marker made")
			m := pendingMarkerOf(t, e, bk, key)
			if _, err := e.be.Unexport(ctx, bk, key); err != nil {
				t.Fatalf("%s: unexport: %v", key, err)
			}
			if got, want := versions(t, c, bk, key, 1000), []string{key + "@" + v1 + "*"}; !slices.Equal(got, want) {
				t.Fatalf("%s: versions after the unexport %v, want %v (no marker %s, no version %s)", key, got, want, m, v2)
			}
			_, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bk, Key: &key})
			wantCode(t, err, "NoSuchKey")
			if a := answerOf(t, "get", err); a.header.Get("x-amz-delete-marker") != "" {
				t.Errorf("%s: GET after the unexport answers as for a delete marker", key)
			}
			for _, id := range []string{v2, m} {
				if _, err := getVersion(t, c, bk, key, id); code(err) != "NoSuchVersion" {
					t.Errorf("%s: GET ?versionId=%s after the unexport: %v, want NoSuchVersion", key, id, err)
				}
			}
			markersSettled(t, e, bk, key)
			if got := versionFiles(t, e, bk, key); !slices.Equal(got, []string{versionPrefix + v1}) {
				t.Fatalf("%s: version directory holds %v, want only version %s", key, got, v1)
			}
			// The file is exported again as a new version.
			oi, err := e.be.Export(ctx, bk, key)
			if err != nil {
				t.Fatalf("%s: export after the unexport: %v", key, err)
			}
			v3 := aws.ToString(headVersion(t, c, bk, key))
			if v3 == v2 || !validVersionID(v3) {
				t.Fatalf("%s: exported again as version %q (ETag %s), want a new one", key, v3, oi.ETag)
			}
			if got, want := versions(t, c, bk, key, 1000), []string{key + "@" + v3 + "*", key + "@" + v1}; !slices.Equal(got, want) {
				t.Fatalf("%s: versions after exporting again %v, want %v", key, got, want)
			}
		}
		verify(t, e, bk, VerifyOptions{Content: true})
	})
}

// headVersion is the version id HEAD answers for bucket/key.
func headVersion(t *testing.T, c *s3.Client, bucket, key string) *string {
	t.Helper()
	out, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: &key})
	if err != nil {
		t.Fatalf("head %s: %v", key, err)
	}
	return out.VersionId
}
