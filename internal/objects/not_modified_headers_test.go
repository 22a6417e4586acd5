package objects

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestNotModifiedHeaders: a GET's or HEAD's 304 Not Modified (If-None-Match
// or If-Modified-Since) carries the object's ETag and Last-Modified, and
// its Cache-Control, Expires and version id where it has them, as S3's
// does and RFC 9110 15.4.5 requires of a 304 (the fields a 200 would have
// sent): a cache revalidating its copy takes them from the 304. A 412 is
// no such answer and carries none. Before, s3api answered the 304 with
// no field of the object at all.
func TestNotModifiedHeaders(t *testing.T) {
	e := newMiddlewareEnv(t)
	c := e.alice
	mkBucket(t, c, "notmod")
	expires := time.Date(2032, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("notmod"), Key: aws.String("k"), Body: strings.NewReader("x"),
		CacheControl: aws.String("max-age=300"), Expires: &expires}); err != nil {
		t.Fatal(err)
	}
	mkBucket(t, c, "notmod-versions")
	setVersioning(t, c, "notmod-versions", types.BucketVersioningStatusEnabled)
	vid := aws.ToString(put(t, c, "notmod-versions", "k", "y").VersionId)

	for _, tc := range []struct {
		bucket  string
		want    map[string]string
		without []string
	}{
		{"notmod", map[string]string{"Cache-Control": "max-age=300", "Expires": expires.Format(http.TimeFormat)}, []string{"x-amz-version-id"}},
		{"notmod-versions", map[string]string{"x-amz-version-id": vid}, []string{"Cache-Control", "Expires"}},
	} {
		h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(tc.bucket), Key: aws.String("k")})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"ETag": aws.ToString(h.ETag), "Last-Modified": h.LastModified.UTC().Format(http.TimeFormat)}
		for k, v := range tc.want {
			want[k] = v
		}
		check := func(what string, err error) {
			t.Helper()
			a := answerOf(t, what, err)
			if a.status != http.StatusNotModified {
				t.Fatalf("%s: status %d, want 304", what, a.status)
			}
			for k, v := range want {
				if got := a.header.Get(k); got != v {
					t.Errorf("%s: %s %q, want %q", what, k, got, v)
				}
			}
			for _, k := range tc.without {
				if got := a.header.Get(k); got != "" {
					t.Errorf("%s: %s %q, want none", what, k, got)
				}
			}
		}
		_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(tc.bucket), Key: aws.String("k"), IfNoneMatch: h.ETag})
		check(tc.bucket+": GET If-None-Match", err)
		_, err = c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(tc.bucket), Key: aws.String("k"), IfNoneMatch: h.ETag})
		check(tc.bucket+": HEAD If-None-Match", err)
		_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(tc.bucket), Key: aws.String("k"), IfModifiedSince: h.LastModified})
		check(tc.bucket+": GET If-Modified-Since", err)
		_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(tc.bucket), Key: aws.String("k"), VersionId: h.VersionId,
			IfNoneMatch: h.ETag})
		check(tc.bucket+": GET of a version If-None-Match", err)

		_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(tc.bucket), Key: aws.String("k"), IfMatch: aws.String(`"other"`)})
		if a := answerOf(t, "GET If-Match fails", err); a.status != http.StatusPreconditionFailed || a.header.Get("ETag") != "" {
			t.Errorf("%s: GET If-Match fails: status %d ETag %q, want 412 without ETag", tc.bucket, a.status, a.header.Get("ETag"))
		}
	}
}
