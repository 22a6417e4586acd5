package objects

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// crashPublish runs a write of data to bucket/key that dies (panics) as it
// is about to rename its file into place: in sidecar mode its record is
// then written and durable, the data still a temp file in Work/tmp, which
// the crash leaves there.
func crashPublish(t *testing.T, e *env, bucket, key, data string) {
	t.Helper()
	f, err := e.be.createTemp()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	m := &objectMeta{ETag: `"` + md5hex(data) + `"`}
	m.setStat(&st)
	r, err := e.be.openBucket(bucket)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	onStep(t, func(op, name string) {
		if op == "publish rename" && name == key {
			panic("crash")
		}
	})
	defer func() {
		stepHook.Store(nil)
		if recover() == nil {
			t.Fatal("the write's rename did not run")
		}
		f.Close() // the temp file stays, as after a crash
	}()
	_, _ = e.be.publish(r, bucket, key, f, m)
}

// TestSidecarCrashOrphan: in sidecar mode a write that dies between
// publishing its record and renaming its data into place leaves a record
// without its object — for a key that had no object, a record of nothing
// S3 ever acknowledged. Such a record must count for nothing: GET answers
// NoSuchKey, listings skip the key, verify reports no damage, and a file
// someone later puts at the key directly is a file that is not an object
// (invisible, KeyHoldsUnexportedFile to a PUT, exportable) — as without
// the record. The next start removes the record (or, over an object,
// puts the record it replaced back) and the temp file. Before, verify
// reported the record as an object whose file was deleted behind S3
// ("missing"), and a file put at the key was taken for that object changed
// behind S3: listed (MODIFIED_OUTSIDE_S3), GET 409, and replaced by a PUT
// though it was no object.
func TestSidecarCrashOrphan(t *testing.T) {
	e := newEnv(t, true)
	c := e.alice
	const bucket = "orph"
	mkBucket(t, c, bucket)
	put(t, c, bucket, "kept", "acknowledged")
	crashPublish(t, e, bucket, "new", "never acknowledged")
	crashPublish(t, e, bucket, "kept", "never acknowledged either")
	listed := func(want ...string) {
		t.Helper()
		if got := keys(t, c, bucket, "", 1000); !slices.Equal(got, want) {
			t.Fatalf("listed %q, want %q", got, want)
		}
	}

	_, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("new")})
	wantCode(t, err, "NoSuchKey")
	if got := get(t, c, bucket, "kept"); got != "acknowledged" {
		t.Fatalf("kept: %q", got)
	}
	listed("kept")
	verify(t, e, bucket, VerifyOptions{Content: true})

	// A file put at the key directly is no object.
	path := filepath.Join(e.root, bucket, "new")
	writeFile(t, path, "mine")
	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("new")})
	wantCode(t, err, "NoSuchKey")
	listed("kept")
	verify(t, e, bucket, VerifyOptions{All: true}, "new:unexported")
	_, err = c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("new"), Body: nil})
	wantCode(t, err, "KeyHoldsUnexportedFile")
	if data, err := os.ReadFile(path); err != nil || string(data) != "mine" {
		t.Fatalf("the file put at the key: %q, %v", data, err)
	}

	// The next start repairs the records and removes the temp files.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	again, err := New(Config{Root: e.root, Work: e.work, Buckets: e.buckets, Log: log, Sidecar: true})
	if err != nil {
		t.Fatal(err)
	}
	again.Shutdown()
	sc := e.be.meta.(*sidecarMeta)
	if _, err := os.Stat(sc.path(bucket, "new")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the record of the write that never finished is still there: %v", err)
	}
	noTempLeft(t, e)
	if got := get(t, c, bucket, "kept"); got != "acknowledged" {
		t.Fatalf("kept after the start: %q", got)
	}
	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("new")})
	wantCode(t, err, "NoSuchKey")
	listed("kept")
	verify(t, e, bucket, VerifyOptions{Content: true, All: true}, "new:unexported")
	if _, err := e.be.Export(ctx, bucket, "new"); err != nil {
		t.Fatalf("export the file put at the key: %v", err)
	}
	if got := get(t, c, bucket, "new"); got != "mine" {
		t.Fatalf("new after its export: %q", got)
	}
	verify(t, e, bucket, VerifyOptions{Content: true})
}
