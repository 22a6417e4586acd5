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

// TestCopyMetadataDirective: x-amz-metadata-directive as AWS CopyObject
// documents it. COPY (the default) copies the source's content type,
// system metadata and user metadata and ignores those of the request;
// REPLACE takes them all from the request — user metadata is replaced,
// not merged, and a content type not given is binary/octet-stream —
// and keeps the data's ETag and checksum. A copy onto itself is allowed
// with REPLACE, or from a named version, and refused (InvalidRequest)
// otherwise, versioned bucket or not.
func TestCopyMetadataDirective(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c := e.alice
		mkBucket(t, c, "meta")
		expires := time.Date(2031, 2, 3, 4, 5, 6, 0, time.UTC)
		src, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("meta"), Key: aws.String("src"),
			Body: strings.NewReader("metadata"), ContentType: aws.String("text/x-src"), ContentEncoding: aws.String("identity"),
			ContentDisposition: aws.String("inline"), ContentLanguage: aws.String("en"), CacheControl: aws.String("max-age=60"),
			Expires: &expires, Metadata: map[string]string{"one": "1", "two": "2"}, ChecksumAlgorithm: types.ChecksumAlgorithmSha256})
		if err != nil {
			t.Fatal(err)
		}
		type desc struct {
			ctype, enc, disp, lang, cache, expires string
			meta                                   map[string]string
		}
		describe := func(key string) (desc, *s3.HeadObjectOutput) {
			t.Helper()
			h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("meta"), Key: aws.String(key),
				ChecksumMode: types.ChecksumModeEnabled})
			if err != nil {
				t.Fatalf("head %s: %v", key, err)
			}
			return desc{aws.ToString(h.ContentType), aws.ToString(h.ContentEncoding), aws.ToString(h.ContentDisposition),
				aws.ToString(h.ContentLanguage), aws.ToString(h.CacheControl), aws.ToString(h.ExpiresString), h.Metadata}, h
		}
		same := func(a, b desc) bool {
			if a.ctype != b.ctype || a.enc != b.enc || a.disp != b.disp || a.lang != b.lang || a.cache != b.cache ||
				a.expires != b.expires || len(a.meta) != len(b.meta) {
				return false
			}
			for k, v := range a.meta {
				if b.meta[k] != v {
					return false
				}
			}
			return true
		}
		srcDesc, srcHead := describe("src")
		wantSrc := desc{"text/x-src", "identity", "inline", "en", "max-age=60", expires.Format(http.TimeFormat),
			map[string]string{"one": "1", "two": "2"}}
		if !same(srcDesc, wantSrc) {
			t.Fatalf("source %+v, want %+v", srcDesc, wantSrc)
		}

		// COPY, explicit or not, with request headers that it ignores.
		for _, dir := range []types.MetadataDirective{"", types.MetadataDirectiveCopy} {
			dst := "copy-" + string(dir)
			out, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("meta"), Key: aws.String(dst),
				CopySource: aws.String("meta/src"), MetadataDirective: dir, ContentType: aws.String("text/x-ignored"),
				CacheControl: aws.String("no-store"), Metadata: map[string]string{"three": "3"}})
			if err != nil {
				t.Fatal(err)
			}
			if aws.ToString(out.CopyObjectResult.ETag) != aws.ToString(src.ETag) {
				t.Errorf("%s: ETag %s, source %s", dst, aws.ToString(out.CopyObjectResult.ETag), aws.ToString(src.ETag))
			}
			if got, h := describe(dst); !same(got, srcDesc) || aws.ToString(h.ChecksumSHA256) != aws.ToString(srcHead.ChecksumSHA256) {
				t.Errorf("%s: %+v sha256 %s, want the source's %+v %s", dst, got, aws.ToString(h.ChecksumSHA256), srcDesc,
					aws.ToString(srcHead.ChecksumSHA256))
			}
		}

		// REPLACE: all from the request; what it leaves out is gone.
		if _, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("meta"), Key: aws.String("replaced"),
			CopySource: aws.String("meta/src"), MetadataDirective: types.MetadataDirectiveReplace,
			CacheControl: aws.String("no-store"), Metadata: map[string]string{"three": "3"}}); err != nil {
			t.Fatal(err)
		}
		want := desc{ctype: "binary/octet-stream", cache: "no-store", meta: map[string]string{"three": "3"}}
		got, h := describe("replaced")
		if !same(got, want) {
			t.Errorf("replaced: %+v, want %+v", got, want)
		}
		if aws.ToString(h.ETag) != aws.ToString(src.ETag) || aws.ToString(h.ChecksumSHA256) != aws.ToString(srcHead.ChecksumSHA256) {
			t.Errorf("replaced: ETag %s sha256 %s, want the source's %s %s", aws.ToString(h.ETag), aws.ToString(h.ChecksumSHA256),
				aws.ToString(src.ETag), aws.ToString(srcHead.ChecksumSHA256))
		}

		// Onto itself.
		for _, versioned := range []bool{false, true} {
			bk := "self"
			if versioned {
				bk = "self-versions"
			}
			mkBucket(t, c, bk)
			if versioned {
				setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
			}
			p := put(t, c, bk, "k", "self")
			_, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String(bk), Key: aws.String("k"), CopySource: aws.String(bk + "/k")})
			wantCode(t, err, "InvalidRequest")
			_, err = c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String(bk), Key: aws.String("k"), CopySource: aws.String(bk + "/k"),
				MetadataDirective: types.MetadataDirectiveCopy})
			wantCode(t, err, "InvalidRequest")
			before, _ := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bk), Key: aws.String("k")})
			out, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String(bk), Key: aws.String("k"), CopySource: aws.String(bk + "/k"),
				MetadataDirective: types.MetadataDirectiveReplace, ContentType: aws.String("text/x-new"), Metadata: map[string]string{"n": "1"}})
			if err != nil {
				t.Fatalf("versioned %v: copy onto itself with REPLACE: %v", versioned, err)
			}
			h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bk), Key: aws.String("k")})
			if err != nil || aws.ToString(h.ContentType) != "text/x-new" || h.Metadata["n"] != "1" || aws.ToString(h.ETag) != aws.ToString(p.ETag) {
				t.Fatalf("versioned %v: after REPLACE onto itself: %+v, %v", versioned, h, err)
			}
			if got := get(t, c, bk, "k"); got != "self" {
				t.Fatalf("versioned %v: body %q after REPLACE onto itself", versioned, got)
			}
			if h.LastModified.Before(*before.LastModified) {
				t.Errorf("versioned %v: Last-Modified went back: %v before %v", versioned, h.LastModified, before.LastModified)
			}
			if versioned {
				if out.VersionId == nil || aws.ToString(out.VersionId) == aws.ToString(p.VersionId) {
					t.Errorf("REPLACE onto itself in a versioned bucket: version %q (was %q)", aws.ToString(out.VersionId), aws.ToString(p.VersionId))
				}
				// From a named version (even the current one) it is allowed.
				if _, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String(bk), Key: aws.String("k"),
					CopySource: aws.String(bk + "/k?versionId=" + aws.ToString(p.VersionId))}); err != nil {
					t.Fatalf("copy of an old version onto its key: %v", err)
				}
				h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bk), Key: aws.String("k")})
				if err != nil || aws.ToString(h.ContentType) == "text/x-new" || h.Metadata["n"] != "" {
					t.Fatalf("after restoring the old version: %+v, %v", h, err)
				}
			}
		}
		noTempLeft(t, e)
	})
}
