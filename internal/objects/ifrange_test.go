package objects

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// TestIfRange: a GET or HEAD with Range and If-Range is served the range
// only while If-Range holds (RFC 9110 13.1.5, which S3 follows): the
// object's ETag (strong comparison) or its Last-Modified. Otherwise the
// whole object, 200. s3api drops the header, and the range of the new
// object was served to a client resuming a download of the old one —
// wrong bytes spliced onto the ones it had.
func TestIfRange(t *testing.T) {
	e := newMiddlewareEnv(t)
	mkBucket(t, e.alice, "ifrange")
	old := put(t, e.alice, "ifrange", "k", "the old content")
	cur := put(t, e.alice, "ifrange", "k", "0123456789")
	h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("ifrange"), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	lastModified := h.LastModified.UTC()
	for _, c := range []struct {
		name, ifRange string
		ranged        bool // the range is served
	}{
		{"current ETag", aws.ToString(cur.ETag), true},
		{"current ETag unquoted", aws.ToString(cur.ETag)[1 : len(aws.ToString(cur.ETag))-1], true},
		{"Last-Modified", lastModified.Format(http.TimeFormat), true},
		{"replaced object's ETag", aws.ToString(old.ETag), false},
		{"weak ETag", "W/" + aws.ToString(cur.ETag), false},
		{"earlier date", lastModified.Add(-time.Second).Format(http.TimeFormat), false},
		{"later date", lastModified.Add(time.Second).Format(http.TimeFormat), false},
		{"garbage", "not a validator", false},
	} {
		opt := s3.WithAPIOptions(smithyhttp.AddHeaderValue("If-Range", c.ifRange))
		out, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("ifrange"), Key: aws.String("k"),
			Range: aws.String("bytes=2-4")}, opt)
		if err != nil {
			t.Fatalf("%s: GET: %v", c.name, err)
		}
		body, err := io.ReadAll(out.Body)
		out.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		want, wantRange := "0123456789", ""
		if c.ranged {
			want, wantRange = "234", "bytes 2-4/10"
		}
		if string(body) != want || aws.ToString(out.ContentRange) != wantRange {
			t.Errorf("%s: GET with If-Range %q: %q, Content-Range %q; want %q, %q", c.name, c.ifRange, body,
				aws.ToString(out.ContentRange), want, wantRange)
		}
		hd, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("ifrange"), Key: aws.String("k"),
			Range: aws.String("bytes=2-4")}, opt)
		if err != nil {
			t.Fatalf("%s: HEAD: %v", c.name, err)
		}
		if aws.ToString(hd.ContentRange) != wantRange || aws.ToInt64(hd.ContentLength) != int64(len(want)) {
			t.Errorf("%s: HEAD with If-Range %q: Content-Range %q, length %d; want %q, %d", c.name, c.ifRange,
				aws.ToString(hd.ContentRange), aws.ToInt64(hd.ContentLength), wantRange, len(want))
		}
	}
	// Without a Range, If-Range changes nothing.
	out, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("ifrange"), Key: aws.String("k")},
		s3.WithAPIOptions(smithyhttp.AddHeaderValue("If-Range", aws.ToString(old.ETag))))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(out.Body)
	out.Body.Close()
	if string(body) != "0123456789" || out.ContentRange != nil {
		t.Errorf("GET without Range: %q, Content-Range %q", body, aws.ToString(out.ContentRange))
	}
}
