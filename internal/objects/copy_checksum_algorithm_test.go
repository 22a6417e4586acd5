package objects

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestCopyChecksumAlgorithm: a CopyObject with x-amz-checksum-algorithm
// gives the copy a checksum in that algorithm (AWS CopyObject: the
// source's checksum is copied only when the request names none), answered
// in the CopyObjectResult, by GET and HEAD with checksum mode, and in
// listings. Before, basalt ignored the header and the copy kept the
// source's checksum (or none).
func TestCopyChecksumAlgorithm(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		const body = "copy me, checksummed"
		b64 := func(s []byte) string { return base64.StdEncoding.EncodeToString(s) }
		crc := func(tab *crc32.Table) string {
			return b64(binary.BigEndian.AppendUint32(nil, crc32.Checksum([]byte(body), tab)))
		}
		sha256sum, sha1sum := sha256.Sum256([]byte(body)), sha1.Sum([]byte(body))
		wantSHA256, wantSHA1 := b64(sha256sum[:]), b64(sha1sum[:])
		wantCRC32, wantCRC32C := crc(crc32.IEEETable), crc(crc32.MakeTable(crc32.Castagnoli))

		c := e.alice
		mkBucket(t, c, "sums")
		if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("sums"), Key: aws.String("src"),
			Body: strings.NewReader(body), ChecksumAlgorithm: types.ChecksumAlgorithmCrc32}); err != nil {
			t.Fatal(err)
		}
		// A source without any checksum (the SDK adds CRC32 unless told not to).
		plain := func(o *s3.Options) { o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired }
		if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("sums"), Key: aws.String("plain"),
			Body: strings.NewReader(body)}, plain); err != nil {
			t.Fatal(err)
		}
		if h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("sums"), Key: aws.String("plain"),
			ChecksumMode: types.ChecksumModeEnabled}); err != nil || h.ChecksumCRC32 != nil || h.ChecksumType != "" {
			t.Fatalf("the source meant to have no checksum: crc32 %v type %q, %v", aws.ToString(h.ChecksumCRC32), h.ChecksumType, err)
		}

		type sums struct{ crc32, crc32c, sha1, sha256 string }
		for _, tc := range []struct {
			name, src string
			algo      types.ChecksumAlgorithm
			replace   bool
			want      sums
			listed    types.ChecksumAlgorithm
		}{
			{name: "none asked", src: "src", want: sums{crc32: wantCRC32}, listed: types.ChecksumAlgorithmCrc32},
			{name: "same", src: "src", algo: types.ChecksumAlgorithmCrc32, want: sums{crc32: wantCRC32}, listed: types.ChecksumAlgorithmCrc32},
			{name: "sha256", src: "src", algo: types.ChecksumAlgorithmSha256, want: sums{sha256: wantSHA256}, listed: types.ChecksumAlgorithmSha256},
			{name: "sha256-replace", src: "src", algo: types.ChecksumAlgorithmSha256, replace: true, want: sums{sha256: wantSHA256}, listed: types.ChecksumAlgorithmSha256},
			{name: "crc32c-lowercase", src: "src", algo: "crc32c", want: sums{crc32c: wantCRC32C}, listed: types.ChecksumAlgorithmCrc32c},
			{name: "plain-none", src: "plain"},
			{name: "plain-sha1", src: "plain", algo: types.ChecksumAlgorithmSha1, want: sums{sha1: wantSHA1}, listed: types.ChecksumAlgorithmSha1},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dst := "dst/" + tc.name
				in := &s3.CopyObjectInput{Bucket: aws.String("sums"), Key: aws.String(dst),
					CopySource: aws.String("sums/" + tc.src), ChecksumAlgorithm: tc.algo}
				if tc.replace {
					in.MetadataDirective = types.MetadataDirectiveReplace
					in.ContentType = aws.String("text/x-replaced")
				}
				out, err := c.CopyObject(ctx, in)
				if err != nil {
					t.Fatal(err)
				}
				r := out.CopyObjectResult
				if got := (sums{aws.ToString(r.ChecksumCRC32), aws.ToString(r.ChecksumCRC32C), aws.ToString(r.ChecksumSHA1),
					aws.ToString(r.ChecksumSHA256)}); got != tc.want {
					t.Errorf("CopyObjectResult checksums %+v, want %+v", got, tc.want)
				}
				g, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("sums"), Key: aws.String(dst),
					ChecksumMode: types.ChecksumModeEnabled})
				if err != nil {
					t.Fatal(err)
				}
				g.Body.Close()
				if got := (sums{aws.ToString(g.ChecksumCRC32), aws.ToString(g.ChecksumCRC32C), aws.ToString(g.ChecksumSHA1),
					aws.ToString(g.ChecksumSHA256)}); got != tc.want {
					t.Errorf("GET checksums %+v, want %+v", got, tc.want)
				}
				if tc.want != (sums{}) && g.ChecksumType != types.ChecksumTypeFullObject {
					t.Errorf("GET checksum type %q, want FULL_OBJECT", g.ChecksumType)
				}
				if got := get(t, c, "sums", dst); got != body {
					t.Errorf("copied body %q", got)
				}
				l, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("sums"), Prefix: aws.String(dst)})
				if err != nil || len(l.Contents) != 1 {
					t.Fatalf("list %s: %+v, %v", dst, l, err)
				}
				var want []types.ChecksumAlgorithm
				if tc.listed != "" {
					want = []types.ChecksumAlgorithm{tc.listed}
				}
				if got := l.Contents[0].ChecksumAlgorithm; !slices.Equal(got, want) {
					t.Errorf("listed checksum algorithm %v, want %v", got, want)
				}
			})
		}
		// A multipart source's composite checksum ("<checksum of the
		// parts' checksums>-N") is copied as it is; asked for in the same
		// algorithm, the copy gets the full-object checksum of its bytes.
		up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("sums"), Key: aws.String("mp"),
			ChecksumAlgorithm: types.ChecksumAlgorithmSha256})
		if err != nil {
			t.Fatal(err)
		}
		var whole []byte
		var done []types.CompletedPart
		for i, p := range []string{strings.Repeat("p", 5<<20), "tail"} {
			o, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("sums"), Key: aws.String("mp"), UploadId: up.UploadId,
				PartNumber: aws.Int32(int32(i + 1)), Body: strings.NewReader(p), ChecksumAlgorithm: types.ChecksumAlgorithmSha256})
			if err != nil {
				t.Fatal(err)
			}
			whole = append(whole, p...)
			done = append(done, types.CompletedPart{ETag: o.ETag, PartNumber: aws.Int32(int32(i + 1)), ChecksumSHA256: o.ChecksumSHA256})
		}
		mp, err := c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("sums"), Key: aws.String("mp"),
			UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: done}})
		if err != nil || mp.ChecksumType != types.ChecksumTypeComposite {
			t.Fatalf("multipart source: type %q, %v", mp.ChecksumType, err)
		}
		kept, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("sums"), Key: aws.String("mp-kept"), CopySource: aws.String("sums/mp")})
		if err != nil || aws.ToString(kept.CopyObjectResult.ChecksumSHA256) != aws.ToString(mp.ChecksumSHA256) ||
			kept.CopyObjectResult.ChecksumType != types.ChecksumTypeComposite {
			t.Fatalf("copy of a multipart object: %+v, %v", kept.CopyObjectResult, err)
		}
		full, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("sums"), Key: aws.String("mp-full"), CopySource: aws.String("sums/mp"),
			ChecksumAlgorithm: types.ChecksumAlgorithmSha256})
		wholeSum := sha256.Sum256(whole)
		if err != nil || aws.ToString(full.CopyObjectResult.ChecksumSHA256) != b64(wholeSum[:]) ||
			full.CopyObjectResult.ChecksumType != types.ChecksumTypeFullObject {
			t.Fatalf("copy of a multipart object asking for SHA256: %+v, %v", full.CopyObjectResult, err)
		}

		// The source keeps its own.
		h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("sums"), Key: aws.String("src"),
			ChecksumMode: types.ChecksumModeEnabled})
		if err != nil || aws.ToString(h.ChecksumCRC32) != wantCRC32 || h.ChecksumSHA256 != nil {
			t.Fatalf("source after the copies: crc32 %q sha256 %q, %v", aws.ToString(h.ChecksumCRC32), aws.ToString(h.ChecksumSHA256), err)
		}
		noTempLeft(t, e)
	})
}
