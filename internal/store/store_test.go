package store

import (
	"os"
	"path/filepath"
	"testing"
)

func TestOpenLayout(t *testing.T) {
	root := filepath.Join(t.TempDir(), "nested", "store")
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(s.Root) {
		t.Fatalf("Root %q is not absolute", s.Root)
	}
	for _, d := range []string{"volumes", "images", "tmp"} {
		st, err := os.Stat(filepath.Join(root, d))
		if err != nil || !st.IsDir() {
			t.Fatalf("%s: %v", d, err)
		}
	}
	// Opening again is fine and keeps content.
	if err := os.MkdirAll(s.VolumeDir("vol-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.VolumeDir("vol-1")); err != nil {
		t.Fatal("reopening lost data")
	}
	if got, want := s.VolumeDir("vol-1"), filepath.Join(s.Root, "volumes", "vol-1"); got != want {
		t.Errorf("VolumeDir = %s, want %s", got, want)
	}
	if got, want := s.ImagesDir(), filepath.Join(s.Root, "images"); got != want {
		t.Errorf("ImagesDir = %s, want %s", got, want)
	}
	// A file where the root should be: Open fails.
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := Open(file); err == nil {
		t.Fatal("Open over a regular file succeeded")
	}
}

func TestRemoveVolumeCheckCapacity(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := s.VolumeDir("vol-x")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "cow.sb"), []byte("x"), 0o600)
	if err := s.RemoveVolume("vol-x"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatal("volume directory still exists")
	}
	if err := s.RemoveVolume("vol-x"); err != nil {
		t.Fatalf("removing a missing volume (a retried delete): %v", err)
	}
	if err := s.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.Root, "tmp", ".health")); !os.IsNotExist(err) {
		t.Fatal("Check left its probe file")
	}
	c, err := s.Capacity()
	if err != nil {
		t.Fatal(err)
	}
	if c.TotalBytes <= 0 || c.FreeBytes < 0 || c.FreeBytes > c.TotalBytes {
		t.Fatalf("capacity %+v", c)
	}
	gone := &Store{Root: filepath.Join(t.TempDir(), "gone")}
	if err := gone.Check(); err == nil {
		t.Fatal("Check of a missing root succeeded")
	}
	if _, err := gone.Capacity(); err == nil {
		t.Fatal("Capacity of a missing root succeeded")
	}
}
