package objects

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestDeleteCrashAfterKeep: a versioned DELETE that stops after linking
// the current object to its version file (keepCurrent) and before its
// marker is in place leaves that link, a second name of the current
// object under its own version id. The version must stay one: listed
// once, served once, and after a later PUT, DELETE, DELETE ?versionId=
// or export of the key no duplicate or lost version. The next request on
// the key removes the link (settleDeletes): before, it stayed until a
// write replaced the object, and export of the object answered
// HardLinkedFile (the link was the file's second name).
func TestDeleteCrashAfterKeep(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c, bk := e.alice, "vkeptcrash"
		mkBucket(t, c, bk)
		setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
		then := []string{"nothing", "put", "delete", "delete version", "export"}
		for i, next := range then {
			// Keys n<i> hold a current null version and no other.
			for _, key := range []string{fmt.Sprintf("k%d", i), fmt.Sprintf("d/k%d", i), fmt.Sprintf("n%d", i)} {
				if key[0] == 'n' && next == "delete version" {
					continue // no older version to uncover
				}
				var old, cur string // the older version ("": none) and the current one
				if key[0] == 'n' {
					setVersioning(t, c, bk, types.BucketVersioningStatusSuspended)
					put(t, c, bk, key, "null")
					setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
					cur = nullVersion
				} else {
					old = *put(t, c, bk, key, "one").VersionId
					cur = *put(t, c, bk, key, "two").VersionId
				}
				body, _ := getVersion(t, c, bk, key, cur)
				before := []string{key + "@" + cur + "*"}
				if old != "" {
					before = append(before, key+"@"+old)
				}
				crashDelete(t, c, bk, key, "delete version kept")
				if got := versionFiles(t, e, bk, key); !slices.Contains(got, versionPrefix+cur) {
					t.Fatalf("%s: the DELETE kept no link of version %s: %v", key, cur, got)
				}
				if got := versions(t, c, bk, key, 1000); !sameVersions(got, before) {
					t.Fatalf("%s: versions after the crash %v, want %v", key, got, before)
				}
				if state, err := latestAgrees(c, bk, key); err != nil {
					t.Fatalf("%s: after the crash: %v (%s)", key, err, state)
				}
				if got, err := getVersion(t, c, bk, key, cur); err != nil || got != body {
					t.Fatalf("%s: GET ?versionId=%s: %q %v", key, cur, got, err)
				}

				var want []string
				switch next {
				case "nothing":
					want = before
				case "put":
					v := *put(t, c, bk, key, "three").VersionId
					want = append([]string{key + "@" + v + "*"}, strings.TrimSuffix(before[0], "*"))
					want = append(want, before[1:]...)
				case "delete":
					m := aws.ToString(delVersion(t, c, bk, key, "").VersionId)
					want = append([]string{key + "@" + m + "!*"}, strings.TrimSuffix(before[0], "*"))
					want = append(want, before[1:]...)
				case "delete version":
					delVersion(t, c, bk, key, cur)
					want = []string{key + "@" + old + "*"}
					if got := get(t, c, bk, key); got != "one" {
						t.Fatalf("%s: after deleting version %s the key holds %q", key, cur, got)
					}
					if _, err := getVersion(t, c, bk, key, cur); code(err) != "NoSuchVersion" {
						t.Fatalf("%s: deleted version %s: %v", key, cur, err)
					}
				case "export":
					if _, err := e.be.Export(ctx, bk, key); err != nil {
						t.Fatalf("%s: export after a DELETE stopped once it had kept the object: %v", key, err)
					}
					want = before
					if got := versionFiles(t, e, bk, key); slices.Contains(got, versionPrefix+cur) {
						t.Fatalf("%s: the link of version %s is left after the export: %v", key, cur, got)
					}
				}
				if got := versions(t, c, bk, key, 1000); !sameVersions(got, want) {
					t.Fatalf("%s: versions after %s: %v, want %v", key, next, got, want)
				}
				if state, err := latestAgrees(c, bk, key); err != nil {
					t.Fatalf("%s: after %s: %v (%s)", key, next, err, state)
				}
				markersSettled(t, e, bk, key)
			}
		}
		verify(t, e, bk, VerifyOptions{Content: true})
		noTempLeft(t, e)
	})
}
