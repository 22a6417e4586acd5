package objects

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// TestPutDurabilityOrder traces the file system steps of PUTs (new keys
// and overwrites, in both metadata modes) and checks that each PUT is
// answered only after its temp file was synced, then renamed into place,
// then its directory synced — in that order — and that the object it
// replaced is closed only after the rename (closing it frees the old
// inode, which must not happen under the rename's directory locks). The
// directory of a key ("d/k") has its parent synced before the rename on
// every PUT, also when it exists already: another PUT may have created
// it and not synced its parent yet.
func TestPutDurabilityOrder(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		var mu sync.Mutex
		var events []string
		traceWrites(t, func(op, name string) {
			mu.Lock()
			if op == "sync parent" {
				op += " " + name
			}
			events = append(events, op)
			mu.Unlock()
		})
		mark := func(ev string) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		}
		mkBucket(t, e.alice, "dur")
		// A directory is synced into its parent the first time this
		// process stores something below it; then it is known durable
		// (durableDirs) until it is removed.
		known := map[string]bool{}
		syncs := func(tree, dir string) []string {
			var out []string
			if known[tree+"/"+dir] {
				return nil
			}
			for i := 0; i <= len(dir); i++ {
				if i == len(dir) || dir[i] == '/' {
					out = append(out, "sync parent "+dir[:i])
					known[tree+"/"+dir[:i]] = true
				}
			}
			return out
		}
		for i, key := range []string{"k", "k", "d/k", "d/k"} { // new, overwrite, new in a directory, overwrite
			mu.Lock()
			events = nil
			mu.Unlock()
			mark("request")
			put(t, e.alice, "dur", key, strings.Repeat("x", 1000+i))
			mark("answered")
			e.be.closers.Wait() // a replaced object may still be closing
			mu.Lock()
			got := slices.Clone(events)
			mu.Unlock()
			want := []string{"request", "sync file"}
			if key == "d/k" {
				want = append(want, syncs("", "d")...)
			}
			if mode == "sidecar" {
				// The record's directory (Work/sidecar/<bucket>/<xx>) is
				// made durable before the rename publishes the object.
				shard := filepath.Base(filepath.Dir(e.be.meta.(*sidecarMeta).path("dur", key)))
				want = append(want, syncs("sidecar:", "dur/"+shard)...)
			}
			want = append(want, "rename", "sync dir", "answered")
			if i%2 == 1 {
				// The replaced object is released after the rename: before or after the answer.
				at := slices.Index(got, "release")
				if at < slices.Index(got, "rename") || slices.Index(got, "rename") < 0 {
					t.Errorf("%s PUT %d (%s): replaced object released at %d: %v", mode, i, key, at, got)
				}
				if at >= 0 {
					got = slices.Delete(got, at, at+1)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s PUT %d (%s): steps %v, want %v", mode, i, key, got, want)
			}
		}
	})
}

// TestReplacedObjectsClosed: after overwrites, no descriptor of this
// process still holds a replaced (deleted) object file once the
// backend's background closes are done.
func TestReplacedObjectsClosed(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "rel")
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 20 {
				body := strings.Repeat("y", 100*(i+1)+w)
				if _, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("rel"), Key: aws.String("k"),
					Body: strings.NewReader(body)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	e.be.closers.Wait()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	for _, ent := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", ent.Name()))
		if err == nil && strings.HasPrefix(target, e.root) && strings.HasSuffix(target, "(deleted)") {
			t.Errorf("fd %s still holds a replaced object: %s", ent.Name(), target)
		}
	}
	noTempLeft(t, e)
}

// TestUploadDirDurable: CreateMultipartUpload answers only after the new
// upload directory Work/uploads/<bucket>/<id> (and the bucket's directory
// there) has its parent synced: its info.json is the upload's existence.
func TestUploadDirDurable(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "mpu")
	var mu sync.Mutex
	var events []string
	traceWrites(t, func(op, name string) {
		mu.Lock()
		events = append(events, op+" "+name)
		mu.Unlock()
	})
	up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("mpu"), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := slices.Clone(events)
	mu.Unlock()
	want := []string{"sync parent mpu", "sync parent mpu/" + aws.ToString(up.UploadId)}
	if !slices.Equal(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
}

// TestRemovedDirSyncedAgain: a directory this process knows durable is
// synced into its parent again once it was removed — by a DELETE that
// pruned it, or behind the gateway's back — and recreated by a PUT.
func TestRemovedDirSyncedAgain(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		var mu sync.Mutex
		var synced []string
		traceWrites(t, func(op, name string) {
			if op == "sync parent" && name == "dir1" { // the key's directory (not a sidecar shard's)
				mu.Lock()
				synced = append(synced, name)
				mu.Unlock()
			}
		})
		putSyncs := func(key string) []string {
			mu.Lock()
			synced = nil
			mu.Unlock()
			put(t, e.alice, "again", key, "x")
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(synced)
		}
		mkBucket(t, e.alice, "again")
		if got := putSyncs("dir1/k"); !slices.Equal(got, []string{"dir1"}) {
			t.Fatalf("%s: first PUT into dir1 synced %v, want [dir1]", mode, got)
		}
		if got := putSyncs("dir1/k"); len(got) != 0 {
			t.Errorf("%s: second PUT into dir1 synced %v, want nothing", mode, got)
		}
		deleteAll(t, e.alice, "again", "dir1/k") // prunes dir1
		if got := putSyncs("dir1/k"); !slices.Equal(got, []string{"dir1"}) {
			t.Errorf("%s: PUT after a DELETE pruned dir1 synced %v, want [dir1]", mode, got)
		}
		// Removed behind the gateway's back.
		dir := filepath.Join(e.be.bucketDir("again"), "dir1")
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if got := putSyncs("dir1/k"); !slices.Equal(got, []string{"dir1"}) {
			t.Errorf("%s: PUT after dir1 was removed directly synced %v, want [dir1]", mode, got)
		}
	})
}

// traceWrites makes f the trace of the durable-write steps (fsTrace) for
// the rest of the test.
func traceWrites(t *testing.T, f func(op, name string)) {
	fsTrace.Store(&f)
	t.Cleanup(func() { fsTrace.Store(nil) })
}
