package objects

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestPutIfNoneMatchModified: a write with If-None-Match: * to a key whose
// object was changed behind S3 (its file no longer matches its record)
// answers 412 PreconditionFailed, as S3 does whenever an object exists at
// the key, with a message saying the object exists and was modified
// outside S3; the file stays as it is. Before, the condition's look at the
// current object answered GET's 409 ObjectModifiedOutsideS3. A file that
// is no object (unexported) still answers 409 KeyHoldsUnexportedFile, and
// If-Match on a changed object 409 ObjectModifiedOutsideS3.
func TestPutIfNoneMatchModified(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		const bucket = "inm"
		mkBucket(t, e.alice, bucket)
		put(t, e.alice, bucket, "k", "original")
		path := filepath.Join(e.root, bucket, "k")
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(" and more")
		f.Close()
		_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("k")})
		wantCode(t, err, "ObjectModifiedOutsideS3")

		_, err = e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("k"),
			IfNoneMatch: aws.String("*"), Body: strings.NewReader("new")})
		wantCode(t, err, "PreconditionFailed")
		if msg := err.Error(); !strings.Contains(msg, "412") || !strings.Contains(msg, bucket+"/k") ||
			!strings.Contains(msg, "modified outside S3") {
			t.Errorf("PUT If-None-Match: * over a changed object: %v, want 412 naming the object and why", err)
		}

		up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String("k")})
		if err != nil {
			t.Fatal(err)
		}
		part, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String("k"),
			UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: strings.NewReader("part")})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String(bucket),
			Key: aws.String("k"), UploadId: up.UploadId, IfNoneMatch: aws.String("*"),
			MultipartUpload: &types.CompletedMultipartUpload{Parts: []types.CompletedPart{{PartNumber: aws.Int32(1), ETag: part.ETag}}}})
		wantCode(t, err, "PreconditionFailed")

		// If-Match has no ETag to compare with: the object's state.
		_, err = e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("k"),
			IfMatch: aws.String(`"` + md5hex("original") + `"`), Body: strings.NewReader("new")})
		wantCode(t, err, "ObjectModifiedOutsideS3")

		if data, err := os.ReadFile(path); err != nil || string(data) != "original and more" {
			t.Fatalf("the changed file after refused writes: %q, %v", data, err)
		}

		// Not an object: the write's own 409, as without the condition.
		writeFile(t, filepath.Join(e.root, bucket, "direct"), "mine")
		_, err = e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("direct"),
			IfNoneMatch: aws.String("*"), Body: strings.NewReader("new")})
		wantCode(t, err, "KeyHoldsUnexportedFile")

		// Unconditional writes still replace the changed object.
		put(t, e.alice, bucket, "k", "fresh")
		if got := get(t, e.alice, bucket, "k"); got != "fresh" {
			t.Fatalf("after overwrite: %q", got)
		}
	})
}
