package objects

import (
	"io"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// TestRangeEdges: Range edge cases as RFC 9110 14.1-14.2 and AWS GetObject
// have them, for GET and HEAD alike. A suffix of 0 bytes and a first
// position at or beyond the end are unsatisfiable (416 InvalidRange); a
// last position beyond the end is the rest of the object and a suffix
// longer than the object the whole of it (206, Content-Range); a range
// whose last position is below its first, an unknown unit, several
// ranges (which S3 does not serve) and malformed ranges are ignored:
// the whole object, 200, no Content-Range.
func TestRangeEdges(t *testing.T) {
	e := newEnv(t, false)
	c := e.alice
	mkBucket(t, c, "ranges")
	const body = "0123456789"
	put(t, c, "ranges", "k", body)
	for _, tc := range []struct {
		rng    string
		status int
		want   string // body
		cr     string // Content-Range
	}{
		{"bytes=0-0", 206, "0", "bytes 0-0/10"},
		{"bytes=9-9", 206, "9", "bytes 9-9/10"},
		{"bytes=9-100", 206, "9", "bytes 9-9/10"},
		{"bytes=3-", 206, "3456789", "bytes 3-9/10"},
		{"bytes=0-", 206, body, "bytes 0-9/10"},
		{"bytes=-3", 206, "789", "bytes 7-9/10"},
		{"bytes=-10", 206, body, "bytes 0-9/10"},
		{"bytes=-100", 206, body, "bytes 0-9/10"},
		{"bytes=-0", 416, "", ""},
		{"bytes=10-", 416, "", ""},
		{"bytes=10-20", 416, "", ""},
		{"bytes=100-200", 416, "", ""},
		{"bytes=5-2", 200, body, ""},
		{"bytes=0-1,3-4", 200, body, ""},
		{"items=0-1", 200, body, ""},
		{"bytes=-", 200, body, ""},
		{"bytes=a-b", 200, body, ""},
	} {
		g, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("ranges"), Key: aws.String("k"), Range: aws.String(tc.rng)})
		status, got, cr := statusOf(err), "", ""
		if err == nil {
			b, _ := io.ReadAll(g.Body)
			g.Body.Close()
			got, cr = string(b), aws.ToString(g.ContentRange)
			if cr != "" {
				status = 206
			}
			if aws.ToInt64(g.ContentLength) != int64(len(tc.want)) {
				t.Errorf("GET %s: Content-Length %d, want %d", tc.rng, aws.ToInt64(g.ContentLength), len(tc.want))
			}
		}
		if status != tc.status || got != tc.want || cr != tc.cr {
			t.Errorf("GET %s: %d %q Content-Range %q (%v), want %d %q %q", tc.rng, status, got, cr, err, tc.status, tc.want, tc.cr)
		}
		if tc.status == 416 && code(err) != "InvalidRange" {
			t.Errorf("GET %s: code %q, want InvalidRange", tc.rng, code(err))
		}
		h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("ranges"), Key: aws.String("k"), Range: aws.String(tc.rng)})
		status, cr = statusOf(err), ""
		if err == nil {
			if cr = aws.ToString(h.ContentRange); cr != "" {
				status = 206
			}
			if aws.ToInt64(h.ContentLength) != int64(len(tc.want)) {
				t.Errorf("HEAD %s: Content-Length %d, want %d", tc.rng, aws.ToInt64(h.ContentLength), len(tc.want))
			}
		}
		if status != tc.status || cr != tc.cr {
			t.Errorf("HEAD %s: %d Content-Range %q (%v), want %d %q", tc.rng, status, cr, err, tc.status, tc.cr)
		}
	}
}
