package objects

import (
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestListVersionsKeyEndingInDelimiter pages through ListObjectVersions
// with a delimiter other than "/" and a prefix that is itself a key ending
// in the delimiter ("2024-"): the key-marker of the next page is then a
// key, not a common prefix, and the page must go on with that key's older
// versions and the keys after it, not skip everything it prefixes.
func TestListVersionsKeyEndingInDelimiter(t *testing.T) {
	e := newEnv(t, false)
	c := e.alice
	mkBucket(t, c, "vdelim")
	setVersioning(t, c, "vdelim", types.BucketVersioningStatusEnabled)
	var want []string
	for _, k := range []string{"2024-", "2024-", "2024-a", "2024-b"} {
		out := put(t, c, "vdelim", k, "x")
		want = append(want, k+"@"+aws.ToString(out.VersionId))
	}
	// Newest first within a key.
	want[0], want[1] = want[1], want[0]
	for _, max := range []int32{1, 2, 1000} {
		var got []string
		in := &s3.ListObjectVersionsInput{Bucket: aws.String("vdelim"), Prefix: aws.String("2024-"),
			Delimiter: aws.String("-"), MaxKeys: &max}
		for pages := 0; ; pages++ {
			if pages > 20 {
				t.Fatal("ListObjectVersions does not end")
			}
			page, err := c.ListObjectVersions(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range page.Versions {
				got = append(got, aws.ToString(v.Key)+"@"+aws.ToString(v.VersionId))
			}
			if len(page.CommonPrefixes) > 0 || len(page.DeleteMarkers) > 0 {
				t.Fatalf("max-keys %d: unexpected prefixes %v / markers %v", max, page.CommonPrefixes, page.DeleteMarkers)
			}
			if !aws.ToBool(page.IsTruncated) {
				break
			}
			in.KeyMarker, in.VersionIdMarker = page.NextKeyMarker, page.NextVersionIdMarker
		}
		if !slices.Equal(got, want) {
			t.Errorf("max-keys %d: listed %v, want %v", max, got, want)
		}
	}
}
