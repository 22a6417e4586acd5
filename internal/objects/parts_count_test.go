package objects

import (
	"io"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// TestPartsCountOnlyWithPartNumber: x-amz-mp-parts-count answers a GET
// or HEAD that names a part (?partNumber=), as S3 sends it, and no other
// GET or HEAD of a multipart object (whole, or a Range). It was sent with
// every GET and HEAD of an object uploaded in parts.
func TestPartsCountOnlyWithPartNumber(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "partscount")
	completeUpload(t, e.alice, "partscount", "mp", "0123456789")
	for _, c := range []struct {
		what string
		part *int32
		rng  *string
		want *int32
	}{
		{"whole", nil, nil, nil},
		{"range", nil, aws.String("bytes=0-3"), nil},
		{"part 1", aws.Int32(1), nil, aws.Int32(1)},
	} {
		g, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("partscount"), Key: aws.String("mp"),
			PartNumber: c.part, Range: c.rng})
		if err != nil {
			t.Fatalf("GET %s: %v", c.what, err)
		}
		_, err = io.Copy(io.Discard, g.Body)
		g.Body.Close()
		if err != nil {
			t.Fatalf("GET %s body: %v", c.what, err)
		}
		if (g.PartsCount == nil) != (c.want == nil) || aws.ToInt32(g.PartsCount) != aws.ToInt32(c.want) {
			t.Errorf("GET %s: parts count %v (set %t), want %v (set %t)", c.what, aws.ToInt32(g.PartsCount),
				g.PartsCount != nil, aws.ToInt32(c.want), c.want != nil)
		}
		h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("partscount"), Key: aws.String("mp"),
			PartNumber: c.part, Range: c.rng})
		if err != nil {
			t.Fatalf("HEAD %s: %v", c.what, err)
		}
		if (h.PartsCount == nil) != (c.want == nil) || aws.ToInt32(h.PartsCount) != aws.ToInt32(c.want) {
			t.Errorf("HEAD %s: parts count %v (set %t), want %v (set %t)", c.what, aws.ToInt32(h.PartsCount),
				h.PartsCount != nil, aws.ToInt32(c.want), c.want != nil)
		}
	}
}
