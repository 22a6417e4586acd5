package objects

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
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
