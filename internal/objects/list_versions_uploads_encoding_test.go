package objects

import (
	"net/url"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestListVersionsAndUploadsEncodingTypeURL: ListObjectVersions and
// ListMultipartUploads honour encoding-type=url as the object listings
// do (s3api does not pass the parameter on): the answer says url and
// its keys, common prefixes, prefix, delimiter and key markers are
// URL-encoded, so that clients, which decode them, get the keys back.
// They were sent as they are, and "a+b" decoded to "a b".
func TestListVersionsAndUploadsEncodingTypeURL(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "encv")
	if _, err := e.alice.PutBucketVersioning(ctx, &s3.PutBucketVersioningInput{Bucket: aws.String("encv"),
		VersioningConfiguration: &types.VersioningConfiguration{Status: types.BucketVersioningStatusEnabled}}); err != nil {
		t.Fatal(err)
	}
	keys := []string{"100%", "a+b", "d/e&f", "sp ace"}
	for _, k := range keys {
		put(t, e.alice, "encv", k, k)
	}
	if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("encv"), Key: aws.String("a+b")}); err != nil {
		t.Fatal(err)
	}
	dec := func(s string) string {
		t.Helper()
		v, err := url.QueryUnescape(s)
		if err != nil {
			t.Fatalf("%q does not decode: %v", s, err)
		}
		return v
	}

	vs, err := e.alice.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: aws.String("encv"),
		EncodingType: types.EncodingTypeUrl, KeyMarker: aws.String("1 0"), Delimiter: aws.String("/")})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range vs.Versions {
		got = append(got, dec(aws.ToString(v.Key)))
	}
	if vs.EncodingType != types.EncodingTypeUrl || !slices.Equal(got, []string{"100%", "a+b", "sp ace"}) ||
		len(vs.DeleteMarkers) != 1 || dec(aws.ToString(vs.DeleteMarkers[0].Key)) != "a+b" ||
		len(vs.CommonPrefixes) != 1 || dec(aws.ToString(vs.CommonPrefixes[0].Prefix)) != "d/" ||
		dec(aws.ToString(vs.KeyMarker)) != "1 0" {
		t.Errorf("versions: EncodingType %q, keys %q, %d markers, prefixes %v, key marker %q",
			vs.EncodingType, got, len(vs.DeleteMarkers), vs.CommonPrefixes, aws.ToString(vs.KeyMarker))
	}

	for _, k := range keys {
		if _, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("encv"), Key: aws.String(k)}); err != nil {
			t.Fatal(err)
		}
	}
	ups, err := e.alice.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("encv"),
		EncodingType: types.EncodingTypeUrl, Prefix: aws.String("a+"), MaxUploads: aws.Int32(5)})
	if err != nil {
		t.Fatal(err)
	}
	if ups.EncodingType != types.EncodingTypeUrl || len(ups.Uploads) != 1 || dec(aws.ToString(ups.Uploads[0].Key)) != "a+b" ||
		dec(aws.ToString(ups.Prefix)) != "a+" {
		t.Errorf("uploads: EncodingType %q, %d uploads, prefix %q", ups.EncodingType, len(ups.Uploads), aws.ToString(ups.Prefix))
	}
	// Without it, names are as they are.
	plain, err := e.alice.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("encv"), Prefix: aws.String("a+")})
	if err != nil {
		t.Fatal(err)
	}
	if plain.EncodingType != "" || len(plain.Uploads) != 1 || aws.ToString(plain.Uploads[0].Key) != "a+b" {
		t.Errorf("plain uploads: EncodingType %q, %+v", plain.EncodingType, plain.Uploads)
	}
}
