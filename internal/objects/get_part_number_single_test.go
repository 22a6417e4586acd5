package objects

import (
	"io"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// TestGetPartNumberSingle: GET or HEAD ?partNumber=1 of an object not
// uploaded in parts is, as S3 answers it, a range that covers the whole
// object: 206 with Content-Range "bytes 0-<size-1>/<size>", and no
// x-amz-mp-parts-count (the object has no parts). It was a plain 200
// without Content-Range and with a parts count of 1, so a client that
// learns the object's size from the Content-Range of its first part
// found none. An empty object has no range to name: 200, as before.
func TestGetPartNumberSingle(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "parts")
	put(t, e.alice, "parts", "k", "0123456789")
	put(t, e.alice, "parts", "empty", "")
	for _, c := range []struct {
		key, body, contentRange string
		code                    int
	}{
		{"k", "0123456789", "bytes 0-9/10", 206},
		{"empty", "", "", 200},
	} {
		g, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("parts"), Key: aws.String(c.key), PartNumber: aws.Int32(1)})
		if err != nil {
			t.Fatalf("GET %s part 1: %v", c.key, err)
		}
		body, err := io.ReadAll(g.Body)
		g.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		code := awsmiddleware.GetRawResponse(g.ResultMetadata).(*smithyhttp.Response).StatusCode
		if string(body) != c.body || aws.ToString(g.ContentRange) != c.contentRange || code != c.code || g.PartsCount != nil {
			t.Errorf("GET %s part 1: %d %q, Content-Range %q, parts count %v; want %d %q, %q, none", c.key, code, body,
				aws.ToString(g.ContentRange), aws.ToInt32(g.PartsCount), c.code, c.body, c.contentRange)
		}
		h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("parts"), Key: aws.String(c.key), PartNumber: aws.Int32(1)})
		if err != nil {
			t.Fatalf("HEAD %s part 1: %v", c.key, err)
		}
		code = awsmiddleware.GetRawResponse(h.ResultMetadata).(*smithyhttp.Response).StatusCode
		if aws.ToInt64(h.ContentLength) != int64(len(c.body)) || aws.ToString(h.ContentRange) != c.contentRange ||
			code != c.code || h.PartsCount != nil {
			t.Errorf("HEAD %s part 1: %d, length %d, Content-Range %q, parts count %v; want %d, %d, %q, none", c.key, code,
				aws.ToInt64(h.ContentLength), aws.ToString(h.ContentRange), aws.ToInt32(h.PartsCount), c.code, len(c.body), c.contentRange)
		}
	}
	// There is no part 2.
	_, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("parts"), Key: aws.String("k"), PartNumber: aws.Int32(2)})
	wantCode(t, err, "InvalidPartNumber")
}
