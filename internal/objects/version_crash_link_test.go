package objects

import (
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestVersionKeptThenCrash: a versioned write first hard-links the
// current object to its version file (keepCurrent) and then renames the
// new object over the key. After a crash between the two, the current
// object also has a version file of its own id. The version must still be
// one: listed once, and a DELETE of it must delete it — not delete the
// current file and restore the same version from its stale link.
func TestVersionKeptThenCrash(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c := e.alice
		mkBucket(t, c, "vcrash")
		setVersioning(t, c, "vcrash", types.BucketVersioningStatusEnabled)
		v1 := *put(t, c, "vcrash", "k", "one").VersionId
		v2 := *put(t, c, "vcrash", "k", "two").VersionId
		r, err := e.be.openBucket("vcrash")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		// The crash: the write that would have replaced v2 kept it and
		// died before its rename.
		if _, err := e.be.keepCurrent(r, "vcrash", "k", false); err != nil {
			t.Fatal(err)
		}
		want := []string{"k@" + v2 + "*", "k@" + v1}
		if got := versions(t, c, "vcrash", "", 1000); !slices.Equal(got, want) {
			t.Fatalf("versions after the crash: %v, want %v", got, want)
		}
		delVersion(t, c, "vcrash", "k", v2)
		if got := get(t, c, "vcrash", "k"); got != "one" {
			t.Fatalf("after deleting version %s the key holds %q, want version %s", v2, got, v1)
		}
		if _, err := getVersion(t, c, "vcrash", "k", v2); code(err) != "NoSuchVersion" {
			t.Fatalf("deleted version %s: %v", v2, err)
		}
		if got, want := versions(t, c, "vcrash", "", 1000), []string{"k@" + v1 + "*"}; !slices.Equal(got, want) {
			t.Fatalf("versions: %v, want %v", got, want)
		}
		verify(t, e, "vcrash", VerifyOptions{})
	})
}
