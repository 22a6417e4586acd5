package objects

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestListInvalidPrefixLogsNothing: a listing whose prefix names no
// directory a bucket can have ("a//", "a/./", "../x": the client's
// choice) lists nothing, as before, but logged a warning ("listing skips
// a directory") for every such request, so any client could flood the
// log. A directory that exists but cannot be read is still worth a
// warning; such a name is not.
func TestListInvalidPrefixLogsNothing(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	var logged bytes.Buffer
	l := listFS{root.FS(), slog.New(slog.NewTextHandler(&logged, nil))}
	for _, name := range []string{"a//", "a/./", "../x", "a/../a", "/a"} {
		ents, err := l.ReadDir(name)
		if err != nil || len(ents) != 0 {
			t.Errorf("ReadDir(%q): %v, %v; want nothing", name, ents, err)
		}
	}
	if logged.Len() > 0 {
		t.Errorf("invalid directory names logged:\n%s", logged.String())
	}
	if ents, err := l.ReadDir("a"); err != nil || len(ents) != 1 {
		t.Fatalf("ReadDir(a): %v, %v; want b", ents, err)
	}
}

// TestListingsOfInvalidPrefixesLogNothing: the same through the gateway,
// for object and version listings of prefixes under an existing
// directory ("a//b", "a/./b", "a/../a/b").
func TestListingsOfInvalidPrefixesLogNothing(t *testing.T) {
	e := newEnv(t, false)
	var logged bytes.Buffer
	e.be.log = slog.New(slog.NewTextHandler(&logged, nil))
	c := e.alice
	mkBucket(t, c, "quiet")
	setVersioning(t, c, "quiet", types.BucketVersioningStatusEnabled)
	put(t, c, "quiet", "a/b/c", "x")
	for _, prefix := range []string{"a//b", "a/./b", "a/../a/b", "a//", "../x"} {
		out, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("quiet"), Prefix: aws.String(prefix), Delimiter: aws.String("/")})
		if err != nil || len(out.Contents)+len(out.CommonPrefixes) != 0 {
			t.Errorf("list %q: %v; want nothing", prefix, err)
		}
		vs, err := c.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: aws.String("quiet"), Prefix: aws.String(prefix)})
		if err != nil || len(vs.Versions)+len(vs.DeleteMarkers)+len(vs.CommonPrefixes) != 0 {
			t.Errorf("list versions %q: %v; want nothing", prefix, err)
		}
	}
	if logged.Len() > 0 {
		t.Errorf("listings of invalid prefixes logged:\n%s", logged.String())
	}
}
