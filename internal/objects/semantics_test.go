package objects

import (
	"errors"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Tests of S3 semantics as AWS documents them, each a deviation found
// in review (docs/objects.md describes the answers).

// httpStatus is the HTTP status of a failed request (0 if none).
func httpStatus(err error) int {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// TestIfUnmodifiedSinceLastModified: If-Unmodified-Since holds when the
// object was last modified at that very time (RFC 9110 13.1.4: the
// condition fails only if the object is more recent), so a GET or HEAD
// conditioned on the Last-Modified a HEAD returned succeeds.
func TestIfUnmodifiedSinceLastModified(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "cond")
	put(t, e.alice, "cond", "k", "body")
	h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("cond"), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	g, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("cond"), Key: aws.String("k"),
		IfUnmodifiedSince: h.LastModified})
	if err != nil {
		t.Fatalf("GET If-Unmodified-Since its own Last-Modified: %v", err)
	}
	g.Body.Close()
	if _, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("cond"), Key: aws.String("k"),
		IfUnmodifiedSince: h.LastModified}); err != nil {
		t.Fatalf("HEAD If-Unmodified-Since its own Last-Modified: %v", err)
	}
	// A second earlier, the object is more recent: 412.
	before := h.LastModified.Add(-1e9)
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("cond"), Key: aws.String("k"),
		IfUnmodifiedSince: &before})
	wantCode(t, err, "PreconditionFailed")
	// The same for a copy's source.
	if _, err := e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("cond"), Key: aws.String("k2"),
		CopySource: aws.String("cond/k"), CopySourceIfUnmodifiedSince: h.LastModified}); err != nil {
		t.Fatalf("copy If-Unmodified-Since the source's Last-Modified: %v", err)
	}
}

// TestCopySourceConditionsFail412: a CopyObject whose
// x-amz-copy-source-if-none-match or -if-modified-since condition is
// false answers 412 PreconditionFailed (AWS CopyObject reference), not
// GET's 304 Not Modified, which is no answer to a PUT, and copies nothing.
func TestCopySourceConditionsFail412(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "cond")
	src := put(t, e.alice, "cond", "src", "source")
	h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("cond"), Key: aws.String("src")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("cond"), Key: aws.String("dst"),
		CopySource: aws.String("cond/src"), CopySourceIfNoneMatch: src.ETag})
	if httpStatus(err) != 412 || code(err) != "PreconditionFailed" {
		t.Errorf("copy-source-if-none-match its ETag: status %d, %v; want 412 PreconditionFailed", httpStatus(err), err)
	}
	_, err = e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("cond"), Key: aws.String("dst"),
		CopySource: aws.String("cond/src"), CopySourceIfModifiedSince: h.LastModified})
	if httpStatus(err) != 412 || code(err) != "PreconditionFailed" {
		t.Errorf("copy-source-if-modified-since its Last-Modified: status %d, %v; want 412 PreconditionFailed", httpStatus(err), err)
	}
	_, err = e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("cond"), Key: aws.String("dst")})
	if httpStatus(err) != 404 {
		t.Errorf("a failed conditional copy wrote the destination: %v", err)
	}
	// GET keeps its 304.
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("cond"), Key: aws.String("src"), IfNoneMatch: src.ETag})
	if httpStatus(err) != 304 {
		t.Errorf("GET If-None-Match its ETag: %v, want 304", err)
	}
}

// TestDeleteIfMatchStar: DeleteObject with If-Match: * deletes the object
// if it exists (AWS "How to perform conditional deletes").
func TestDeleteIfMatchStar(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "cond")
	put(t, e.alice, "cond", "k", "body")
	if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("cond"), Key: aws.String("k"),
		IfMatch: aws.String("*")}); err != nil {
		t.Fatalf("DELETE If-Match: * of an object: %v", err)
	}
	_, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("cond"), Key: aws.String("k")})
	if httpStatus(err) != 404 {
		t.Errorf("object still there after DELETE If-Match: *: %v", err)
	}
}

// TestDeleteObjectsConditional: DeleteObjects honours each object's ETag
// (AWS: conditional deletes of several objects put the ETag in the
// object's element); a mismatch is that key's PreconditionFailed error
// and the object stays.
func TestDeleteObjectsConditional(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "cond")
	a := put(t, e.alice, "cond", "a", "a")
	put(t, e.alice, "cond", "b", "b")
	res, err := e.alice.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String("cond"), Delete: &types.Delete{
		Objects: []types.ObjectIdentifier{
			{Key: aws.String("a"), ETag: a.ETag},
			{Key: aws.String("b"), ETag: aws.String(`"` + md5hex("not b") + `"`)},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deleted) != 1 || aws.ToString(res.Deleted[0].Key) != "a" {
		t.Errorf("deleted %+v, want a", res.Deleted)
	}
	if len(res.Errors) != 1 || aws.ToString(res.Errors[0].Key) != "b" || aws.ToString(res.Errors[0].Code) != "PreconditionFailed" {
		t.Errorf("errors %+v, want b PreconditionFailed", res.Errors)
	}
	if got := get(t, e.alice, "cond", "b"); got != "b" {
		t.Errorf("b after a failed conditional delete: %q", got)
	}
}

// TestDeleteObjectsVersionError: an error deleting a key given with a
// version id is reported for that key and version; s3api matches the
// backend's answers to the request's objects by key and version id, and
// dropped an error without its version id: the key was in neither list.
func TestDeleteObjectsVersionError(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "vers")
	setVersioning(t, e.alice, "vers", types.BucketVersioningStatusEnabled)
	put(t, e.alice, "vers", "k", "v")
	res, err := e.alice.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String("vers"), Delete: &types.Delete{
		Objects: []types.ObjectIdentifier{{Key: aws.String("k"), VersionId: aws.String("not-a-version")}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deleted)+len(res.Errors) != 1 {
		t.Fatalf("one object asked for, answered %d deleted %d errors: %+v", len(res.Deleted), len(res.Errors), res)
	}
	if len(res.Errors) != 1 || aws.ToString(res.Errors[0].VersionId) != "not-a-version" {
		t.Errorf("errors %+v", res.Errors)
	}
}

// uploadPages pages ListMultipartUploads by max (as the aws cli does,
// with both markers) and returns the keys and common prefixes in order;
// before each next page it calls between with the page's uploads.
func uploadPages(t *testing.T, c *s3.Client, bucket, delim string, max int32, between func([]types.MultipartUpload)) []string {
	t.Helper()
	var got []string
	in := &s3.ListMultipartUploadsInput{Bucket: &bucket, MaxUploads: &max}
	if delim != "" {
		in.Delimiter = &delim
	}
	for i := 0; ; i++ {
		if i == 20 {
			t.Fatalf("no end after 20 pages: %v", got)
		}
		out, err := c.ListMultipartUploads(ctx, in)
		if err != nil {
			t.Fatalf("page %d (key-marker %q, upload-id-marker %q): %v (so far %v)", i+1,
				aws.ToString(in.KeyMarker), aws.ToString(in.UploadIdMarker), err, got)
		}
		for _, u := range out.Uploads {
			got = append(got, *u.Key)
		}
		for _, p := range out.CommonPrefixes {
			got = append(got, *p.Prefix)
		}
		if between != nil {
			between(out.Uploads)
		}
		if !aws.ToBool(out.IsTruncated) {
			return got
		}
		in.KeyMarker, in.UploadIdMarker = out.NextKeyMarker, out.NextUploadIdMarker
	}
}

func createUploads(t *testing.T, c *s3.Client, bucket string, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &bucket, Key: aws.String(k)}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestListUploadsPrefixMarker: a page of ListMultipartUploads that ends
// with a common prefix is followed by the uploads after that prefix, not
// by the prefix again (then an InvalidArgument for the upload-id marker).
func TestListUploadsPrefixMarker(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "ups")
	createUploads(t, e.alice, "ups", "dir/a", "dir/b", "z")
	if got := uploadPages(t, e.alice, "ups", "/", 1, nil); !slices.Equal(got, []string{"dir/", "z"}) {
		t.Errorf("pages of one: %v, want [dir/ z]", got)
	}
}

// TestListUploadsAbortWhilePaging: the upload-id marker is a position,
// not a reference: aborting the uploads of a page before asking for the
// next (the usual "abort every upload" loop) lists every other upload
// once, instead of failing with InvalidArgument because the marker's
// upload is gone.
func TestListUploadsAbortWhilePaging(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "ups")
	all := []string{"a", "a", "a", "b", "c", "c"}
	createUploads(t, e.alice, "ups", all...)
	abort := func(ups []types.MultipartUpload) {
		for _, u := range ups {
			if _, err := e.alice.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String("ups"),
				Key: u.Key, UploadId: u.UploadId}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, max := range []int32{1, 2} {
		if got := uploadPages(t, e.alice, "ups", "", max, nil); !slices.Equal(got, all) {
			t.Errorf("pages of %d: %v", max, got)
		}
	}
	if got := uploadPages(t, e.alice, "ups", "", 2, abort); !slices.Equal(got, all) {
		t.Errorf("pages of 2, aborting each page: %v", got)
	}
	if got := uploadPages(t, e.alice, "ups", "", 1000, nil); len(got) != 0 {
		t.Errorf("uploads left: %v", got)
	}
}

// TestUploadOrderWithinKey: the uploads of one key are listed in the
// order they were initiated (AWS ListMultipartUploads).
func TestUploadOrderWithinKey(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "ups")
	var ids []string
	for range 8 {
		up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("ups"), Key: aws.String("k")})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, *up.UploadId)
	}
	out, err := e.alice.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("ups")})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range out.Uploads {
		got = append(got, *u.UploadId)
	}
	if !slices.Equal(got, ids) {
		t.Errorf("uploads listed in the order %v, initiated %v", got, ids)
	}
}

// TestListUploadsMaxZero: max-uploads=0 answers an empty page that is not
// truncated (as max-keys=0 does for the listings), not every upload.
func TestListUploadsMaxZero(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "ups")
	createUploads(t, e.alice, "ups", "a", "b")
	out, err := e.alice.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("ups"), MaxUploads: aws.Int32(0)})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Uploads) != 0 || len(out.CommonPrefixes) != 0 || aws.ToBool(out.IsTruncated) {
		t.Fatalf("max-uploads=0: %d uploads, %d prefixes, truncated %v", len(out.Uploads), len(out.CommonPrefixes), aws.ToBool(out.IsTruncated))
	}
}
