package objects

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// deleteSteps are the fault points of a versioned DELETE without a
// version id, in no particular order: the marker made (with its note),
// the current object unlinked ("delete sync dir"), the DELETE finished
// but for its note.
var deleteSteps = []string{"delete sync dir", "delete marker made", "delete finish note"}

// markersSettled fails if a delete marker of key still holds a note or a
// marker written aside is left.
func markersSettled(t *testing.T, e *env, bucket, key string) {
	t.Helper()
	dir := filepath.Join(e.root, bucket, versionsDir, key)
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, d := range ents {
		name := d.Name()
		if name == pendingMarker {
			t.Fatalf("%s: a marker written aside is left", key)
		}
		if !strings.HasSuffix(name, markerSuffix) {
			continue
		}
		fi, err := d.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != 0 {
			b, _ := os.ReadFile(filepath.Join(dir, name))
			t.Fatalf("%s: delete marker %s still holds a note %q", key, name, b)
		}
	}
}

// sameVersions compares two results of versions as sets: that helper
// orders a key's entries by id, "null" first.
func sameVersions(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestDeleteMarkerCrash: a versioned DELETE without a version id keeps
// the current object as a version, removes it from the key and makes a
// delete marker the latest version. Readers between those steps, and the
// state a crash at any of them leaves, must have GET and the listing
// agree; and the DELETE must have either had no effect (the listing
// unchanged) or taken effect (the marker the latest version), what is
// left of it settled by the next request on the key. Both with
// versioning Enabled and Suspended (the null version replaced by the
// null marker).
func TestDeleteMarkerCrash(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c := e.alice
		for _, status := range []types.BucketVersioningStatus{types.BucketVersioningStatusEnabled, types.BucketVersioningStatusSuspended} {
			bk := "vdelnokey-" + strings.ToLower(string(status))
			mkBucket(t, c, bk)
			for _, key := range []string{"k", "d/k"} {
				// Enabled: versions v1, v2 (current). Suspended: a
				// non-current null version and v1 (current), which a
				// DELETE keeps while the null marker replaces the null
				// version.
				setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
				var before []string
				var body string
				if status == types.BucketVersioningStatusEnabled {
					v1 := *put(t, c, bk, key, "one").VersionId
					v2 := *put(t, c, bk, key, "two").VersionId
					before, body = []string{key + "@" + v2 + "*", key + "@" + v1}, "two"
				} else {
					setVersioning(t, c, bk, types.BucketVersioningStatusSuspended)
					put(t, c, bk, key, "null")
					setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
					v1 := *put(t, c, bk, key, "one").VersionId
					setVersioning(t, c, bk, status)
					before, body = []string{key + "@" + v1 + "*", key + "@null"}, "one"
				}
				if got := versions(t, c, bk, key, 1000); !sameVersions(got, before) {
					t.Fatalf("%s %s: versions %v, want %v", status, key, got, before)
				}
				// after is the listing once DELETEs made the markers ms
				// (newest first) on top of before.
				after := func(ms ...string) []string {
					var out []string
					for i, m := range ms {
						s := key + "@" + m + "!"
						if i == 0 {
							s += "*"
						}
						out = append(out, s)
					}
					if status == types.BucketVersioningStatusSuspended {
						// The null marker replaced the null version.
						return append(out, strings.TrimSuffix(before[0], "*"))
					}
					return append(out, strings.TrimSuffix(before[0], "*"), before[1])
				}
				// undelete removes the markers ms, making before current again.
				undelete := func(ms ...string) {
					t.Helper()
					for _, m := range ms {
						delVersion(t, c, bk, key, m)
					}
					if status == types.BucketVersioningStatusSuspended {
						// The null version is gone: put one back.
						setVersioning(t, c, bk, types.BucketVersioningStatusSuspended)
						cur := strings.TrimSuffix(strings.TrimPrefix(before[0], key+"@"), "*")
						out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bk, Key: &key, VersionId: &cur})
						if err != nil {
							t.Fatal(err)
						}
						out.Body.Close()
						// Deleting the current version uncovers nothing
						// newer; write the null version, then the current
						// one again on top of it.
						delVersion(t, c, bk, key, cur)
						put(t, c, bk, key, "null")
						setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
						before[0] = key + "@" + *put(t, c, bk, key, "one").VersionId + "*"
						setVersioning(t, c, bk, status)
					}
					if got := versions(t, c, bk, key, 1000); !sameVersions(got, before) {
						t.Fatalf("%s %s: versions %v after undeleting, want %v", status, key, got, before)
					}
				}

				// Readers between the steps of a DELETE that completes.
				var m string
				if bad := disagreements(c, bk, key, func() { m = aws.ToString(delVersion(t, c, bk, key, "").VersionId) }); len(bad) > 0 {
					t.Fatalf("%s %s: while the DELETE ran: %v", status, key, bad)
				}
				if got, want := versions(t, c, bk, key, 1000), after(m); !sameVersions(got, want) {
					t.Fatalf("%s %s: versions %v after the DELETE, want %v", status, key, got, want)
				}
				markersSettled(t, e, bk, key)
				undelete(m)

				// A crash at each step, then the DELETE again.
				for _, step := range deleteSteps {
					failAtStep(t, step)
					_, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bk, Key: &key})
					fsFault.Store(nil)
					if err == nil {
						t.Fatalf("%s %s: the DELETE did not reach step %q", status, key, step)
					}
					state, err := latestAgrees(c, bk, key)
					if err != nil {
						t.Fatalf("%s %s: after a crash at %q: %v (%s; versions %v)", status, key, step, err, state,
							versions(t, c, bk, key, 1000))
					}
					got := versions(t, c, bk, key, 1000)
					var crashed []string // the crashed DELETE's marker, if it took effect
					switch {
					case sameVersions(got, before):
						if g := get(t, c, bk, key); g != body {
							t.Fatalf("%s %s: after a crash at %q (no effect) GET answers %q", status, key, step, g)
						}
					case slices.ContainsFunc(got, func(s string) bool { return strings.HasSuffix(s, "!*") }):
						top := got[slices.IndexFunc(got, func(s string) bool { return strings.HasSuffix(s, "!*") })]
						crashed = []string{strings.TrimSuffix(strings.TrimPrefix(top, key+"@"), "!*")}
					default:
						t.Fatalf("%s %s: after a crash at %q the versions are %v: neither before %v nor a marker on top",
							status, key, step, got, before)
					}
					m := aws.ToString(delVersion(t, c, bk, key, "").VersionId)
					ms := append([]string{m}, crashed...)
					if status == types.BucketVersioningStatusSuspended {
						ms = []string{m} // one null marker, replaced
					}
					if got, want := versions(t, c, bk, key, 1000), after(ms...); !sameVersions(got, want) {
						t.Fatalf("%s %s: after a crash at %q and the DELETE again: versions %v, want %v", status, key, step, got, want)
					}
					markersSettled(t, e, bk, key)
					undelete(ms...)
				}
			}
			verify(t, e, bk, VerifyOptions{Content: true})
		}
		noTempLeft(t, e)
	})
}

// TestDeleteMarkerCrashThenPut: a DELETE that stopped before it removed
// the current object had no effect, also for the next write of the key:
// its marker does not stay behind as an older version.
func TestDeleteMarkerCrashThenPut(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c, bk := e.alice, "vdelput"
		mkBucket(t, c, bk)
		setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
		v1 := *put(t, c, bk, "k", "one").VersionId
		failAtStep(t, "delete marker made")
		_, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bk, Key: aws.String("k")})
		fsFault.Store(nil)
		if err == nil {
			t.Fatal("the DELETE did not reach its marker")
		}
		if got, want := versions(t, c, bk, "k", 1000), []string{"k@" + v1 + "*"}; !sameVersions(got, want) {
			t.Fatalf("versions after the crash: %v, want %v", got, want)
		}
		v2 := *put(t, c, bk, "k", "two").VersionId
		if got, want := versions(t, c, bk, "k", 1000), []string{"k@" + v2 + "*", "k@" + v1}; !sameVersions(got, want) {
			t.Fatalf("versions after the next PUT: %v, want %v", got, want)
		}
		markersSettled(t, e, bk, "k")
		verify(t, e, bk, VerifyOptions{Content: true})
	})
}
