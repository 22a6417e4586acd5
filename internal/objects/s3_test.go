package objects

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/crc64"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sys/unix"
)

var ctx = context.Background()

func put(t *testing.T, c *s3.Client, bucket, key, body string) *s3.PutObjectOutput {
	t.Helper()
	out, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader(body)})
	if err != nil {
		t.Fatalf("put %s/%s: %v", bucket, key, err)
	}
	return out
}

func get(t *testing.T, c *s3.Client, bucket, key string) string {
	t.Helper()
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	if err != nil {
		t.Fatalf("get %s/%s: %v", bucket, key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func md5hex(s string) string {
	h := md5.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}

func mkBucket(t *testing.T, c *s3.Client, name string) {
	t.Helper()
	if _, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &name}); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
}

// keys lists all keys of bucket with ListObjectsV2 (pages of max).
func keys(t *testing.T, c *s3.Client, bucket, prefix string, max int32) []string {
	t.Helper()
	var out []string
	p := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: &prefix, MaxKeys: &max})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page.Contents {
			out = append(out, *o.Key)
		}
	}
	return out
}

func TestS3(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		t.Run("Buckets", e.testBuckets)
		t.Run("Objects", e.testObjects)
		t.Run("ChangedBehindS3", e.testChanged)
		t.Run("Invisible", e.testInvisible)
		t.Run("List", e.testList)
		t.Run("BadKeys", e.testBadKeys)
		t.Run("Multipart", e.testMultipart)
		t.Run("Copy", e.testCopy)
		t.Run("DeleteBucket", e.testDeleteBucket)
		noTempLeft(t, e)
	})
}

func (e *env) testBuckets(t *testing.T) {
	mkBucket(t, e.alice, "alpha")
	mkBucket(t, e.bob, "bravo")
	rec, err := e.buckets.Bucket(ctx, "alpha")
	if err != nil || rec.Owner != "alice" || rec.OwnerAccess != "AKALICE" {
		t.Fatalf("record %+v, %v", rec, err)
	}
	if fi, err := os.Stat(filepath.Join(e.root, "alpha")); err != nil || !fi.IsDir() {
		t.Fatalf("bucket directory: %v", err)
	}
	_, err = e.alice.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("alpha")})
	wantCode(t, err, "BucketAlreadyOwnedByYou")
	_, err = e.bob.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("alpha")})
	wantCode(t, err, "BucketAlreadyExists")
	_, err = e.alice.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("Bad_Name")})
	wantCode(t, err, "InvalidBucketName")

	if _, err := e.alice.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String("alpha")}); err != nil {
		t.Fatal(err)
	}
	_, err = e.bob.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String("alpha")})
	if err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("bob heads alice's bucket: %v", err)
	}
	_, err = e.alice.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String("nobucket")})
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("head of a missing bucket: %v", err)
	}
	_, err = e.bob.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("alpha")})
	wantCode(t, err, "AccessDenied")
	_, err = e.bob.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("alpha"), Key: aws.String("x"), Body: strings.NewReader("x")})
	wantCode(t, err, "AccessDenied")

	names := func(c *s3.Client) []string {
		out, err := c.ListBuckets(ctx, &s3.ListBucketsInput{})
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, b := range out.Buckets {
			n = append(n, *b.Name)
		}
		return n
	}
	if got := names(e.alice); !slices.Equal(got, []string{"alpha"}) {
		t.Errorf("alice's buckets: %v", got)
	}
	if got := names(e.bob); !slices.Equal(got, []string{"bravo"}) {
		t.Errorf("bob's buckets: %v", got)
	}
	if got := names(e.admin); !slices.Equal(got, []string{"alpha", "bravo"}) {
		t.Errorf("admin's buckets: %v", got)
	}

	v, err := e.alice.GetBucketVersioning(ctx, &s3.GetBucketVersioningInput{Bucket: aws.String("alpha")})
	if err != nil || v.Status != "" {
		t.Fatalf("versioning %q, %v", v.Status, err)
	}
	_, err = e.alice.PutBucketVersioning(ctx, &s3.PutBucketVersioningInput{Bucket: aws.String("bravo"),
		VersioningConfiguration: &types.VersioningConfiguration{Status: types.BucketVersioningStatusEnabled}})
	wantCode(t, err, "AccessDenied")
	mkBucket(t, e.alice, "alpha-versions")
	_, err = e.alice.PutBucketVersioning(ctx, &s3.PutBucketVersioningInput{Bucket: aws.String("alpha-versions"),
		VersioningConfiguration: &types.VersioningConfiguration{Status: types.BucketVersioningStatusEnabled}})
	if err != nil {
		t.Fatal(err)
	}
	v, err = e.alice.GetBucketVersioning(ctx, &s3.GetBucketVersioningInput{Bucket: aws.String("alpha-versions")})
	if err != nil || v.Status != types.BucketVersioningStatusEnabled {
		t.Fatalf("versioning %q, %v", v.Status, err)
	}
	if rec, _ := e.buckets.Bucket(ctx, "alpha-versions"); rec.Versioning != "Enabled" {
		t.Fatalf("record versioning %q", rec.Versioning)
	}
	if _, err := e.alice.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String("alpha-versions")}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) testObjects(t *testing.T) {
	const body = "hello, plain files\n"
	out, err := e.alice.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String("alpha"), Key: aws.String("dir/sub/hello.txt"), Body: strings.NewReader(body),
		ContentType: aws.String("text/plain"), Metadata: map[string]string{"colour": "blue"},
		ChecksumAlgorithm: types.ChecksumAlgorithmSha256,
	})
	if err != nil {
		t.Fatal(err)
	}
	if *out.ETag != `"`+md5hex(body)+`"` {
		t.Errorf("ETag %s, want md5 %s", *out.ETag, md5hex(body))
	}
	if out.ChecksumSHA256 == nil {
		t.Errorf("no SHA-256 checksum in the PUT response")
	}
	// The file holds exactly the object's bytes.
	data, err := os.ReadFile(filepath.Join(e.root, "alpha", "dir", "sub", "hello.txt"))
	if err != nil || string(data) != body {
		t.Fatalf("backing file %q, %v", data, err)
	}
	g, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String("dir/sub/hello.txt"),
		ChecksumMode: types.ChecksumModeEnabled})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(g.Body)
	g.Body.Close()
	if string(got) != body || *g.ETag != *out.ETag || aws.ToString(g.ContentType) != "text/plain" ||
		g.Metadata["colour"] != "blue" || aws.ToString(g.ChecksumSHA256) != aws.ToString(out.ChecksumSHA256) {
		t.Errorf("get: %q etag %s type %s meta %v sha256 %v", got, *g.ETag, aws.ToString(g.ContentType), g.Metadata,
			aws.ToString(g.ChecksumSHA256))
	}

	// Ranges.
	for rng, want := range map[string]string{"bytes=0-4": "hello", "bytes=7-": body[7:], "bytes=-6": body[len(body)-6:]} {
		g, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String("dir/sub/hello.txt"),
			Range: aws.String(rng)})
		if err != nil {
			t.Fatal(rng, err)
		}
		got, _ := io.ReadAll(g.Body)
		g.Body.Close()
		if string(got) != want || aws.ToString(g.ContentRange) == "" {
			t.Errorf("range %s: %q (content-range %q), want %q", rng, got, aws.ToString(g.ContentRange), want)
		}
	}
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String("dir/sub/hello.txt"),
		Range: aws.String("bytes=100-200")})
	wantCode(t, err, "InvalidRange")

	h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("alpha"), Key: aws.String("dir/sub/hello.txt")})
	if err != nil || aws.ToInt64(h.ContentLength) != int64(len(body)) || *h.ETag != *out.ETag {
		t.Fatalf("head: %+v, %v", h, err)
	}
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String("dir/missing")})
	wantCode(t, err, "NoSuchKey")
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("nobucket"), Key: aws.String("x")})
	wantCode(t, err, "NoSuchBucket")
	_, err = e.bob.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String("dir/sub/hello.txt")})
	wantCode(t, err, "AccessDenied")

	// A wrong checksum is refused and the old object stays.
	_, err = e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("alpha"), Key: aws.String("dir/sub/hello.txt"),
		Body: strings.NewReader("other"), ChecksumCRC32: aws.String("AAAAAA==")})
	wantCode(t, err, "BadDigest")
	if got := get(t, e.alice, "alpha", "dir/sub/hello.txt"); got != body {
		t.Fatalf("after a failed PUT: %q", got)
	}

	// Overwrite, then delete: the file and its empty directories go.
	put(t, e.alice, "alpha", "dir/sub/hello.txt", "v2")
	if got := get(t, e.alice, "alpha", "dir/sub/hello.txt"); got != "v2" {
		t.Fatalf("after overwrite: %q", got)
	}
	put(t, e.alice, "alpha", "empty", "")
	if got := get(t, e.alice, "alpha", "empty"); got != "" {
		t.Fatalf("empty object: %q", got)
	}
	if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String("dir/sub/hello.txt")}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.root, "alpha", "dir")); !os.IsNotExist(err) {
		t.Errorf("empty directories remain: %v", err)
	}
	if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String("never")}); err != nil {
		t.Errorf("delete of a missing key: %v", err)
	}
	put(t, e.alice, "alpha", "d/1", "1")
	put(t, e.alice, "alpha", "d/2", "2")
	res, err := e.alice.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String("alpha"), Delete: &types.Delete{
		Objects: []types.ObjectIdentifier{{Key: aws.String("d/1")}, {Key: aws.String("d/2")}, {Key: aws.String("empty")}}}})
	if err != nil || len(res.Deleted) != 3 || len(res.Errors) != 0 {
		t.Fatalf("delete objects: %+v, %v", res, err)
	}
	if left := files(t, filepath.Join(e.root, "alpha")); len(left) != 0 {
		t.Fatalf("files left: %v", left)
	}

	// Preconditions.
	p := put(t, e.alice, "alpha", "cond", "c")
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cond"), IfMatch: aws.String(`"nope"`)})
	wantCode(t, err, "PreconditionFailed")
	ch, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cond")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cond"),
		IfModifiedSince: ch.LastModified})
	if err == nil || !strings.Contains(err.Error(), "304") {
		t.Errorf("If-Modified-Since its own Last-Modified: %v", err)
	}
	_, err = e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cond"),
		Body: strings.NewReader("d"), IfNoneMatch: aws.String("*")})
	wantCode(t, err, "PreconditionFailed")
	if _, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cond"),
		Body: strings.NewReader("d"), IfMatch: p.ETag}); err != nil {
		t.Fatal(err)
	}
	e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cond")})
}

func (e *env) testChanged(t *testing.T) {
	path := filepath.Join(e.root, "alpha", "ch", "file")
	put(t, e.alice, "alpha", "ch/file", "original")
	put(t, e.alice, "alpha", "ch/touched", "same bytes")

	// Appended to behind S3.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(" and more")
	f.Close()
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String("ch/file")})
	wantCode(t, err, "ObjectModifiedOutsideS3")
	if !strings.Contains(err.Error(), "alpha/ch/file") || !strings.Contains(err.Error(), "409") {
		t.Errorf("error does not name the object or is not 409: %v", err)
	}
	_, err = e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("alpha"), Key: aws.String("ch/file")})
	if err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("head of a changed object: %v", err)
	}

	// Only the mtime changed.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(e.root, "alpha", "ch", "touched"), later, later); err != nil {
		t.Fatal(err)
	}
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String("ch/touched")})
	wantCode(t, err, "ObjectModifiedOutsideS3")

	// Listings flag both.
	l, err := e.alice.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("alpha"), Prefix: aws.String("ch/")})
	if err != nil || len(l.Contents) != 2 {
		t.Fatalf("list: %+v, %v", l, err)
	}
	for _, o := range l.Contents {
		if o.StorageClass != storageClassModified || o.ETag != nil {
			t.Errorf("%s listed as %s etag %v", *o.Key, o.StorageClass, aws.ToString(o.ETag))
		}
	}
	if aws.ToInt64(l.Contents[0].Size) != int64(len("original and more")) {
		t.Errorf("changed file listed with size %d", aws.ToInt64(l.Contents[0].Size))
	}

	// Replaced by another file (new inode): with xattrs the new file has
	// no metadata and is not an object; with a sidecar it is a changed object.
	put(t, e.alice, "alpha", "ch/replaced", "one")
	tmp := filepath.Join(e.root, "alpha", "ch", "new")
	os.WriteFile(tmp, []byte("two"), 0o644)
	if err := os.Rename(tmp, filepath.Join(e.root, "alpha", "ch", "replaced")); err != nil {
		t.Fatal(err)
	}
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String("ch/replaced")})
	want := "NoSuchKey"
	if e.be.MetadataKind() == "sidecar" {
		want = "ObjectModifiedOutsideS3"
	}
	wantCode(t, err, want)

	// Changed objects can be overwritten and deleted through S3.
	put(t, e.alice, "alpha", "ch/file", "fresh")
	if got := get(t, e.alice, "alpha", "ch/file"); got != "fresh" {
		t.Fatalf("after overwrite: %q", got)
	}
	for _, k := range []string{"ch/file", "ch/touched", "ch/replaced"} {
		if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String(k)}); err != nil {
			t.Fatal(err)
		}
	}
	// The xattr-less replacement was no object: it is left alone.
	os.Remove(filepath.Join(e.root, "alpha", "ch", "replaced"))
	os.Remove(filepath.Join(e.root, "alpha", "ch"))
	if left := files(t, filepath.Join(e.root, "alpha")); len(left) != 0 {
		t.Fatalf("files left: %v", left)
	}
}

func (e *env) testInvisible(t *testing.T) {
	dir := filepath.Join(e.root, "alpha")
	put(t, e.alice, "alpha", "seen", "s")
	os.WriteFile(filepath.Join(dir, "dropped.txt"), []byte("direct"), 0o644)
	os.MkdirAll(filepath.Join(dir, "dropdir", "deeper"), 0o755)
	os.WriteFile(filepath.Join(dir, "dropdir", "deeper", "x"), []byte("direct"), 0o644)
	outside := filepath.Join(e.dir, "outside")
	os.MkdirAll(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "passwd"), []byte("secret"), 0o644)
	os.Symlink(outside, filepath.Join(dir, "evil"))
	os.Symlink(filepath.Join(outside, "passwd"), filepath.Join(dir, "passwd"))
	defer func() {
		for _, p := range []string{"dropped.txt", "dropdir", "evil", "passwd"} {
			os.RemoveAll(filepath.Join(dir, p))
		}
		os.RemoveAll(outside)
		e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String("seen")})
	}()
	for _, k := range []string{"dropped.txt", "dropdir/deeper/x", "evil/passwd", "passwd"} {
		_, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String(k)})
		wantCode(t, err, "NoSuchKey")
	}
	if got := keys(t, e.alice, "alpha", "", 1000); !slices.Equal(got, []string{"seen"}) {
		t.Errorf("listing shows %v", got)
	}
	l, err := e.alice.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("alpha"), Delimiter: aws.String("/")})
	if err != nil || len(l.CommonPrefixes) != 0 || len(l.Contents) != 1 {
		t.Errorf("delimited listing: %d objects, prefixes %v, %v", len(l.Contents), l.CommonPrefixes, err)
	}
	// Deleting a file that is not an object changes nothing.
	if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String("dropped.txt")}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "dropped.txt")); err != nil {
		t.Errorf("a file that is not an object was deleted: %v", err)
	}
	// Nor does a PUT replace it: it may be the only copy of someone's data.
	_, err = e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("alpha"), Key: aws.String("dropped.txt"),
		Body: strings.NewReader("over S3")})
	wantCode(t, err, "KeyHoldsUnexportedFile")
	if got, _ := os.ReadFile(filepath.Join(dir, "dropped.txt")); string(got) != "direct" {
		t.Errorf("a refused PUT changed the file: %q", got)
	}
	// Writing through a symlink that leaves the bucket is refused.
	_, err = e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("alpha"), Key: aws.String("evil/basalt-test"),
		Body: strings.NewReader("x")})
	if err == nil {
		t.Errorf("PUT through a symlink out of the bucket succeeded")
	}
	if got := files(t, outside); !slices.Equal(got, []string{"passwd"}) {
		t.Fatalf("wrote outside the bucket: %v", got)
	}
}

func (e *env) testList(t *testing.T) {
	all := []string{"a/1", "a/2", "a/b/3", "a/b/c/4", "a0", "b", "c/d", "e-f/g", "zz"}
	for _, k := range all {
		put(t, e.alice, "alpha", k, k)
	}
	defer func() {
		for _, k := range all {
			e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String(k)})
		}
	}()
	for _, max := range []int32{1, 2, 3, 1000} {
		if got := keys(t, e.alice, "alpha", "", max); !slices.Equal(got, all) {
			t.Errorf("max-keys %d: %v", max, got)
		}
	}
	if got := keys(t, e.alice, "alpha", "a/", 2); !slices.Equal(got, []string{"a/1", "a/2", "a/b/3", "a/b/c/4"}) {
		t.Errorf("prefix a/: %v", got)
	}
	if got := keys(t, e.alice, "alpha", "a", 1000); !slices.Equal(got, []string{"a/1", "a/2", "a/b/3", "a/b/c/4", "a0"}) {
		t.Errorf("prefix a: %v", got)
	}
	l, err := e.alice.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("alpha"), Delimiter: aws.String("/")})
	if err != nil {
		t.Fatal(err)
	}
	var objs, cps []string
	for _, o := range l.Contents {
		objs = append(objs, *o.Key)
	}
	for _, p := range l.CommonPrefixes {
		cps = append(cps, *p.Prefix)
	}
	slices.Sort(cps)
	if !slices.Equal(objs, []string{"a0", "b", "zz"}) || !slices.Equal(cps, []string{"a/", "c/", "e-f/"}) {
		t.Errorf("delimiter /: objects %v prefixes %v", objs, cps)
	}
	l, err = e.alice.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("alpha"), Prefix: aws.String("a/"),
		Delimiter: aws.String("/")})
	if err != nil || len(l.Contents) != 2 || len(l.CommonPrefixes) != 1 || *l.CommonPrefixes[0].Prefix != "a/b/" {
		t.Errorf("prefix a/ delimiter /: %+v %v", l, err)
	}
	// Version 1 with a marker.
	l1, err := e.alice.ListObjects(ctx, &s3.ListObjectsInput{Bucket: aws.String("alpha"), Marker: aws.String("a0"),
		MaxKeys: aws.Int32(2)})
	if err != nil || len(l1.Contents) != 2 || *l1.Contents[0].Key != "b" || !aws.ToBool(l1.IsTruncated) {
		t.Fatalf("list v1: %+v %v", l1, err)
	}
	if *l1.Contents[0].ETag != `"`+md5hex("b")+`"` || aws.ToInt64(l1.Contents[0].Size) != 1 {
		t.Errorf("list entry %+v", l1.Contents[0])
	}
	// StartAfter.
	l, err = e.alice.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("alpha"), StartAfter: aws.String("c/d")})
	if err != nil || len(l.Contents) != 2 || *l.Contents[0].Key != "e-f/g" {
		t.Errorf("start-after: %+v %v", l, err)
	}
}

func (e *env) testBadKeys(t *testing.T) {
	before := files(t, e.dir)
	bad := []string{
		"a//b", "a/../b", "../escape", "a/..", "./a", "a/./b", "/lead", "trail/", ".basalt-versions/x",
		strings.Repeat("n", 256), strings.Repeat("k/", 520), "bad\xffutf8", "nul\x00byte", "ctl\x01char",
	}
	for _, k := range bad {
		_, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("alpha"), Key: aws.String(k),
			Body: strings.NewReader("x")})
		if err == nil {
			t.Errorf("PUT %q succeeded", k)
			continue
		}
		c := code(err)
		if c != "InvalidArgument" && c != "KeyTooLongError" && c != "BadRequest" && !strings.Contains(err.Error(), "StatusCode: 400") {
			t.Errorf("PUT %q: %v", k, err)
		}
		_, err = e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("alpha"), Key: aws.String(k)})
		if err == nil {
			t.Errorf("multipart upload of %q created", k)
		}
	}
	// Reads of keys that cannot be objects find nothing; deletes do nothing.
	for _, k := range []string{"a//b", "trail/", "bad\xffutf8", ".basalt-x"} {
		_, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String(k)})
		wantCode(t, err, "NoSuchKey")
		if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String(k)}); err != nil {
			t.Errorf("DELETE %q: %v", k, err)
		}
	}
	_, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("alpha"), Key: aws.String("a//b"), Body: strings.NewReader("x")})
	if !strings.Contains(err.Error(), "empty path component") {
		t.Errorf("a//b: the message does not say why: %v", err)
	}
	if after := files(t, e.dir); !slices.Equal(before, after) {
		t.Errorf("files changed: before %v after %v", before, after)
	}
}

func (e *env) testMultipart(t *testing.T) {
	const mib = 1 << 20
	p1 := bytes.Repeat([]byte("1"), 5*mib)
	p2 := []byte("the last part may be small")
	up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("alpha"),
		Key: aws.String("mp/big"), ContentType: aws.String("application/x-big"), Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	var done []types.CompletedPart
	for i, p := range [][]byte{p1, p2} {
		out, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("alpha"), Key: aws.String("mp/big"),
			UploadId: up.UploadId, PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(p)})
		if err != nil {
			t.Fatal(err)
		}
		done = append(done, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))})
	}
	lp, err := e.alice.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String("alpha"), Key: aws.String("mp/big"), UploadId: up.UploadId})
	if err != nil || len(lp.Parts) != 2 || aws.ToInt64(lp.Parts[0].Size) != 5*mib {
		t.Fatalf("list parts: %+v %v", lp, err)
	}
	// Pages of parts: max-parts=0 is an empty page that is not truncated
	// (a next marker of 0 would list the same page again).
	lp, err = e.alice.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String("alpha"), Key: aws.String("mp/big"), UploadId: up.UploadId,
		MaxParts: aws.Int32(0)})
	if err != nil || len(lp.Parts) != 0 || aws.ToBool(lp.IsTruncated) {
		t.Fatalf("list parts, max-parts 0: %d parts, truncated %v, %v", len(lp.Parts), aws.ToBool(lp.IsTruncated), err)
	}
	lp, err = e.alice.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String("alpha"), Key: aws.String("mp/big"), UploadId: up.UploadId,
		MaxParts: aws.Int32(1)})
	if err != nil || len(lp.Parts) != 1 || !aws.ToBool(lp.IsTruncated) || aws.ToString(lp.NextPartNumberMarker) != "1" {
		t.Fatalf("list parts, max-parts 1: %+v %v", lp, err)
	}
	lu, err := e.alice.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("alpha")})
	if err != nil || len(lu.Uploads) != 1 || *lu.Uploads[0].Key != "mp/big" {
		t.Fatalf("list uploads: %+v %v", lu, err)
	}
	_, err = e.bob.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String("alpha"), Key: aws.String("mp/big"), UploadId: up.UploadId})
	wantCode(t, err, "AccessDenied")

	// Wrong ETag, wrong order.
	_, err = e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("alpha"),
		Key: aws.String("mp/big"), UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: []types.CompletedPart{
			{ETag: aws.String(`"00000000000000000000000000000000"`), PartNumber: aws.Int32(1)}, done[1]}}})
	wantCode(t, err, "InvalidPart")
	_, err = e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("alpha"),
		Key: aws.String("mp/big"), UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: []types.CompletedPart{
			done[1], done[0]}}})
	wantCode(t, err, "InvalidPartOrder")

	c, err := e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("alpha"),
		Key: aws.String("mp/big"), UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: done}})
	if err != nil {
		t.Fatal(err)
	}
	m1, m2 := md5.Sum(p1), md5.Sum(p2)
	sum := md5.Sum(append(m1[:], m2[:]...))
	if want := fmt.Sprintf(`"%s-2"`, hex.EncodeToString(sum[:])); *c.ETag != want {
		t.Errorf("multipart ETag %s, want %s", *c.ETag, want)
	}
	whole := append(slices.Clone(p1), p2...)
	data, err := os.ReadFile(filepath.Join(e.root, "alpha", "mp", "big"))
	if err != nil || !bytes.Equal(data, whole) {
		t.Fatalf("backing file: %d bytes, %v", len(data), err)
	}
	if got := get(t, e.alice, "alpha", "mp/big"); got != string(whole) {
		t.Fatalf("GET: %d bytes", len(got))
	}
	g, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("alpha"), Key: aws.String("mp/big"), PartNumber: aws.Int32(2)})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(g.Body)
	g.Body.Close()
	if string(got) != string(p2) || aws.ToInt32(g.PartsCount) != 2 || aws.ToString(g.ContentType) != "application/x-big" || g.Metadata["k"] != "v" {
		t.Errorf("part 2: %q parts %d type %s meta %v", got, aws.ToInt32(g.PartsCount), aws.ToString(g.ContentType), g.Metadata)
	}
	_, err = e.alice.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String("alpha"), Key: aws.String("mp/big"), UploadId: up.UploadId})
	wantCode(t, err, "NoSuchUpload")

	// Too small a part that is not the last; abort.
	up2, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("alpha"), Key: aws.String("mp/small")})
	if err != nil {
		t.Fatal(err)
	}
	var small []types.CompletedPart
	for i := int32(1); i <= 2; i++ {
		out, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("alpha"), Key: aws.String("mp/small"),
			UploadId: up2.UploadId, PartNumber: aws.Int32(i), Body: strings.NewReader("tiny")})
		if err != nil {
			t.Fatal(err)
		}
		small = append(small, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(i)})
	}
	_, err = e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("alpha"),
		Key: aws.String("mp/small"), UploadId: up2.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: small}})
	wantCode(t, err, "EntityTooSmall")
	if _, err := e.alice.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String("alpha"),
		Key: aws.String("mp/small"), UploadId: up2.UploadId}); err != nil {
		t.Fatal(err)
	}
	_, err = e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("alpha"), Key: aws.String("mp/small"),
		UploadId: up2.UploadId, PartNumber: aws.Int32(1), Body: strings.NewReader("x")})
	wantCode(t, err, "NoSuchUpload")
	_, err = e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("alpha"), Key: aws.String("mp/small"),
		UploadId: aws.String("../../../../etc"), PartNumber: aws.Int32(1), Body: strings.NewReader("x")})
	wantCode(t, err, "NoSuchUpload")
	if left := files(t, filepath.Join(e.work, "uploads")); len(left) != 0 {
		t.Errorf("upload files left: %v", left)
	}
	if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String("mp/big")}); err != nil {
		t.Fatal(err)
	}

	// An empty last part: HEAD ?partNumber= names no byte range (there is
	// none: "bytes 5242880-5242879/5242880" is no valid Content-Range).
	up3, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("alpha"), Key: aws.String("mp/empty")})
	if err != nil {
		t.Fatal(err)
	}
	var parts []types.CompletedPart
	for i, p := range [][]byte{p1, nil} {
		out, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("alpha"), Key: aws.String("mp/empty"),
			UploadId: up3.UploadId, PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(p)})
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))})
	}
	if _, err := e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("alpha"),
		Key: aws.String("mp/empty"), UploadId: up3.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		t.Fatal(err)
	}
	h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("alpha"), Key: aws.String("mp/empty"), PartNumber: aws.Int32(2)})
	if err != nil || aws.ToInt64(h.ContentLength) != 0 || h.ContentRange != nil || aws.ToInt32(h.PartsCount) != 2 {
		t.Fatalf("HEAD of an empty part: length %d range %q parts %d, %v", aws.ToInt64(h.ContentLength),
			aws.ToString(h.ContentRange), aws.ToInt32(h.PartsCount), err)
	}
	if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String("mp/empty")}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) testCopy(t *testing.T) {
	src := put(t, e.alice, "alpha", "cp/src", "copy me")
	if _, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cp/meta"),
		Body: strings.NewReader("m"), ContentType: aws.String("text/x-one"), Metadata: map[string]string{"a": "1"}}); err != nil {
		t.Fatal(err)
	}
	out, err := e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cp/dst/copy"),
		CopySource: aws.String("alpha/cp/src")})
	if err != nil {
		t.Fatal(err)
	}
	if *out.CopyObjectResult.ETag != *src.ETag {
		t.Errorf("copy ETag %s, source %s", *out.CopyObjectResult.ETag, *src.ETag)
	}
	if got := get(t, e.alice, "alpha", "cp/dst/copy"); got != "copy me" {
		t.Fatalf("copy: %q", got)
	}
	// Independent files: changing the source does not change the copy.
	put(t, e.alice, "alpha", "cp/src", "changed")
	if got := get(t, e.alice, "alpha", "cp/dst/copy"); got != "copy me" {
		t.Fatalf("copy after source change: %q", got)
	}
	// Metadata: copied, or replaced.
	if _, err := e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cp/meta2"),
		CopySource: aws.String("alpha/cp/meta")}); err != nil {
		t.Fatal(err)
	}
	h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cp/meta2")})
	if err != nil || aws.ToString(h.ContentType) != "text/x-one" || h.Metadata["a"] != "1" {
		t.Fatalf("copied metadata: %+v %v", h, err)
	}
	if _, err := e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cp/meta"),
		CopySource: aws.String("alpha/cp/meta"), MetadataDirective: types.MetadataDirectiveReplace,
		ContentType: aws.String("text/x-two"), Metadata: map[string]string{"b": "2"}}); err != nil {
		t.Fatal(err)
	}
	h, err = e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cp/meta")})
	if err != nil || aws.ToString(h.ContentType) != "text/x-two" || h.Metadata["b"] != "2" || h.Metadata["a"] != "" {
		t.Fatalf("replaced metadata: %+v %v", h, err)
	}
	_, err = e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cp/meta"),
		CopySource: aws.String("alpha/cp/meta")})
	wantCode(t, err, "InvalidRequest")
	_, err = e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("alpha"), Key: aws.String("cp/x"),
		CopySource: aws.String("alpha/cp/missing")})
	wantCode(t, err, "NoSuchKey")
	// Bob may not copy from alice's bucket into his.
	_, err = e.bob.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("bravo"), Key: aws.String("stolen"),
		CopySource: aws.String("alpha/cp/src")})
	wantCode(t, err, "AccessDenied")
	for _, k := range []string{"cp/src", "cp/meta", "cp/meta2", "cp/dst/copy"} {
		e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String(k)})
	}
}

func (e *env) testDeleteBucket(t *testing.T) {
	put(t, e.alice, "alpha", "last", "l")
	_, err := e.alice.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String("alpha")})
	wantCode(t, err, "BucketNotEmpty")
	_, err = e.bob.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String("alpha")})
	wantCode(t, err, "AccessDenied")
	e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alpha"), Key: aws.String("last")})
	// A file that is not an object keeps the bucket.
	os.WriteFile(filepath.Join(e.root, "alpha", "mine"), []byte("x"), 0o644)
	_, err = e.alice.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String("alpha")})
	wantCode(t, err, "BucketNotEmpty")
	os.Remove(filepath.Join(e.root, "alpha", "mine"))
	os.MkdirAll(filepath.Join(e.root, "alpha", "empty", "dirs"), 0o755)
	if _, err := e.alice.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String("alpha")}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.root, "alpha")); !os.IsNotExist(err) {
		t.Errorf("bucket directory remains: %v", err)
	}
	if _, err := e.buckets.Bucket(ctx, "alpha"); err != ErrNoSuchBucket {
		t.Errorf("bucket record remains: %v", err)
	}
	_, err = e.alice.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String("alpha")})
	if err == nil {
		t.Errorf("deleted bucket answers HEAD")
	}
}

// TestConcurrentPuts: readers racing writers of one key see a whole
// object whose bytes match its ETag, never a mix and never a false
// ObjectModifiedOutsideS3 (in sidecar mode the record and the file are
// published in two steps).
func TestConcurrentPuts(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		mkBucket(t, e.alice, "race")
		put(t, e.alice, "race", "k", strings.Repeat("0", 1000))
		stop := make(chan struct{})
		errs := make(chan error, 16)
		var writers, readers sync.WaitGroup
		for w := range 3 {
			writers.Add(1)
			go func() {
				defer writers.Done()
				for i := range 15 {
					body := strings.Repeat(fmt.Sprint(w), 1000+100*i+w)
					if _, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("race"), Key: aws.String("k"),
						Body: strings.NewReader(body)}); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		for range 3 {
			readers.Add(1)
			go func() {
				defer readers.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					out, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("race"), Key: aws.String("k")})
					if err != nil {
						errs <- err
						return
					}
					b, err := io.ReadAll(out.Body)
					out.Body.Close()
					if err != nil {
						errs <- err
						return
					}
					if `"`+md5hex(string(b))+`"` != *out.ETag || strings.Trim(string(b), string(b[:1])) != "" {
						errs <- fmt.Errorf("read %d mixed or mismatched bytes (etag %s)", len(b), *out.ETag)
						return
					}
				}
			}()
		}
		writers.Wait()
		close(stop)
		readers.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// TestMetadataPlacement: the record is one xattr on the file, or a
// sidecar file in Work/sidecar; nothing else is added to the bucket.
func TestMetadataPlacement(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		mkBucket(t, e.alice, "place")
		put(t, e.alice, "place", "a/b", "data")
		p := filepath.Join(e.root, "place", "a", "b")
		buf := make([]byte, 4096)
		n, err := unix.Getxattr(p, xattrName, buf)
		side := files(t, filepath.Join(e.work, "sidecar"))
		switch mode {
		case "xattr":
			if err != nil || !strings.Contains(string(buf[:n]), md5hex("data")) || len(side) != 0 {
				t.Errorf("xattr %q %v, sidecar files %v", buf[:max(n, 0)], err, side)
			}
		case "sidecar":
			if err == nil || len(side) != 1 {
				t.Errorf("xattr set (%v) or sidecar files %v", err, side)
			}
		}
		if got := files(t, filepath.Join(e.root, "place")); !slices.Equal(got, []string{"a/b"}) {
			t.Errorf("bucket holds %v", got)
		}
	})
}

func TestNewChecks(t *testing.T) {
	dir := t.TempDir()
	if _, err := New(Config{Root: filepath.Join(dir, "r"), Work: filepath.Join(dir, "r", "work"), Buckets: &memBuckets{}}); err == nil {
		t.Error("Work inside Root accepted")
	}
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		shm, err := os.MkdirTemp("/dev/shm", "basalt-objects-test-")
		if err == nil {
			defer os.RemoveAll(shm)
			var a, b unix.Stat_t
			if unix.Stat(shm, &a) == nil && unix.Stat(dir, &b) == nil && a.Dev != b.Dev {
				_, err := New(Config{Root: shm, Work: filepath.Join(dir, "w"), Buckets: &memBuckets{}})
				if err == nil || !strings.Contains(err.Error(), "different file systems") {
					t.Errorf("Root and Work on different file systems: %v", err)
				}
			}
		}
	}
}

// TestTrailerChecksums: over TLS the SDK streams bodies with a trailing
// checksum; the backend stores the (s3api-verified) trailer value, and
// a multipart upload gets the composite or full-object checksum.
func TestTrailerChecksums(t *testing.T) {
	e := newEnvTLS(t, false, true)
	mkBucket(t, e.alice, "trail")
	body := strings.Repeat("trailer checksum ", 1000)
	out, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("trail"), Key: aws.String("k"),
		Body: strings.NewReader(body), ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c})
	if err != nil {
		t.Fatal(err)
	}
	want := base64.StdEncoding.EncodeToString(binary.BigEndian.AppendUint32(nil,
		crc32.Checksum([]byte(body), crc32.MakeTable(crc32.Castagnoli))))
	if aws.ToString(out.ChecksumCRC32C) != want {
		t.Errorf("PUT answered CRC32C %q, want %q", aws.ToString(out.ChecksumCRC32C), want)
	}
	h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("trail"), Key: aws.String("k"),
		ChecksumMode: types.ChecksumModeEnabled})
	if err != nil || aws.ToString(h.ChecksumCRC32C) != want {
		t.Fatalf("HEAD CRC32C %q (%v), want %q", aws.ToString(h.ChecksumCRC32C), err, want)
	}
	if got := get(t, e.alice, "trail", "k"); got != body {
		t.Fatalf("GET %d bytes", len(got))
	}

	for _, algo := range []types.ChecksumAlgorithm{types.ChecksumAlgorithmSha256, types.ChecksumAlgorithmCrc64nvme} {
		key := "mp-" + string(algo)
		up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("trail"),
			Key: aws.String(key), ChecksumAlgorithm: algo})
		if err != nil {
			t.Fatal(err)
		}
		var done []types.CompletedPart
		for i, p := range []string{strings.Repeat("a", 5<<20), "tail"} {
			o, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("trail"), Key: aws.String(key),
				UploadId: up.UploadId, PartNumber: aws.Int32(int32(i + 1)), Body: strings.NewReader(p), ChecksumAlgorithm: algo})
			if err != nil {
				t.Fatal(err)
			}
			done = append(done, types.CompletedPart{ETag: o.ETag, PartNumber: aws.Int32(int32(i + 1)),
				ChecksumSHA256: o.ChecksumSHA256, ChecksumCRC64NVME: o.ChecksumCRC64NVME})
		}
		c, err := e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("trail"),
			Key: aws.String(key), UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: done}})
		if err != nil {
			t.Fatal(err)
		}
		switch algo {
		case types.ChecksumAlgorithmSha256:
			if v := aws.ToString(c.ChecksumSHA256); !strings.HasSuffix(v, "-2") || c.ChecksumType != types.ChecksumTypeComposite {
				t.Errorf("composite SHA-256 %q type %s", v, c.ChecksumType)
			}
		case types.ChecksumAlgorithmCrc64nvme:
			whole := crc64.Checksum([]byte(strings.Repeat("a", 5<<20)+"tail"), crc64.MakeTable(0x9a6c9329ac4bc9b5))
			want := base64.StdEncoding.EncodeToString(binary.BigEndian.AppendUint64(nil, whole))
			if v := aws.ToString(c.ChecksumCRC64NVME); v != want || c.ChecksumType != types.ChecksumTypeFullObject {
				t.Errorf("full-object CRC64NVME %q type %s, want %q", v, c.ChecksumType, want)
			}
		}
	}

	// Over TLS a body goes out in large pieces (fileBody): a whole
	// multi-MiB object, and a range of it.
	whole := strings.Repeat("a", 5<<20) + "tail"
	if got := get(t, e.alice, "trail", "mp-SHA256"); got != whole {
		t.Fatalf("GET over TLS: %d bytes, want %d", len(got), len(whole))
	}
	r, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("trail"), Key: aws.String("mp-SHA256"),
		Range: aws.String("bytes=100-5242883")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil || string(got) != whole[100:5242884] {
		t.Fatalf("ranged GET over TLS: %d bytes (%v), want %d", len(got), err, 5242884-100)
	}
}

// TestAbortRacesUploadPart: UploadParts racing an Abort of their upload
// either land before the abort (which then removes them) or answer
// NoSuchUpload. Abort always succeeds and removes the whole upload: no
// directory or file of it is left under Work/uploads (a part renamed in
// after Abort listed the directory made its rmdir fail, and a part record
// written after Abort recreated the directory); an UploadPart sent after
// Abort answered is NoSuchUpload.
func TestAbortRacesUploadPart(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "mpr")
	in := func(id *string, n int32) *s3.UploadPartInput {
		return &s3.UploadPartInput{Bucket: aws.String("mpr"), Key: aws.String("k"), UploadId: id,
			PartNumber: aws.Int32(n), Body: strings.NewReader(strings.Repeat("p", 1000+int(n)))}
	}
	uploadsDir := filepath.Join(e.work, "uploads", "mpr")
	noneLeft := func(what string) {
		t.Helper()
		if ents, err := os.ReadDir(uploadsDir); err != nil || len(ents) != 0 {
			var names []string
			for _, ent := range ents {
				names = append(names, ent.Name())
			}
			t.Fatalf("%s: left in %s: %v %v (%v)", what, uploadsDir, names, files(t, uploadsDir), err)
		}
	}
	// Abort done between the part's rename and its record: the record
	// must not recreate the directory.
	up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("mpr"), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	traceWrites(t, func(op, name string) {
		if op == "part" {
			once.Do(func() {
				if err := e.be.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String("mpr"),
					Key: aws.String("k"), UploadId: up.UploadId}); err != nil {
					t.Errorf("abort between a part's rename and its record: %v", err)
				}
			})
		}
	})
	_, err = e.alice.UploadPart(ctx, in(up.UploadId, 1))
	wantCode(t, err, "NoSuchUpload")
	fsTrace.Store(nil)
	noneLeft("abort between a part's rename and its record")

	const rounds, writers = 40, 8
	for round := range rounds {
		up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("mpr"), Key: aws.String("k")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.alice.UploadPart(ctx, in(up.UploadId, 1)); err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				<-start
				for i := range 3 {
					_, err := e.alice.UploadPart(ctx, in(up.UploadId, int32(2+w*3+i)))
					if err != nil && code(err) != "NoSuchUpload" {
						t.Errorf("round %d: UploadPart racing Abort: %v", round, err)
					}
				}
			})
		}
		close(start)
		time.Sleep(time.Duration(round%4) * time.Millisecond)
		_, err = e.alice.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String("mpr"),
			Key: aws.String("k"), UploadId: up.UploadId})
		if err != nil {
			t.Errorf("round %d: Abort racing UploadParts: %v", round, err)
		}
		_, err = e.alice.UploadPart(ctx, in(up.UploadId, 9999))
		wantCode(t, err, "NoSuchUpload")
		wg.Wait()
		_, err = e.alice.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String("mpr"), Key: aws.String("k"), UploadId: up.UploadId})
		wantCode(t, err, "NoSuchUpload")
		noneLeft(fmt.Sprint("round ", round))
	}
	noTempLeft(t, e)
}

// TestCompleteRacesAbort: an Abort that arrives while a Complete publishes
// the object must not succeed as well; one of the two ends the upload and
// the other answers NoSuchUpload.
func TestCompleteRacesAbort(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "mpc")
	up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("mpc"), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	part, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("mpc"), Key: aws.String("k"),
		UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: strings.NewReader("the only part")})
	if err != nil {
		t.Fatal(err)
	}
	abort := make(chan error, 1)
	var once sync.Once
	traceWrites(t, func(op, name string) {
		if op == "rename" && name == "k" {
			once.Do(func() {
				go func() {
					_, err := e.alice.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String("mpc"),
						Key: aws.String("k"), UploadId: up.UploadId})
					abort <- err
				}()
				// Give the Abort time to land inside the Complete.
				time.Sleep(300 * time.Millisecond)
			})
		}
	})
	_, err = e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("mpc"),
		Key: aws.String("k"), UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{
			Parts: []types.CompletedPart{{PartNumber: aws.Int32(1), ETag: part.ETag}}}})
	if err != nil {
		t.Fatalf("complete: %v", err)
	}
	aerr := <-abort
	if aerr == nil {
		t.Fatal("Abort and Complete of one upload both succeeded")
	}
	wantCode(t, aerr, "NoSuchUpload")
	if got := get(t, e.alice, "mpc", "k"); got != "the only part" {
		t.Fatalf("object %q", got)
	}
}

// TestPutRacesPrune: a DELETE of the last object of a directory removes
// the directory (pruneDirs) while a PUT into it may be between creating
// it and renaming its object in. The PUT must then create it again, not
// fail: every PUT succeeds and is readable.
func TestPutRacesPrune(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		mkBucket(t, e.alice, "prune")
		// Deterministically: the directory goes right after the PUT made
		// it durable (a DELETE of d/y prunes d). d/y is written directly
		// and exported, so that the PUT finds d unknown and syncs it.
		writeFile(t, filepath.Join(e.root, "prune", "d", "y"), "y")
		if _, err := e.be.Export(ctx, "prune", "d/y"); err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		traceWrites(t, func(op, name string) {
			if op == "sync parent" && name == "d" {
				once.Do(func() {
					if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("prune"),
						Key: aws.String("d/y")}); err != nil {
						t.Errorf("delete d/y: %v", err)
					}
				})
			}
		})
		put(t, e.alice, "prune", "d/x", "x")
		fsTrace.Store(nil)
		if got := get(t, e.alice, "prune", "d/x"); got != "x" {
			t.Fatalf("d/x: %q", got)
		}
		if _, err := os.Stat(filepath.Join(e.root, "prune", "d", "y")); !os.IsNotExist(err) {
			t.Fatalf("d/y not deleted: %v", err)
		}
		deleteAll(t, e.alice, "prune", "d/x")
		// And racing, in an unversioned and a versioned bucket (where
		// DELETEs also prune .basalt-versions/d and PUTs create it).
		for _, bk := range []string{"prune-u", "prune-v"} {
			mkBucket(t, e.alice, bk)
			if bk == "prune-v" {
				setVersioning(t, e.alice, bk, types.BucketVersioningStatusEnabled)
			}
			var wg sync.WaitGroup
			for _, key := range []string{"d/x", "d/y", "d/z"} {
				wg.Go(func() {
					for i := range 40 {
						body := fmt.Sprint(key, i)
						out, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bk), Key: aws.String(key),
							Body: strings.NewReader(body)})
						if err != nil {
							t.Errorf("%s: PUT %s racing DELETEs: %v", bk, key, err)
							return
						}
						g, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bk), Key: aws.String(key)})
						if err != nil {
							t.Errorf("%s: GET %s: %v", bk, key, err)
							return
						}
						got, _ := io.ReadAll(g.Body)
						g.Body.Close()
						if string(got) != body {
							t.Errorf("%s: GET %s: %q, want %q", bk, key, got, body)
						}
						// Versioned: remove every version, which prunes
						// the version directories too.
						in := &s3.DeleteObjectInput{Bucket: aws.String(bk), Key: aws.String(key), VersionId: out.VersionId}
						if _, err := e.alice.DeleteObject(ctx, in); err != nil {
							t.Errorf("%s: DELETE %s: %v", bk, key, err)
							return
						}
					}
				})
			}
			wg.Wait()
			if left := files(t, filepath.Join(e.root, bk)); len(left) != 0 {
				t.Errorf("%s: files left: %v", bk, left)
			}
		}
	})
}

// TestRemovedUploadsCleaned: an upload directory an Abort renamed away and
// a crash kept from being removed is removed when the store opens; a live
// upload is not touched.
func TestRemovedUploadsCleaned(t *testing.T) {
	dir := t.TempDir()
	root, work := filepath.Join(dir, "r"), filepath.Join(dir, "w")
	tomb := filepath.Join(work, "uploads", "bkt", "0123abcd"+removedSuffix)
	live := filepath.Join(work, "uploads", "bkt", "4567cdef")
	for _, d := range []string{tomb, live} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "1.part"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, err := New(Config{Root: root, Work: work, Buckets: &memBuckets{}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	if _, err := os.Stat(tomb); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("removed upload still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("live upload: %v", err)
	}
}
