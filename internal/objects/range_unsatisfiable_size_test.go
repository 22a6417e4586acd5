package objects

import (
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// TestRangeUnsatisfiableGivesSize: a GET's or HEAD's 416 InvalidRange
// carries Content-Range: bytes */SIZE, as S3's does and RFC 9110 15.5.17
// asks of a 416 to a byte-range request, so a client learns the object's
// size and can ask for a range it holds. An empty object answers every
// range so. Before, the 416 had no Content-Range.
func TestRangeUnsatisfiableGivesSize(t *testing.T) {
	e := newMiddlewareEnv(t)
	c := e.alice
	mkBucket(t, c, "unsat")
	put(t, c, "unsat", "ten", "0123456789")
	put(t, c, "unsat", "empty", "")
	for _, tc := range []struct{ key, rng, want string }{
		{"ten", "bytes=10-", "bytes */10"},
		{"ten", "bytes=100-200", "bytes */10"},
		{"ten", "bytes=-0", "bytes */10"},
		{"empty", "bytes=0-0", "bytes */0"},
	} {
		_, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("unsat"), Key: aws.String(tc.key), Range: aws.String(tc.rng)})
		a := answerOf(t, "GET "+tc.key+" "+tc.rng, err)
		if a.status != http.StatusRequestedRangeNotSatisfiable || a.header.Get("Content-Range") != tc.want {
			t.Errorf("GET %s Range %s: %d Content-Range %q, want 416 %q", tc.key, tc.rng, a.status, a.header.Get("Content-Range"), tc.want)
		}
		_, err = c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("unsat"), Key: aws.String(tc.key), Range: aws.String(tc.rng)})
		a = answerOf(t, "HEAD "+tc.key+" "+tc.rng, err)
		if a.status != http.StatusRequestedRangeNotSatisfiable || a.header.Get("Content-Range") != tc.want {
			t.Errorf("HEAD %s Range %s: %d Content-Range %q, want 416 %q", tc.key, tc.rng, a.status, a.header.Get("Content-Range"), tc.want)
		}
	}
}
