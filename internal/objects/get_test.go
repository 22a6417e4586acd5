package objects

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// quickOpen serves only the plain case and leaves every other one to the
// general path, whose answers the S3 tests check; here: which cases it
// takes, and that GETs answer the same either way.
func TestQuickOpen(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "quick")
	put(t, e.alice, "quick", "dir/obj", "contents")
	put(t, e.alice, "quick", "touched", "contents")
	dir := filepath.Join(e.root, "quick")
	must(t, os.Symlink("dir/obj", filepath.Join(dir, "alias")))
	must(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	later := time.Now().Add(time.Hour)
	must(t, os.Chtimes(filepath.Join(dir, "touched"), later, later))

	for key, want := range map[string]bool{
		"dir/obj": true,
		"alias":   false, // a link inside the bucket: os.Root follows it
		"fifo":    false, // not a regular file (and the open must not block)
		"touched": false, // changed behind S3
		"missing": false,
	} {
		o, ok := e.be.quickOpen("quick", key)
		if ok != want {
			t.Errorf("%s: quickOpen took it %v, want %v", key, ok, want)
		}
		if ok {
			if o.m.Size != int64(len("contents")) {
				t.Errorf("%s: record size %d", key, o.m.Size)
			}
			o.f.Close()
		}
	}
	if _, ok := e.be.quickOpen("nope", "dir/obj"); ok {
		t.Error("quickOpen opened a key of a missing bucket")
	}
	if _, ok := e.be.quickOpen("..", "quick/dir/obj"); ok {
		t.Error("quickOpen took an invalid bucket name")
	}

	// The general path answers for the link; without openat2 it answers
	// for everything.
	check := func() {
		for _, key := range []string{"dir/obj", "alias"} {
			if got := get(t, e.alice, "quick", key); got != "contents" {
				t.Errorf("GET %s: %q", key, got)
			}
		}
	}
	check()
	e.be.noOpenat2.Store(true)
	if _, ok := e.be.quickOpen("quick", "dir/obj"); ok {
		t.Error("quickOpen ran with openat2 switched off")
	}
	check()

	// Sidecar records are the general path's alone.
	s := newEnv(t, true)
	mkBucket(t, s.alice, "side")
	put(t, s.alice, "side", "obj", "x")
	if _, ok := s.be.quickOpen("side", "obj"); ok {
		t.Error("quickOpen read a sidecar record")
	}
}
