package objects

import (
	"io/fs"
	"log/slog"
	"testing"
	"testing/fstest"

	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3response"
)

// goneAfterReadDir is a bucket whose directory "a" is removed just after
// a listing has read it: ReadDir still sees its last file, anything
// later does not find it.
type goneAfterReadDir struct{ fstest.MapFS }

func (g goneAfterReadDir) Open(name string) (fs.File, error) {
	if name == "a" {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return g.MapFS.Open(name)
}

func (g goneAfterReadDir) Stat(name string) (fs.FileInfo, error) {
	if name == "a" {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
	}
	return g.MapFS.Stat(name)
}

// TestListPrefixDirRemoved: backend.Walk reads the directory of a prefix
// ("a" for "a/") and then stats it. A DELETE of the last object below it
// prunes the directory; if that fell between the two, the listing
// failed with an internal error (500) instead of listing nothing there.
func TestListPrefixDirRemoved(t *testing.T) {
	fsys := listFS{goneAfterReadDir{fstest.MapFS{"a/x": {Data: []byte("x")}}}, slog.New(slog.DiscardHandler)}
	get := func(p string, d fs.DirEntry) (s3response.Object, error) {
		return s3response.Object{}, backend.ErrSkipObj // a/x was deleted: nothing is an object
	}
	for _, delim := range []string{"", "/"} {
		res, err := backend.Walk(ctx, fsys, "a/", delim, "", 1000, get, []string{versionsDir})
		if err != nil {
			t.Fatalf("delimiter %q: %v", delim, err)
		}
		if len(res.Objects) != 0 || len(res.CommonPrefixes) != 0 || res.Truncated {
			t.Errorf("delimiter %q: %+v", delim, res)
		}
	}
}
