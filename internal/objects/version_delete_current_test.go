package objects

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestDeleteCurrentVersionAtomic: a DELETE with the version id of the
// current object makes the newest older version current. That is one
// change of the key's object, from the deleted version to the one it
// uncovers, and readers must see one or the other: never a moment (nor,
// after a crash, a state) with no object at the key while the listing
// calls an older version the latest.
func TestDeleteCurrentVersionAtomic(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		c := e.alice
		mkBucket(t, c, "vdelcur")
		setVersioning(t, c, "vdelcur", types.BucketVersioningStatusEnabled)
		for _, key := range []string{"k", "d/k"} {
			v1 := *put(t, c, "vdelcur", key, "one").VersionId
			v2 := *put(t, c, "vdelcur", key, "two").VersionId

			// What a reader gets at each step the DELETE makes durable
			// (the hooks run while the DELETE holds the key's lock; GETs
			// take no lock).
			var mu sync.Mutex
			var seen []string
			look := func(op string) {
				got, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("vdelcur"), Key: aws.String(key)})
				s := ""
				if err != nil {
					s = op + ": " + code(err)
				} else {
					var buf [16]byte
					n, _ := got.Body.Read(buf[:])
					got.Body.Close()
					s = string(buf[:n])
				}
				mu.Lock()
				seen = append(seen, s)
				mu.Unlock()
			}
			f := func(op, name string) error { look(op); return nil }
			fsFault.Store(&f)
			// And a reader running beside it.
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Go(func() {
				for !stop.Load() {
					look("concurrent")
				}
			})
			delVersion(t, c, "vdelcur", key, v2)
			stop.Store(true)
			wg.Wait()
			fsFault.Store(nil)
			for _, s := range seen {
				if s != "one" && s != "two" {
					t.Fatalf("%s: while version %s was deleted a reader got %q (want the old object or the new)", key, v2, s)
				}
			}
			if got := get(t, c, "vdelcur", key); got != "one" {
				t.Fatalf("%s: after deleting version %s: %q", key, v2, got)
			}
			if _, err := getVersion(t, c, "vdelcur", key, v2); code(err) != "NoSuchVersion" {
				t.Fatalf("%s: deleted version %s: %v", key, v2, err)
			}
			if got, want := versions(t, c, "vdelcur", key, 1000), []string{key + "@" + v1 + "*"}; len(got) != 1 || got[0] != want[0] {
				t.Fatalf("%s: versions %v, want %v", key, got, want)
			}
		}
		verify(t, e, "vdelcur", VerifyOptions{Content: true})
		noTempLeft(t, e)
	})
}
