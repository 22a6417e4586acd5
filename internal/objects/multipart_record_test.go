package objects

import (
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/versity/versitygw/backend"
)

// TestManyPartsRecord: the record of an object completed from 10000
// parts (S3's limit) fits the xattr, and GET/HEAD ?partNumber= serve its
// parts. Its part ends as a list take over 100 KB, where an ext4 xattr
// holds about 4 KiB: CompleteMultipartUpload of more than some 370 parts
// of 5 MiB answered MetadataTooLarge. Uploading 10000 parts of 5 MiB
// would take 50 GB, so the test publishes what CompleteMultipartUpload
// does after joining the parts — a (sparse) file of their size with the
// record it makes — through the same calls, and reads it back over S3.
func TestManyPartsRecord(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		mkBucket(t, e.alice, "many")
		const n, last = 10000, 1 << 20
		ends := make([]int64, n)
		for i := range ends {
			ends[i] = int64(i+1) * backend.MinPartSize
		}
		ends[n-1] = ends[n-2] + last
		tmp, err := e.be.createTemp()
		if err != nil {
			t.Fatal(err)
		}
		rc := &received{f: tmp}
		defer rc.close()
		if err := tmp.Truncate(ends[n-1]); err != nil {
			t.Fatal(err)
		}
		fi, err := tmp.Stat()
		if err != nil {
			t.Fatal(err)
		}
		rc.st = fi.Sys().(*syscall.Stat_t)
		m := &objectMeta{ETag: fmt.Sprintf(`"%s-%d"`, strings.Repeat("ab", 16), n), Parts: ends,
			ContentType: "application/octet-stream", UserMeta: map[string]string{"note": strings.Repeat("m", 1000)}}
		if err := e.be.finish(rc, m); err != nil {
			t.Fatalf("record of a %d-part object: %v", n, err)
		}
		r, err := e.be.openBucket("many")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := e.be.publishWrite(r, "many", "k", tmp, m, "", nil); err != nil {
			t.Fatal(err)
		}
		rc.published = true

		for _, pn := range []int32{1, 2, 9999, n} {
			h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("many"), Key: aws.String("k"),
				PartNumber: aws.Int32(pn)})
			if err != nil {
				t.Fatalf("HEAD part %d: %v", pn, err)
			}
			start := int64(pn-1) * backend.MinPartSize
			want := fmt.Sprintf("bytes %d-%d/%d", start, ends[pn-1]-1, ends[n-1])
			if aws.ToInt32(h.PartsCount) != n || aws.ToString(h.ContentRange) != want ||
				aws.ToInt64(h.ContentLength) != ends[pn-1]-start || aws.ToString(h.ETag) != m.ETag {
				t.Errorf("HEAD part %d: parts %d, range %q (want %q), length %d, etag %s", pn, aws.ToInt32(h.PartsCount),
					aws.ToString(h.ContentRange), want, aws.ToInt64(h.ContentLength), aws.ToString(h.ETag))
			}
		}
		out, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("many"), Key: aws.String("k"),
			PartNumber: aws.Int32(n)})
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.Copy(io.Discard, out.Body)
		out.Body.Close()
		if err != nil || got != last {
			t.Errorf("GET last part: %d bytes, %v", got, err)
		}
		l, err := e.alice.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("many")})
		if err != nil || len(l.Contents) != 1 || aws.ToString(l.Contents[0].ETag) != m.ETag {
			t.Errorf("list: %+v %v", l, err)
		}
	})
}
