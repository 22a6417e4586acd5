package objects

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// latestAgrees says whether GET of bucket/key and ListObjectVersions
// agree on the key's latest version: the entry the listing marks
// IsLatest is the version GET serves, or, when GET answers NoSuchKey, a
// delete marker (or there is none). It returns what each said, and
// calls no t method: it runs in fault hooks, on the server's goroutines.
func latestAgrees(c *s3.Client, bucket, key string) (string, error) {
	got := ""
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	switch {
	case err == nil:
		out.Body.Close()
		got = "object " + aws.ToString(out.VersionId)
		if out.VersionId == nil {
			got = "object null"
		}
	case code(err) == "NoSuchKey":
		got = "NoSuchKey"
	default:
		return "", fmt.Errorf("GET %s: %v", key, err)
	}
	page, err := c.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: &bucket, Prefix: &key})
	if err != nil {
		return "", fmt.Errorf("list versions of %s: %v", key, err)
	}
	latest, n := "none", 0
	for _, v := range page.Versions {
		if aws.ToString(v.Key) == key && aws.ToBool(v.IsLatest) {
			latest, n = "object "+aws.ToString(v.VersionId), n+1
		}
	}
	for _, m := range page.DeleteMarkers {
		if aws.ToString(m.Key) == key && aws.ToBool(m.IsLatest) {
			latest, n = "marker "+aws.ToString(m.VersionId), n+1
		}
	}
	state := fmt.Sprintf("GET: %s, listing's latest: %s", got, latest)
	if n > 1 {
		return state, fmt.Errorf("%d entries IsLatest", n)
	}
	if got == "NoSuchKey" && latest != "none" && !strings.HasPrefix(latest, "marker ") || got != "NoSuchKey" && got != latest {
		return state, errors.New("GET and the listing disagree")
	}
	return state, nil
}

// disagreements runs do with fsFault asking, at every step of a write or
// delete, whether GET and the listing agree on bucket/key's latest
// version (latestAgrees), and returns the steps where they did not.
func disagreements(c *s3.Client, bucket, key string, do func()) []string {
	var mu sync.Mutex
	var bad []string
	f := func(op, _ string) error {
		if state, err := latestAgrees(c, bucket, key); err != nil {
			mu.Lock()
			bad = append(bad, fmt.Sprintf("at %s: %v (%s)", op, err, state))
			mu.Unlock()
		}
		return nil
	}
	fsFault.Store(&f)
	defer fsFault.Store(nil)
	do()
	return bad
}

// failAtStep makes the fault hook fail step op, as a crash there would
// stop the request (the hook is cleared when the test ends).
func failAtStep(t *testing.T, op string) {
	f := func(o, _ string) error {
		if o == op {
			return errors.New("injected crash at " + op)
		}
		return nil
	}
	fsFault.Store(&f)
	t.Cleanup(func() { fsFault.Store(nil) })
}

// TestDeleteMarkerUncoverCrash: DELETE ?versionId= of the latest delete
// marker of a key without a current object uncovers the newest version
// below it, which becomes the current object again. That takes two
// steps (restore the version to the key, remove the marker); readers
// between them, and the state a crash between them leaves, must have GET
// and ListObjectVersions agree on the latest version, and the same
// DELETE sent again must finish the job.
func TestDeleteMarkerUncoverCrash(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c, bk := e.alice, "vdelmark"
		mkBucket(t, c, bk)
		setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
		for _, key := range []string{"k", "d/k"} {
			v1 := *put(t, c, bk, key, "one").VersionId
			v2 := *put(t, c, bk, key, "two").VersionId
			m := aws.ToString(delVersion(t, c, bk, key, "").VersionId)
			if _, err := latestAgrees(c, bk, key); err != nil {
				t.Fatalf("%s after its delete: %v", key, err)
			}

			// What readers see between the DELETE's steps (the hook
			// runs while the DELETE holds the key's lock).
			if bad := disagreements(c, bk, key, func() { delVersion(t, c, bk, key, m) }); len(bad) > 0 {
				t.Fatalf("%s: while marker %s was deleted: %v", key, m, bad)
			}
			want := []string{key + "@" + v2 + "*", key + "@" + v1}
			if got := get(t, c, bk, key); got != "two" {
				t.Fatalf("%s after deleting marker %s: %q, want version %s", key, m, got, v2)
			}
			if got := versions(t, c, bk, key, 1000); !slices.Equal(got, want) {
				t.Fatalf("%s: versions %v, want %v", key, got, want)
			}

			// A crash between the steps, then the same DELETE again.
			m2 := aws.ToString(delVersion(t, c, bk, key, "").VersionId)
			failAtStep(t, "version uncovered")
			_, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bk, Key: &key, VersionId: &m2})
			fsFault.Store(nil)
			if err == nil {
				t.Fatalf("%s: DELETE of marker %s with a crash between its steps succeeded", key, m2)
			}
			if state, err := latestAgrees(c, bk, key); err != nil {
				t.Fatalf("%s after a crash while marker %s was deleted: %v (%s; versions %v)", key, m2, err, state,
					versions(t, c, bk, key, 1000))
			}
			delVersion(t, c, bk, key, m2)
			if got := get(t, c, bk, key); got != "two" {
				t.Fatalf("%s after the DELETE of marker %s was sent again: %q", key, m2, got)
			}
			if got := versions(t, c, bk, key, 1000); !slices.Equal(got, want) {
				t.Fatalf("%s after the DELETE of marker %s was sent again: versions %v, want %v", key, m2, got, want)
			}
			if _, err := getVersion(t, c, bk, key, m2); code(err) != "NoSuchVersion" {
				t.Fatalf("%s: deleted marker %s: %v", key, m2, err)
			}
		}
		verify(t, e, bk, VerifyOptions{Content: true})
		noTempLeft(t, e)
	})
}
