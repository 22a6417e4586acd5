package objects

import (
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// TestPutBadDigest: a PUT whose Content-MD5 or x-amz-checksum-sha256 does
// not match its body is refused with 400 BadDigest, and one whose value
// is no digest at all (not base64, wrong length) with 400 InvalidDigest
// resp. InvalidRequest (AWS PutObject, "Checking object integrity"). In
// every case nothing is written: a new key stays missing, an existing
// object keeps its bytes and ETag, and no temp file is left behind. The
// right digests are accepted. Plain HTTP and TLS (where the SDK sends the
// body with a trailing checksum) alike.
func TestPutBadDigest(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		name := "http"
		if useTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnvTLS(t, false, useTLS)
			c := e.alice
			mkBucket(t, c, "digest")
			old := put(t, c, "digest", "old", "old body")
			const body = "new body"
			b64 := func(b []byte) *string { return aws.String(base64.StdEncoding.EncodeToString(b)) }
			md5of := func(s string) []byte { h := md5.Sum([]byte(s)); return h[:] }
			sha256of := func(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }

			for _, tc := range []struct {
				name string
				in   s3.PutObjectInput
				code string
			}{
				{"md5 of other bytes", s3.PutObjectInput{ContentMD5: b64(md5of("other"))}, "BadDigest"},
				{"md5 not base64", s3.PutObjectInput{ContentMD5: aws.String("not-base64!")}, "InvalidDigest"},
				{"md5 too short", s3.PutObjectInput{ContentMD5: b64(md5of(body)[:8])}, "InvalidDigest"},
				{"sha256 of other bytes", s3.PutObjectInput{ChecksumSHA256: b64(sha256of("other"))}, "BadDigest"},
				{"sha256 too short", s3.PutObjectInput{ChecksumSHA256: aws.String("abc")}, "InvalidRequest"},
			} {
				for _, key := range []string{"new", "old"} {
					in := tc.in
					in.Bucket, in.Key, in.Body = aws.String("digest"), aws.String(key), strings.NewReader(body)
					_, err := c.PutObject(ctx, &in)
					if got := code(err); got != tc.code || httpStatus(err) != 400 {
						t.Errorf("%s, key %s: %d %q (%v), want 400 %s", tc.name, key, httpStatus(err), got, err, tc.code)
					}
				}
				_, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("digest"), Key: aws.String("new")})
				if httpStatus(err) != 404 {
					t.Fatalf("%s: the new key was written: %v", tc.name, err)
				}
				h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("digest"), Key: aws.String("old")})
				if err != nil || aws.ToString(h.ETag) != aws.ToString(old.ETag) {
					t.Fatalf("%s: the existing object changed: %+v, %v", tc.name, h, err)
				}
				if got := get(t, c, "digest", "old"); got != "old body" {
					t.Fatalf("%s: the existing object reads %q", tc.name, got)
				}
				if got := files(t, filepath.Join(e.root, "digest")); len(got) != 1 || got[0] != "old" {
					t.Fatalf("%s: bucket files %v", tc.name, got)
				}
				noTempLeft(t, e)
			}
			// The right digests, both at once.
			out, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("digest"), Key: aws.String("new"),
				Body: strings.NewReader(body), ContentMD5: b64(md5of(body)), ChecksumSHA256: b64(sha256of(body))})
			if err != nil {
				t.Fatal(err)
			}
			if aws.ToString(out.ETag) != `"`+md5hex(body)+`"` || aws.ToString(out.ChecksumSHA256) != aws.ToString(b64(sha256of(body))) {
				t.Errorf("right digests: ETag %s sha256 %s", aws.ToString(out.ETag), aws.ToString(out.ChecksumSHA256))
			}
			if got := get(t, c, "digest", "new"); got != body {
				t.Errorf("right digests: body %q", got)
			}
		})
	}
}
