package objects

import (
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

func crc32Of(s string) string {
	return base64.StdEncoding.EncodeToString(binary.BigEndian.AppendUint32(nil, crc32.ChecksumIEEE([]byte(s))))
}

// TestCompletePartChecksums: the checksums a CompleteMultipartUpload gives
// for its parts are checked against the parts stored, as their ETags are:
// one that differs is not the part the client means (InvalidPart; BadDigest
// for an algorithm the upload does not use). Before, they were ignored, and
// a client that swapped two parts of equal ETag — or whose part was
// replaced by another upload of the same number — got an object it had
// not hashed. And a part sent without a checksum to an upload that has an
// algorithm is hashed by the gateway, as S3 does: before, it was stored
// without one, and the object lost its checksum.
func TestCompletePartChecksums(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "csums")
	parts := []string{strings.Repeat("a", 5<<20), "tail"}
	start := func(key string) *string {
		t.Helper()
		up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("csums"),
			Key: aws.String(key), ChecksumAlgorithm: types.ChecksumAlgorithmCrc32})
		if err != nil {
			t.Fatal(err)
		}
		return up.UploadId
	}
	// Parts sent without a checksum (the client computes none).
	whenRequired := func(o *s3.Options) { o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired }
	upload := func(key string, id *string) []types.CompletedPart {
		t.Helper()
		var done []types.CompletedPart
		for i, p := range parts {
			o, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("csums"), Key: aws.String(key),
				UploadId: id, PartNumber: aws.Int32(int32(i + 1)), Body: strings.NewReader(p)}, whenRequired)
			if err != nil {
				t.Fatal(err)
			}
			if got := aws.ToString(o.ChecksumCRC32); got != crc32Of(p) {
				t.Fatalf("part %d sent without a checksum to a CRC32 upload: CRC32 %q, want %q (computed by the gateway)", i+1, got, crc32Of(p))
			}
			done = append(done, types.CompletedPart{ETag: o.ETag, PartNumber: aws.Int32(int32(i + 1)), ChecksumCRC32: o.ChecksumCRC32})
		}
		return done
	}
	complete := func(key string, id *string, done []types.CompletedPart) (*s3.CompleteMultipartUploadOutput, error) {
		return e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("csums"),
			Key: aws.String(key), UploadId: id, MultipartUpload: &types.CompletedMultipartUpload{Parts: done}})
	}

	id := start("k")
	done := upload("k", id)
	wrong := append([]types.CompletedPart(nil), done...)
	wrong[1].ChecksumCRC32 = aws.String(crc32Of("another tail"))
	if _, err := complete("k", id, wrong); code(err) != "InvalidPart" {
		t.Fatalf("complete with a part's CRC32 not the stored part's: %v, want InvalidPart", err)
	}
	other := append([]types.CompletedPart(nil), done...)
	other[1] = types.CompletedPart{ETag: done[1].ETag, PartNumber: done[1].PartNumber,
		ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(make([]byte, 32)))}
	if _, err := complete("k", id, other); code(err) != "BadDigest" {
		t.Fatalf("complete with a part's SHA-256 (a CRC32 upload) that does not match: %v, want BadDigest", err)
	}
	two := append([]types.CompletedPart(nil), done...)
	two[1].ChecksumSHA256 = other[1].ChecksumSHA256
	if _, err := complete("k", id, two); code(err) != "InvalidArgument" {
		t.Fatalf("complete with two checksums for a part: %v, want InvalidArgument", err)
	}
	c, err := complete("k", id, done)
	if err != nil {
		t.Fatal(err)
	}
	if v := aws.ToString(c.ChecksumCRC32); !strings.HasSuffix(v, "-2") {
		t.Fatalf("the object's checksum %q, want the composite of its 2 parts' CRC32s", v)
	}
	if got := get(t, e.alice, "csums", "k"); got != strings.Join(parts, "") {
		t.Fatalf("GET %d bytes", len(got))
	}

	// Parts listed without their checksums: accepted, as before.
	id = start("k2")
	done = upload("k2", id)
	for i := range done {
		done[i].ChecksumCRC32 = nil
	}
	if _, err := complete("k2", id, done); err != nil {
		t.Fatalf("complete without part checksums: %v", err)
	}
}
