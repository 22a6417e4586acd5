package objects

import (
	"io"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// TestGetConditionalCombinations: GET and HEAD with several conditional
// headers at once, evaluated in RFC 9110 13.2.2's order as AWS GetObject
// and HeadObject document: If-Match decides alone over
// If-Unmodified-Since (true If-Match, false If-Unmodified-Since: 200),
// If-None-Match alone over If-Modified-Since (false If-None-Match, true
// If-Modified-Since: 304), and a 412 precondition beats a 304 one. A
// Range never changes the outcome of the conditions.
func TestGetConditionalCombinations(t *testing.T) {
	e := newEnv(t, false)
	c := e.alice
	mkBucket(t, c, "conds")
	etag := aws.ToString(put(t, c, "conds", "k", "0123456789").ETag)
	h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("conds"), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	lm := *h.LastModified
	before, at := lm.Add(-time.Hour), lm
	other := `"` + md5hex("other") + `"`
	s := func(v string) *string { return &v }
	tm := func(v time.Time) *time.Time { return &v }

	for _, tc := range []struct {
		name     string
		ifMatch  *string
		ifNone   *string
		ifMod    *time.Time
		ifUnmod  *time.Time
		want     int
		wantBody string
	}{
		{name: "match", ifMatch: s(etag), want: 200},
		{name: "match, unmodified-since false", ifMatch: s(etag), ifUnmod: tm(before), want: 200},
		{name: "match fails, unmodified-since true", ifMatch: s(other), ifUnmod: tm(at), want: 412},
		{name: "unmodified-since false alone", ifUnmod: tm(before), want: 412},
		{name: "none-match false, modified-since true", ifNone: s(etag), ifMod: tm(before), want: 304},
		{name: "none-match true, modified-since false", ifNone: s(other), ifMod: tm(at), want: 200},
		{name: "modified-since false alone", ifMod: tm(at), want: 304},
		{name: "modified-since true alone", ifMod: tm(before), want: 200},
		{name: "match fails, none-match false", ifMatch: s(other), ifNone: s(etag), want: 412},
		{name: "match, none-match false", ifMatch: s(etag), ifNone: s(etag), want: 304},
		{name: "match, modified-since false", ifMatch: s(etag), ifMod: tm(at), want: 304},
		{name: "unmodified-since false, none-match false", ifUnmod: tm(before), ifNone: s(etag), want: 412},
		{name: "unmodified-since false, modified-since false", ifUnmod: tm(before), ifMod: tm(at), want: 412},
		{name: "all hold", ifMatch: s(etag), ifNone: s(other), ifMod: tm(before), ifUnmod: tm(at), want: 200},
	} {
		for _, rng := range []*string{nil, s("bytes=2-4")} {
			g, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("conds"), Key: aws.String("k"),
				IfMatch: tc.ifMatch, IfNoneMatch: tc.ifNone, IfModifiedSince: tc.ifMod, IfUnmodifiedSince: tc.ifUnmod, Range: rng})
			want := tc.want
			if want == 200 && rng != nil {
				want = 206
			}
			got := statusOf(err)
			if err == nil {
				body, _ := io.ReadAll(g.Body)
				g.Body.Close()
				if rng != nil {
					got = 206
					if string(body) != "234" {
						t.Errorf("%s, range: body %q", tc.name, body)
					}
				}
			}
			if got != want {
				t.Errorf("GET %s (range %v): %d (%v), want %d", tc.name, aws.ToString(rng), got, err, want)
			}
			if want == 412 && code(err) != "PreconditionFailed" {
				t.Errorf("GET %s: code %q, want PreconditionFailed", tc.name, code(err))
			}
			_, err = c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("conds"), Key: aws.String("k"),
				IfMatch: tc.ifMatch, IfNoneMatch: tc.ifNone, IfModifiedSince: tc.ifMod, IfUnmodifiedSince: tc.ifUnmod, Range: rng})
			if got := statusOf(err); got != tc.want {
				t.Errorf("HEAD %s (range %v): %d (%v), want %d", tc.name, aws.ToString(rng), got, err, tc.want)
			}
		}
	}
}
