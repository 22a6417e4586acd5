package objects

import (
	"net/url"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestListEncodingTypeURL: a listing asked for with encoding-type=url
// answers EncodingType url and URL-encodes the keys, common prefixes,
// prefix, delimiter, marker and start-after it returns, as S3 does.
// Clients that ask for it decode what they get whatever the answer
// says (rclone, for one, unescapes every key of such a listing): the
// parameter was ignored, so "a+b" came back to them as "a b" and
// "c%2F" as "c/", and "100%" failed to decode and was dropped.
func TestListEncodingTypeURL(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "enc")
	all := []string{"100%", "a+b", "c%2F", "d/e&f", "d/e&g", "q?x=y#z", "sp ace", "\u00e9"}
	for _, k := range all {
		put(t, e.alice, "enc", k, k)
	}
	dec := func(t *testing.T, s *string) string {
		t.Helper()
		v, err := url.QueryUnescape(aws.ToString(s))
		if err != nil {
			t.Fatalf("%q does not decode: %v", aws.ToString(s), err)
		}
		return v
	}

	// Version 2, page by page (the continuation token is not encoded).
	var got []string
	var token *string
	for {
		out, err := e.alice.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("enc"), EncodingType: types.EncodingTypeUrl,
			MaxKeys: aws.Int32(3), ContinuationToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if out.EncodingType != types.EncodingTypeUrl {
			t.Fatalf("V2: EncodingType %q, want url", out.EncodingType)
		}
		for _, o := range out.Contents {
			got = append(got, dec(t, o.Key))
		}
		if !aws.ToBool(out.IsTruncated) {
			break
		}
		token = out.NextContinuationToken
	}
	if !slices.Equal(got, all) {
		t.Errorf("V2 keys, decoded: %q, want %q", got, all)
	}

	out, err := e.alice.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("enc"), EncodingType: types.EncodingTypeUrl,
		Prefix: aws.String("d/"), Delimiter: aws.String("&"), StartAfter: aws.String("a+b")})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.CommonPrefixes) != 1 || dec(t, out.CommonPrefixes[0].Prefix) != "d/e&" || len(out.Contents) != 0 ||
		dec(t, out.Prefix) != "d/" || dec(t, out.Delimiter) != "&" || dec(t, out.StartAfter) != "a+b" {
		t.Errorf("V2 prefix d/, delimiter &: prefixes %v, %d keys, prefix %q, delimiter %q, start-after %q",
			out.CommonPrefixes, len(out.Contents), aws.ToString(out.Prefix), aws.ToString(out.Delimiter), aws.ToString(out.StartAfter))
	}

	// Version 1: the marker (and NextMarker) too.
	v1, err := e.alice.ListObjects(ctx, &s3.ListObjectsInput{Bucket: aws.String("enc"), EncodingType: types.EncodingTypeUrl,
		Marker: aws.String("a+b"), MaxKeys: aws.Int32(1), Delimiter: aws.String("/")})
	if err != nil {
		t.Fatal(err)
	}
	if v1.EncodingType != types.EncodingTypeUrl || len(v1.Contents) != 1 || dec(t, v1.Contents[0].Key) != "c%2F" ||
		dec(t, v1.Marker) != "a+b" || dec(t, v1.NextMarker) != "c%2F" {
		t.Errorf("V1 after a+b: EncodingType %q, marker %q, next marker %q, keys %d", v1.EncodingType,
			aws.ToString(v1.Marker), aws.ToString(v1.NextMarker), len(v1.Contents))
	}

	// Without encoding-type, keys are as they are.
	plain, err := e.alice.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("enc")})
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	for _, o := range plain.Contents {
		got = append(got, aws.ToString(o.Key))
	}
	if plain.EncodingType != "" || !slices.Equal(got, all) {
		t.Errorf("plain listing: EncodingType %q, keys %q", plain.EncodingType, got)
	}
}
