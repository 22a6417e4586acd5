package objects

import (
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// entries merges a listing page's keys and common prefixes ("P:" and the
// prefix) in the byte order of their names, which is S3's.
func entries(objs []types.Object, cps []types.CommonPrefix) []string {
	type entry struct{ name, label string }
	var all []entry
	for _, o := range objs {
		all = append(all, entry{*o.Key, *o.Key})
	}
	for _, p := range cps {
		all = append(all, entry{*p.Prefix, "P:" + *p.Prefix})
	}
	slices.SortFunc(all, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	var out []string
	for _, e := range all {
		out = append(out, e.label)
	}
	return out
}

// TestListMarkersAndDelimiters: listings with delimiters other than "/"
// (one character or several, inside a directory name or not) roll keys up
// into common prefixes at the first delimiter after the prefix, as S3
// does; paging one entry at a time — version 1 by NextMarker, version 2
// by continuation token — gives the same entries in the same (byte)
// order, each once; StartAfter counts only for the first page of
// version 2 (the token takes over, StartAfter is echoed); max-keys 0
// answers an empty page that is not truncated.
func TestListMarkersAndDelimiters(t *testing.T) {
	e := newEnv(t, false)
	c := e.alice
	mkBucket(t, c, "lists")
	for _, k := range []string{"l/a-b-c", "l/a-b", "l/a.c", "l/a-", "l/b", "l/x/y-z", "l/x-y/z", "l/x/y/z"} {
		put(t, c, "lists", k, "x")
	}
	for _, tc := range []struct {
		delim string
		want  []string // keys and "P:" common prefixes, in order
	}{
		{"", []string{"l/a-", "l/a-b", "l/a-b-c", "l/a.c", "l/b", "l/x-y/z", "l/x/y-z", "l/x/y/z"}},
		{"/", []string{"l/a-", "l/a-b", "l/a-b-c", "l/a.c", "l/b", "P:l/x-y/", "P:l/x/"}},
		{"-", []string{"P:l/a-", "l/a.c", "l/b", "P:l/x-", "P:l/x/y-", "l/x/y/z"}},
		{".", []string{"l/a-", "l/a-b", "l/a-b-c", "P:l/a.", "l/b", "l/x-y/z", "l/x/y-z", "l/x/y/z"}},
		{"b-", []string{"l/a-", "l/a-b", "P:l/a-b-", "l/a.c", "l/b", "l/x-y/z", "l/x/y-z", "l/x/y/z"}},
		{"y/", []string{"l/a-", "l/a-b", "l/a-b-c", "l/a.c", "l/b", "P:l/x-y/", "l/x/y-z", "P:l/x/y/"}},
	} {
		all, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("lists"), Prefix: aws.String("l/"),
			Delimiter: aws.String(tc.delim)})
		if err != nil {
			t.Fatal(err)
		}
		whole := entries(all.Contents, all.CommonPrefixes)
		if !slices.Equal(whole, tc.want) {
			t.Errorf("delimiter %q, one page: %v, want %v", tc.delim, whole, tc.want)
		}

		var v2 []string
		var token *string
		for i := 0; i < 20; i++ {
			out, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("lists"), Prefix: aws.String("l/"),
				Delimiter: aws.String(tc.delim), MaxKeys: aws.Int32(1), ContinuationToken: token})
			if err != nil {
				t.Fatal(err)
			}
			v2 = append(v2, entries(out.Contents, out.CommonPrefixes)...)
			if aws.ToInt32(out.KeyCount) != int32(len(out.Contents)+len(out.CommonPrefixes)) {
				t.Errorf("delimiter %q: KeyCount %d for %d entries", tc.delim, aws.ToInt32(out.KeyCount), len(out.Contents)+len(out.CommonPrefixes))
			}
			if !aws.ToBool(out.IsTruncated) {
				break
			}
			token = out.NextContinuationToken
		}
		if !slices.Equal(v2, tc.want) {
			t.Errorf("delimiter %q, version 2 by one: %v, want %v", tc.delim, v2, tc.want)
		}

		var v1 []string
		var marker *string
		for i := 0; i < 20; i++ {
			out, err := c.ListObjects(ctx, &s3.ListObjectsInput{Bucket: aws.String("lists"), Prefix: aws.String("l/"),
				Delimiter: aws.String(tc.delim), MaxKeys: aws.Int32(1), Marker: marker})
			if err != nil {
				t.Fatal(err)
			}
			if aws.ToString(out.Marker) != aws.ToString(marker) {
				t.Errorf("delimiter %q: Marker echoed %q, sent %q", tc.delim, aws.ToString(out.Marker), aws.ToString(marker))
			}
			v1 = append(v1, entries(out.Contents, out.CommonPrefixes)...)
			if !aws.ToBool(out.IsTruncated) {
				if out.NextMarker != nil {
					t.Errorf("delimiter %q: NextMarker %q on the last page", tc.delim, *out.NextMarker)
				}
				break
			}
			marker = out.NextMarker
		}
		if !slices.Equal(v1, tc.want) {
			t.Errorf("delimiter %q, version 1 by one: %v, want %v", tc.delim, v1, tc.want)
		}
	}

	// StartAfter, then the token.
	first, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("lists"), Prefix: aws.String("l/"),
		StartAfter: aws.String("l/a-b"), MaxKeys: aws.Int32(2)})
	if err != nil {
		t.Fatal(err)
	}
	if got := entries(first.Contents, nil); !slices.Equal(got, []string{"l/a-b-c", "l/a.c"}) || aws.ToString(first.StartAfter) != "l/a-b" ||
		!aws.ToBool(first.IsTruncated) {
		t.Fatalf("start-after l/a-b: %v start-after %q truncated %v", got, aws.ToString(first.StartAfter), aws.ToBool(first.IsTruncated))
	}
	second, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("lists"), Prefix: aws.String("l/"),
		StartAfter: aws.String("l/a-b"), MaxKeys: aws.Int32(2), ContinuationToken: first.NextContinuationToken})
	if err != nil {
		t.Fatal(err)
	}
	if got := entries(second.Contents, nil); !slices.Equal(got, []string{"l/b", "l/x-y/z"}) ||
		aws.ToString(second.ContinuationToken) != aws.ToString(first.NextContinuationToken) || aws.ToString(second.StartAfter) != "l/a-b" {
		t.Fatalf("start-after with a token: %v token %q start-after %q", got, aws.ToString(second.ContinuationToken), aws.ToString(second.StartAfter))
	}
	// A StartAfter beyond the token still counts.
	third, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("lists"), Prefix: aws.String("l/"),
		StartAfter: aws.String("l/x/y-z"), ContinuationToken: first.NextContinuationToken})
	if err != nil || !slices.Equal(entries(third.Contents, nil), []string{"l/x/y/z"}) {
		t.Fatalf("start-after beyond the token: %v, %v", entries(third.Contents, nil), err)
	}
	_, err = c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("lists"), ContinuationToken: aws.String("!!")})
	wantCode(t, err, "InvalidArgument")

	// max-keys 0.
	v2, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("lists"), MaxKeys: aws.Int32(0)})
	if err != nil || len(v2.Contents)+len(v2.CommonPrefixes) != 0 || aws.ToBool(v2.IsTruncated) || aws.ToInt32(v2.KeyCount) != 0 {
		t.Fatalf("v2 max-keys 0: %d entries truncated %v key count %d, %v", len(v2.Contents)+len(v2.CommonPrefixes),
			aws.ToBool(v2.IsTruncated), aws.ToInt32(v2.KeyCount), err)
	}
	v1, err := c.ListObjects(ctx, &s3.ListObjectsInput{Bucket: aws.String("lists"), MaxKeys: aws.Int32(0), Delimiter: aws.String("/")})
	if err != nil || len(v1.Contents)+len(v1.CommonPrefixes) != 0 || aws.ToBool(v1.IsTruncated) {
		t.Fatalf("v1 max-keys 0: %d entries truncated %v, %v", len(v1.Contents)+len(v1.CommonPrefixes), aws.ToBool(v1.IsTruncated), err)
	}
}
