package objects

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// statusOf is the HTTP status a request answered: 200 for success.
func statusOf(err error) int {
	if err == nil {
		return 200
	}
	return httpStatus(err)
}

// TestConditionalETagLists: If-Match and If-None-Match carry a list
// of entity tags, `*`, or weak tags (RFC 9110 13.1.1, 13.1.2; S3 refers
// its conditional reads and writes to the RFC). If-Match holds when any
// tag of the list matches by strong comparison (a weak tag never does);
// If-None-Match fails when any tag matches by weak comparison (W/ is
// ignored). The same holds for GET, HEAD, a copy's source, a conditional
// PUT and DeleteObject. S3 clients also send an ETag without its quotes.
func TestConditionalETagLists(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "cond")
	etag := aws.ToString(put(t, e.alice, "cond", "k", "body").ETag)
	bare := strings.Trim(etag, `"`)
	other := `"` + md5hex("other") + `"`
	opt := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}

	for _, c := range []struct {
		ifMatch, ifNoneMatch string
		want                 int
	}{
		{ifMatch: etag, want: 200},
		{ifMatch: bare, want: 200},
		{ifMatch: "*", want: 200},
		{ifMatch: other, want: 412},
		{ifMatch: other + ", " + etag, want: 200},
		{ifMatch: etag + ", " + other, want: 200},
		{ifMatch: other + "," + etag, want: 200},
		{ifMatch: other + " , " + etag + " , " + other, want: 200},
		{ifMatch: "W/" + etag, want: 412},
		{ifMatch: other + ", W/" + etag, want: 412},
		{ifMatch: `"` + bare + `,x"`, want: 412}, // one tag holding a comma
		{ifNoneMatch: etag, want: 304},
		{ifNoneMatch: "*", want: 304},
		{ifNoneMatch: other, want: 200},
		{ifNoneMatch: other + ", " + etag, want: 304},
		{ifNoneMatch: "W/" + etag, want: 304},
		{ifNoneMatch: other + ", W/" + etag, want: 304},
		{ifNoneMatch: other + `, "` + md5hex("x") + `"`, want: 200},
		{ifMatch: other + ", " + etag, ifNoneMatch: "W/" + etag, want: 304},
		{ifMatch: other + ", " + etag, ifNoneMatch: other, want: 200},
	} {
		g, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("cond"), Key: aws.String("k"),
			IfMatch: opt(c.ifMatch), IfNoneMatch: opt(c.ifNoneMatch)})
		if err == nil {
			g.Body.Close()
		}
		if got := statusOf(err); got != c.want {
			t.Errorf("GET If-Match %q If-None-Match %q: %d (%v), want %d", c.ifMatch, c.ifNoneMatch, got, err, c.want)
		}
		_, err = e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("cond"), Key: aws.String("k"),
			IfMatch: opt(c.ifMatch), IfNoneMatch: opt(c.ifNoneMatch)})
		if got := statusOf(err); got != c.want {
			t.Errorf("HEAD If-Match %q If-None-Match %q: %d (%v), want %d", c.ifMatch, c.ifNoneMatch, got, err, c.want)
		}
		// A copy answers 412 where a GET answers 304.
		want := c.want
		if want == 304 {
			want = 412
		}
		_, err = e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("cond"), Key: aws.String("copy"),
			CopySource: aws.String("cond/k"), CopySourceIfMatch: opt(c.ifMatch), CopySourceIfNoneMatch: opt(c.ifNoneMatch)})
		if got := statusOf(err); got != want {
			t.Errorf("copy x-amz-copy-source-if-match %q -if-none-match %q: %d (%v), want %d",
				c.ifMatch, c.ifNoneMatch, got, err, want)
		}
	}

	// Conditional writes: If-Match is compared as for a GET (the body is
	// the same, so the ETag stays).
	for _, c := range []struct {
		ifMatch string
		want    int
	}{
		{etag, 200}, {bare, 200}, {"*", 200}, {other, 412},
		{other + ", " + etag, 200}, {etag + "," + other, 200},
		{"W/" + etag, 412}, {other + ", W/" + etag, 412},
	} {
		_, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("cond"), Key: aws.String("k"),
			Body: strings.NewReader("body"), IfMatch: &c.ifMatch})
		if got := statusOf(err); got != c.want {
			t.Errorf("PUT If-Match %q: %d (%v), want %d", c.ifMatch, got, err, c.want)
		}
	}
	// If-Match: * asks for an object: there is none.
	_, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("cond"), Key: aws.String("none"),
		Body: strings.NewReader("body"), IfMatch: aws.String("*")})
	if code(err) != "NoSuchKey" {
		t.Errorf("PUT If-Match * of a missing key: %v, want NoSuchKey", err)
	}
	// S3 takes only If-None-Match: * on writes.
	_, err = e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("cond"), Key: aws.String("k"),
		Body: strings.NewReader("body"), IfNoneMatch: aws.String(other + ", " + etag)})
	if code(err) != "NotImplemented" {
		t.Errorf("PUT If-None-Match with ETags: %v, want NotImplemented", err)
	}

	// Conditional deletes.
	for _, ifMatch := range []string{"W/" + etag, other + ", W/" + etag, other} {
		_, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("cond"), Key: aws.String("k"),
			IfMatch: &ifMatch})
		if statusOf(err) != 412 {
			t.Errorf("DELETE If-Match %q: %v, want 412", ifMatch, err)
		}
	}
	if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("cond"), Key: aws.String("k"),
		IfMatch: aws.String(other + ", " + etag)}); err != nil {
		t.Errorf("DELETE If-Match with the ETag in a list: %v", err)
	}
	if _, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("cond"), Key: aws.String("k")}); httpStatus(err) != 404 {
		t.Errorf("object still there after its conditional DELETE: %v", err)
	}
}

// TestRangeOverflow: positions in a Range header are decimal
// numerals of any length (RFC 9110 14.1.2: recipients "MUST anticipate
// potentially large decimal numerals and prevent parsing errors due to
// integer conversion overflows"; S3's GetObject refers to the RFC's
// Range). One beyond int64 is simply beyond the object: a last position
// past the end means the rest of the object (206), a first position past
// it is unsatisfiable (416), a suffix longer than the object is all of it.
// Only a range whose last position is below its first is invalid, and
// ignored (200).
func TestRangeOverflow(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "rng")
	put(t, e.alice, "rng", "k", "0123456789")
	const huge, huger = "99999999999999999999", "99999999999999999999999"
	for _, c := range []struct {
		rng          string
		status       int
		contentRange string
		body         string
	}{
		{"bytes=0-" + huge, 206, "bytes 0-9/10", "0123456789"},
		{"bytes=3-" + huge, 206, "bytes 3-9/10", "3456789"},
		{"bytes=-" + huge, 206, "bytes 0-9/10", "0123456789"},
		{"bytes=" + huge + "-", 416, "", ""},
		{"bytes=" + huge + "-" + huger, 416, "", ""},
		{"bytes=" + huger + "-" + huge, 200, "", "0123456789"}, // last < first: invalid
		{"bytes=" + huge + "-5", 200, "", "0123456789"},
		{"bytes=00000000000000000000000003-5", 206, "bytes 3-5/10", "345"},
	} {
		g, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("rng"), Key: aws.String("k"), Range: &c.rng})
		if err != nil {
			if got := statusOf(err); got != c.status {
				t.Errorf("GET Range %s: %v, want %d", c.rng, err, c.status)
			} else if code(err) != "InvalidRange" {
				t.Errorf("GET Range %s: %v, want InvalidRange", c.rng, err)
			}
			continue
		}
		body, _ := io.ReadAll(g.Body)
		g.Body.Close()
		status := 200
		if aws.ToString(g.ContentRange) != "" {
			status = 206
		}
		if status != c.status || aws.ToString(g.ContentRange) != c.contentRange || string(body) != c.body {
			t.Errorf("GET Range %s: %d %q %q, want %d %q %q", c.rng, status, aws.ToString(g.ContentRange), body,
				c.status, c.contentRange, c.body)
		}
		h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("rng"), Key: aws.String("k"), Range: &c.rng})
		if err != nil || aws.ToString(h.ContentRange) != c.contentRange {
			t.Errorf("HEAD Range %s: %v, Content-Range %q, want %q", c.rng, err, aws.ToString(h.ContentRange), c.contentRange)
		}
	}
}

// TestConditionalWritesAtomic: a write's conditions hold when it lands.
// Of concurrent PUTs with If-None-Match: * to a missing key exactly one
// succeeds (the others answer 412), and the object is its body; of
// concurrent PUTs with If-Match of the current ETag, likewise — what
// clients build put-if-absent and compare-and-swap commits on.
func TestConditionalWritesAtomic(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c, bk := e.alice, "atomic"
		mkBucket(t, c, bk)
		const writers = 12
		races := 0
		race := func(key string, cond func(*s3.PutObjectInput)) (winner string) {
			t.Helper()
			races++ // every body differs from every earlier one, so does its ETag
			var wg sync.WaitGroup
			start := make(chan struct{})
			codes := make([]int, writers)
			for i := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					in := &s3.PutObjectInput{Bucket: &bk, Key: aws.String(key), Body: strings.NewReader(fmt.Sprintf("race %d writer %d", races, i))}
					cond(in)
					_, err := c.PutObject(ctx, in)
					codes[i] = statusOf(err)
				}()
			}
			close(start)
			wg.Wait()
			won := 0
			for i, code := range codes {
				switch code {
				case 200:
					won++
					winner = fmt.Sprintf("race %d writer %d", races, i)
				case 412:
				default:
					t.Fatalf("%s: writer %d answered %d", key, i, code)
				}
			}
			if won != 1 {
				t.Fatalf("%s: %d of %d conditional writes succeeded (%v), want 1", key, won, writers, codes)
			}
			if got := get(t, c, bk, key); got != winner {
				t.Fatalf("%s holds %q, the winner wrote %q", key, got, winner)
			}
			return winner
		}
		for round := range 3 {
			key := fmt.Sprintf("k%d", round)
			race(key, func(in *s3.PutObjectInput) { in.IfNoneMatch = aws.String("*") })
			h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bk, Key: aws.String(key)})
			if err != nil {
				t.Fatal(err)
			}
			race(key, func(in *s3.PutObjectInput) { in.IfMatch = h.ETag })
		}
	})
}
