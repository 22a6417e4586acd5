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
		fsTrace = func(op, name string) {
			mu.Lock()
			if op == "sync parent" {
				op += " " + name
			}
			events = append(events, op)
			mu.Unlock()
		}
		t.Cleanup(func() { fsTrace = nil })
		mark := func(ev string) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		}
		mkBucket(t, e.alice, "dur")
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
			want := []string{"request", "sync file", "rename", "sync dir", "answered"}
			if key == "d/k" {
				want = []string{"request", "sync file", "sync parent d", "rename", "sync dir", "answered"}
			}
			if mode == "sidecar" {
				// The record's directory (Work/sidecar/<bucket>/<xx>) is
				// made durable before the rename publishes the object.
				shard := filepath.Base(filepath.Dir(e.be.meta.(*sidecarMeta).path("dur", key)))
				at := slices.Index(want, "rename")
				want = slices.Insert(want, at, "sync parent dur", "sync parent dur/"+shard)
			}
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
	fsTrace = func(op, name string) {
		mu.Lock()
		events = append(events, op+" "+name)
		mu.Unlock()
	}
	t.Cleanup(func() { fsTrace = nil })
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
