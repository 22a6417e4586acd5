package objects

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/versity/versitygw/s3response"
)

// A common prefix that holds no object (a directory of files written
// beside S3, not exported) is left out of a listing without taking one
// of its MaxKeys slots: the page is filled from the entries after it.
// Before, a page of 2 over a/ (no object), b/ and c/ came back with b/
// alone and truncated.
func TestDroppedPrefixTakesNoSlot(t *testing.T) {
	dir := t.TempDir()
	bk := &memBuckets{m: map[string]Bucket{"bkt": {Name: "bkt"}}}
	be, err := New(Config{Root: filepath.Join(dir, "buckets"), Work: filepath.Join(dir, "work"), Buckets: bk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Shutdown)
	root := filepath.Join(dir, "buckets", "bkt")
	if err := os.MkdirAll(filepath.Join(root, "a", "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "a", "direct"), []byte("not exported"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"b/x", "c/y", "d/z"} {
		n := int64(len(k))
		if _, err := be.PutObject(ctx, s3response.PutObjectInput{Bucket: aws.String("bkt"), Key: aws.String(k),
			Body: strings.NewReader(k), ContentLength: &n}); err != nil {
			t.Fatal(err)
		}
	}
	prefixes := func(cps []string) string { return strings.Join(cps, ",") }

	v2, err := be.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("bkt"), Delimiter: aws.String("/"), MaxKeys: aws.Int32(2)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, cp := range v2.CommonPrefixes {
		got = append(got, *cp.Prefix)
	}
	if prefixes(got) != "b/,c/" || !*v2.IsTruncated || *v2.KeyCount != 2 {
		t.Fatalf("V2 page of 2: prefixes %v, truncated %v, key count %d; want b/,c/, truncated, 2", got, *v2.IsTruncated, *v2.KeyCount)
	}

	// Page by page, one at a time: every page holds one prefix, none is
	// empty, and the last is not truncated.
	got = nil
	var marker *string
	for page := 0; ; page++ {
		v1, err := be.ListObjects(ctx, &s3.ListObjectsInput{Bucket: aws.String("bkt"), Delimiter: aws.String("/"), MaxKeys: aws.Int32(1), Marker: marker})
		if err != nil {
			t.Fatal(err)
		}
		if len(v1.CommonPrefixes) != 1 || page > 3 {
			t.Fatalf("V1 page %d of 1: %d prefixes (so far %v)", page, len(v1.CommonPrefixes), got)
		}
		got = append(got, *v1.CommonPrefixes[0].Prefix)
		if !*v1.IsTruncated {
			break
		}
		marker = v1.NextMarker
	}
	if prefixes(got) != "b/,c/,d/" {
		t.Fatalf("V1 pages of 1: %v, want b/, c/, d/", got)
	}
}
