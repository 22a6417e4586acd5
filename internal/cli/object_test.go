package cli

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/errs"
)

func TestParseS3URI(t *testing.T) {
	for uri, want := range map[string][2]string{
		"s3://b/k":        {"b", "k"},
		"s3://b/a/b/c":    {"b", "a/b/c"},
		"s3://b/a//b":     {"b", "a//b"}, // the server judges keys
		"s3://bucket/k/":  {"bucket", "k/"},
		"s3://b/ spaced ": {"b", " spaced "},
	} {
		b, k, err := parseS3URI(uri)
		if err != nil || b != want[0] || k != want[1] {
			t.Errorf("%s: %q %q %v", uri, b, k, err)
		}
	}
	for _, uri := range []string{"", "b/k", "s3://", "s3://b", "s3://b/", "s3:///k", "S3://b/k", "http://b/k"} {
		if _, _, err := parseS3URI(uri); !errs.IsCode(err, CodeInvalidURI) {
			t.Errorf("%q: %v, want %s", uri, err, CodeInvalidURI)
		}
	}
}

func TestMapPaths(t *testing.T) {
	top := t.TempDir()
	root := filepath.Join(top, "buckets")
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk(filepath.Join(root, "b1", "a.txt"))
	mk(filepath.Join(root, "b1", "d", "e.txt"))
	mk(filepath.Join(root, "b1", "d", ".basalt-x"))
	mk(filepath.Join(root, "b2", "f"))
	mk(filepath.Join(top, "outside"))
	// The store reached through a symbolic link, a link into a bucket
	// from elsewhere, a link out of a bucket, a link in a bucket to
	// another of its files.
	if err := os.Symlink(root, filepath.Join(top, "via")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "b2", "f"), filepath.Join(top, "to-f")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(top, "outside"), filepath.Join(root, "b1", "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "b1", "a.txt"), filepath.Join(root, "b1", "d", "to-a")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Join(root, "b1", "d"))

	ok := func(viaRoot string, recursive bool, paths []string, want ...api.ObjectRef) {
		t.Helper()
		got, err := mapPaths(nil, viaRoot, paths, recursive, false)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%v (root %s, recursive %v): %v %v, want %v", paths, viaRoot, recursive, got, err, want)
		}
	}
	ok(root, false, []string{"e.txt", "../a.txt", filepath.Join(top, "to-f")},
		api.ObjectRef{Bucket: "b1", Key: "d/e.txt"}, api.ObjectRef{Bucket: "b1", Key: "a.txt"}, api.ObjectRef{Bucket: "b2", Key: "f"})
	ok(filepath.Join(top, "via"), false, []string{filepath.Join(top, "via", "b2", "f")}, api.ObjectRef{Bucket: "b2", Key: "f"})
	// A file that does not exist (any more) maps too: the server says NoSuchFile.
	ok(root, false, []string{"gone.txt", "../new/dir/x"},
		api.ObjectRef{Bucket: "b1", Key: "d/gone.txt"}, api.ObjectRef{Bucket: "b1", Key: "new/dir/x"})
	ok(root, true, []string{filepath.Join(root, "b1")},
		api.ObjectRef{Bucket: "b1", Key: "a.txt"}, api.ObjectRef{Bucket: "b1", Key: "d/e.txt"})
	ok(root, true, []string{"."}, api.ObjectRef{Bucket: "b1", Key: "d/e.txt"})
	ok(root, false, []string{"to-a"}, api.ObjectRef{Bucket: "b1", Key: "a.txt"})
	// For unexport a link in a bucket is its own key, wherever it points
	// (the record of the file it replaced is found by that name); a link
	// from elsewhere still stands for its target.
	own := func(viaRoot string, paths []string, want ...api.ObjectRef) {
		t.Helper()
		got, err := mapPaths(nil, viaRoot, paths, false, true)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%v (root %s, own links): %v %v, want %v", paths, viaRoot, got, err, want)
		}
	}
	own(root, []string{"to-a", filepath.Join(root, "b1", "out"), filepath.Join(top, "to-f"), "e.txt"},
		api.ObjectRef{Bucket: "b1", Key: "d/to-a"}, api.ObjectRef{Bucket: "b1", Key: "out"},
		api.ObjectRef{Bucket: "b2", Key: "f"}, api.ObjectRef{Bucket: "b1", Key: "d/e.txt"})
	own(filepath.Join(top, "via"), []string{filepath.Join(top, "via", "b1", "d", "to-a")}, api.ObjectRef{Bucket: "b1", Key: "d/to-a"})
	got, err := mapPaths(nil, root, []string{"."}, true, true)
	if want := []api.ObjectRef{{Bucket: "b1", Key: "d/e.txt"}, {Bucket: "b1", Key: "d/to-a"}}; err != nil || !slices.Equal(got, want) {
		t.Errorf("recursive, own links: %v %v, want %v", got, err, want)
	}

	for _, c := range []struct {
		root      string
		recursive bool
		paths     []string
		code      string
	}{
		{root, false, []string{filepath.Join(top, "outside")}, CodePathOutsideBuckets},
		{root, false, []string{filepath.Join(root, "b1", "out")}, CodePathOutsideBuckets},
		{root, false, []string{"e.txt", filepath.Join(top, "outside")}, CodePathOutsideBuckets},
		{root, false, []string{"../../../outside"}, CodePathOutsideBuckets},
		{root, false, []string{filepath.Join(root, "b1")}, CodePathOutsideBuckets},
		{root, true, []string{root}, CodePathOutsideBuckets},
		{root, false, []string{root}, CodePathOutsideBuckets},
		{root, true, []string{top}, CodePathOutsideBuckets},
		{filepath.Join(top, "no-such-dir"), false, []string{"e.txt"}, CodeBucketsDirNotFound},
	} {
		if _, err := mapPaths(nil, c.root, c.paths, c.recursive, false); !errs.IsCode(err, c.code) {
			t.Errorf("%v (recursive %v): %v, want %s", c.paths, c.recursive, err, c.code)
		}
	}
}
