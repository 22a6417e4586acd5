package objects

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// pendingMarkerOf returns the id (as S3 shows it) of the one delete
// marker in key's version directory, failing if there is not exactly one.
func pendingMarkerOf(t *testing.T, e *env, bucket, key string) string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.root, bucket, versionsDir, filepath.FromSlash(key)))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range ents {
		if vid, marker, ok := parseVersionName(d.Name()); ok && marker {
			ids = append(ids, vid)
		}
	}
	if len(ids) != 1 {
		t.Fatalf("%s: delete markers %v, want one", key, ids)
	}
	return ids[0]
}

// TestPendingMarkerIsNoVersion: a versioned DELETE that stopped (a crash)
// after renaming its marker into place and before unlinking the current
// object left a marker that is not in effect: ListObjectVersions leaves
// it out. GET, HEAD and a copy's source naming its id must agree, and
// answer as for a version that does not exist (404 NoSuchVersion), not
// with a delete marker's 405; before, they answered 405 MethodNotAllowed
// (and the copy 400 InvalidRequest). DELETE (and DeleteObjects) of its
// id answer as S3 does for a version id that does not exist — success,
// not as a delete marker — and remove it with the link the DELETE kept
// of the current object, which stays as it was.
func TestPendingMarkerIsNoVersion(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c := e.alice
		for _, status := range []types.BucketVersioningStatus{types.BucketVersioningStatusEnabled, types.BucketVersioningStatusSuspended} {
			bk := "vpending-" + strings.ToLower(string(status))
			mkBucket(t, c, bk)
			setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
			for i, key := range []string{"k", "d/k"} {
				v1 := *put(t, c, bk, key, "one").VersionId
				v2 := *put(t, c, bk, key, "two").VersionId
				setVersioning(t, c, bk, status)
				want := []string{key + "@" + v2 + "*", key + "@" + v1}

				crash := func() string {
					t.Helper()
					failAtStep(t, "delete marker made")
					_, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bk, Key: &key})
					fsFault.Store(nil)
					if err == nil {
						t.Fatalf("%s %s: the DELETE did not reach its marker", status, key)
					}
					if got := versions(t, c, bk, key, 1000); !sameVersions(got, want) {
						t.Fatalf("%s %s: versions after the crash %v, want %v", status, key, got, want)
					}
					return pendingMarkerOf(t, e, bk, key)
				}
				m := crash()

				_, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bk, Key: &key, VersionId: &m})
				if code(err) != "NoSuchVersion" {
					t.Errorf("%s %s: GET ?versionId=%s of a marker not in effect: %v, want NoSuchVersion", status, key, m, err)
				}
				if err != nil {
					if a := answerOf(t, "get", err); a.status != 404 || a.header.Get("x-amz-delete-marker") != "" {
						t.Errorf("%s %s: GET ?versionId=%s: %d, x-amz-delete-marker %q; want 404 and none", status, key, m,
							a.status, a.header.Get("x-amz-delete-marker"))
					}
				}
				_, err = c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bk, Key: &key, VersionId: &m})
				if err == nil {
					t.Fatalf("%s %s: HEAD ?versionId=%s of a marker not in effect succeeded", status, key, m)
				}
				if a := answerOf(t, "head", err); a.status != 404 || a.header.Get("x-amz-delete-marker") != "" {
					t.Errorf("%s %s: HEAD ?versionId=%s: %d, x-amz-delete-marker %q; want 404 and none", status, key, m,
						a.status, a.header.Get("x-amz-delete-marker"))
				}
				_, err = c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: &bk, Key: aws.String("copy"),
					CopySource: aws.String(bk + "/" + key + "?versionId=" + m)})
				if code(err) != "NoSuchVersion" {
					t.Errorf("%s %s: copy from ?versionId=%s of a marker not in effect: %v, want NoSuchVersion", status, key, m, err)
				}
				// The object is what it was, under its own id too.
				if got := get(t, c, bk, key); got != "two" {
					t.Fatalf("%s %s: GET answers %q, want %q", status, key, got, "two")
				}
				if got, err := getVersion(t, c, bk, key, v2); err != nil || got != "two" {
					t.Fatalf("%s %s: GET ?versionId=%s: %q %v", status, key, v2, got, err)
				}

				// DELETE of its id: no such version; the marker goes.
				var del *s3.DeleteObjectOutput
				if i == 0 {
					del = delVersion(t, c, bk, key, m)
				} else {
					out, err := c.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: &bk, Delete: &types.Delete{
						Objects: []types.ObjectIdentifier{{Key: aws.String(key), VersionId: &m}}}})
					if err != nil || len(out.Errors) != 0 || len(out.Deleted) != 1 {
						t.Fatalf("%s %s: DeleteObjects ?versionId=%s: %v %+v", status, key, m, err, out)
					}
					del = &s3.DeleteObjectOutput{DeleteMarker: out.Deleted[0].DeleteMarker, VersionId: out.Deleted[0].VersionId}
				}
				if aws.ToBool(del.DeleteMarker) {
					t.Errorf("%s %s: DELETE ?versionId=%s answered as the deletion of a delete marker", status, key, m)
				}
				if got := versions(t, c, bk, key, 1000); !sameVersions(got, want) {
					t.Fatalf("%s %s: versions after DELETE ?versionId=%s: %v, want %v", status, key, m, got, want)
				}
				if got := get(t, c, bk, key); got != "two" {
					t.Fatalf("%s %s: after DELETE ?versionId=%s GET answers %q", status, key, m, got)
				}
				markersSettled(t, e, bk, key)
				vdir := filepath.Join(e.root, bk, versionsDir, filepath.FromSlash(key))
				if names := files(t, vdir); !slices.Equal(names, []string{versionPrefix + v1}) {
					t.Fatalf("%s %s: version directory holds %v, want only version %s", status, key, names, v1)
				}
				setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
			}
			verify(t, e, bk, VerifyOptions{Content: true})
		}
		noTempLeft(t, e)
	})
}
