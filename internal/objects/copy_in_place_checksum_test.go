package objects

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestCopyInPlaceAddsChecksum: copying an object onto itself with
// x-amz-checksum-algorithm naming a checksum it has not got is S3's way
// of giving an existing object one: it succeeds, the object keeps its
// bytes and gains the checksum. One that changes nothing — no algorithm,
// or the one the object already has — is still refused (400
// InvalidRequest). Before, every in-place copy without REPLACE was.
func TestCopyInPlaceAddsChecksum(t *testing.T) {
	e := newEnv(t, false)
	c := e.alice
	mkBucket(t, c, "inplace")
	const body = "give me a checksum"
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("inplace"), Key: aws.String("k"),
		Body: strings.NewReader(body), ChecksumAlgorithm: types.ChecksumAlgorithmCrc32}); err != nil {
		t.Fatal(err)
	}
	copyInPlace := func(algo types.ChecksumAlgorithm) error {
		_, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("inplace"), Key: aws.String("k"),
			CopySource: aws.String("inplace/k"), ChecksumAlgorithm: algo})
		return err
	}
	for _, algo := range []types.ChecksumAlgorithm{"", types.ChecksumAlgorithmCrc32} {
		if err := copyInPlace(algo); code(err) != "InvalidRequest" {
			t.Errorf("in-place copy with algorithm %q (no change): %v, want InvalidRequest", algo, err)
		}
	}
	if err := copyInPlace(types.ChecksumAlgorithmSha256); err != nil {
		t.Fatalf("in-place copy adding SHA256: %v", err)
	}
	h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("inplace"), Key: aws.String("k"),
		ChecksumMode: types.ChecksumModeEnabled})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(body))
	if got, want := aws.ToString(h.ChecksumSHA256), base64.StdEncoding.EncodeToString(sum[:]); got != want {
		t.Errorf("SHA256 after the in-place copy %q, want %q", got, want)
	}
	if got := get(t, c, "inplace", "k"); got != body {
		t.Errorf("body after the in-place copy %q, want %q", got, body)
	}
	if err := copyInPlace(types.ChecksumAlgorithmSha256); code(err) != "InvalidRequest" {
		t.Errorf("in-place copy asking again for the SHA256 it now has: %v, want InvalidRequest", err)
	}
}
