package objects

import (
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestDeleteObjectsQuiet: a DeleteObjects in quiet mode (<Quiet>true</Quiet>)
// answers only the keys it could not delete (AWS DeleteObjects: "In quiet
// mode the response includes only keys where the delete operation
// encountered an error"), and still deletes the others; without quiet
// mode, or with <Quiet>false</Quiet>, every key is answered. Deleting a
// key that does not exist succeeds, as in S3. Before, s3api dropped
// Quiet and basalt answered every deleted key.
func TestDeleteObjectsQuiet(t *testing.T) {
	e := newEnv(t, false)
	c := e.alice
	mkBucket(t, c, "quiet")
	ids := func(keys ...string) []types.ObjectIdentifier {
		var out []types.ObjectIdentifier
		for _, k := range keys {
			out = append(out, types.ObjectIdentifier{Key: aws.String(k)})
		}
		return out
	}
	errKeys := func(out *s3.DeleteObjectsOutput) []string {
		var ks []string
		for _, e := range out.Errors {
			ks = append(ks, aws.ToString(e.Key)+":"+aws.ToString(e.Code))
		}
		return ks
	}
	deleted := func(out *s3.DeleteObjectsOutput) []string {
		var ks []string
		for _, d := range out.Deleted {
			ks = append(ks, aws.ToString(d.Key))
		}
		slices.Sort(ks)
		return ks
	}

	for _, quiet := range []*bool{aws.Bool(true), aws.Bool(false), nil} {
		put(t, c, "quiet", "a", "a")
		put(t, c, "quiet", "d/b", "b")
		objs := append(ids("a", "d/b", "missing"),
			types.ObjectIdentifier{Key: aws.String("a"), VersionId: aws.String("not-a-version-id")})
		out, err := c.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String("quiet"),
			Delete: &types.Delete{Objects: objs, Quiet: quiet}})
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		if !aws.ToBool(quiet) {
			want = []string{"a", "d/b", "missing"}
		}
		if got := deleted(out); !slices.Equal(got, want) {
			t.Errorf("quiet %v: deleted %v, want %v", aws.ToBool(quiet), got, want)
		}
		if got := errKeys(out); !slices.Equal(got, []string{"a:InvalidArgument"}) {
			t.Errorf("quiet %v: errors %v, want the bad version id's", aws.ToBool(quiet), got)
		}
		if left := keys(t, c, "quiet", "", 1000); len(left) != 0 {
			t.Fatalf("quiet %v: keys left %v", aws.ToBool(quiet), left)
		}
	}

	// Keys refused before the backend (another user's bucket) are errors,
	// answered in quiet mode too.
	out, err := e.bob.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String("quiet"),
		Delete: &types.Delete{Objects: ids("x"), Quiet: aws.Bool(true)}})
	if err != nil || !slices.Equal(errKeys(out), []string{"x:AccessDenied"}) || len(out.Deleted) != 0 {
		t.Fatalf("bob's quiet delete in alice's bucket: %+v, %v", out, err)
	}

	// Versioned: the delete markers are made, and not answered.
	mkBucket(t, c, "quiet-versions")
	setVersioning(t, c, "quiet-versions", types.BucketVersioningStatusEnabled)
	put(t, c, "quiet-versions", "k", "v1")
	out, err = c.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String("quiet-versions"),
		Delete: &types.Delete{Objects: ids("k", "never"), Quiet: aws.Bool(true)}})
	if err != nil || len(out.Deleted) != 0 || len(out.Errors) != 0 {
		t.Fatalf("quiet delete in a versioned bucket: deleted %v errors %v, %v", deleted(out), errKeys(out), err)
	}
	v, err := c.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: aws.String("quiet-versions")})
	if err != nil || len(v.DeleteMarkers) != 2 || len(v.Versions) != 1 {
		t.Fatalf("versions after a quiet delete: %d markers, %d versions, %v", len(v.DeleteMarkers), len(v.Versions), err)
	}
}
