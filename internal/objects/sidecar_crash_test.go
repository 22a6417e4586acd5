package objects

import (
	"os"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// crashCommit leaves bucket/key's sidecar as a write that died between
// its two steps leaves it: the new record (of a temp file holding data)
// durable, the data never renamed into place. The rename "crashes" by
// panicking, so commit neither renames nor puts the old record back.
func crashCommit(t *testing.T, e *env, bucket, key, data string) {
	t.Helper()
	f, err := os.CreateTemp(e.be.tmp, "obj-*")
	if err != nil {
		t.Fatal(err)
	}
	defer discard(f)
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	m := &objectMeta{ETag: `"` + md5hex(data) + `"`}
	m.setStat(&st)
	defer func() {
		if recover() == nil {
			t.Fatal("the commit's rename did not run")
		}
	}()
	_ = e.be.meta.commit(bucket, key, m, func() error { panic("crash") })
}

// TestSidecarCrashBeforeRename: in sidecar mode a write publishes its
// record first and then renames the data into place. A crash (or power
// loss) between the two must leave the previous object as it was —
// served, listed, not reported — and not turn it into one "modified
// outside S3": the write that died was never acknowledged, the object it
// would have replaced was.
func TestSidecarCrashBeforeRename(t *testing.T) {
	e := newEnv(t, true)
	c := e.alice
	mkBucket(t, c, "crash")
	put(t, c, "crash", "k", "acknowledged")
	crashCommit(t, e, "crash", "k", "never acknowledged")
	if got := get(t, c, "crash", "k"); got != "acknowledged" {
		t.Fatalf("get after the crash: %q", got)
	}
	verify(t, e, "crash", VerifyOptions{Content: true})

	// A versioned bucket keeps the object as a version at the next
	// write: it must stay a valid version, not one flagged modified.
	mkBucket(t, c, "crashv")
	setVersioning(t, c, "crashv", types.BucketVersioningStatusEnabled)
	v1 := *put(t, c, "crashv", "k", "one").VersionId
	crashCommit(t, e, "crashv", "k", "never acknowledged")
	put(t, c, "crashv", "k", "two")
	if got, err := getVersion(t, c, "crashv", "k", v1); err != nil || got != "one" {
		t.Fatalf("version %s after the crash: %q, %v", v1, got, err)
	}
	if got := get(t, c, "crashv", "k"); got != "two" {
		t.Fatalf("get: %q", got)
	}
	verify(t, e, "crashv", VerifyOptions{Content: true})
}
