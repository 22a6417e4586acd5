package store

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRemoveVolumeOnlyItsOwn: RemoveVolume removes one volume's stack
// directory and nothing else, whatever the id: an empty id (a record
// read wrongly) or one that is not a single path element must not take
// every volume, the images or the whole store with it.
func TestRemoveVolumeOnlyItsOwn(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	keep := []string{
		filepath.Join(s.VolumeDir("vol-a"), "cow.sb"),
		filepath.Join(s.ImagesDir(), "img-a", "image.sb"),
		filepath.Join(s.Root, "keep"),
	}
	for _, f := range keep {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"", ".", "..", "../images", "../images/img-a", "vol-a/..", "/", "a/b", "..\x00"} {
		if err := s.RemoveVolume(id); err == nil {
			t.Errorf("RemoveVolume(%q) succeeded", id)
		}
		for _, f := range keep {
			if _, err := os.Stat(f); err != nil {
				t.Fatalf("RemoveVolume(%q) removed %s: %v", id, f, err)
			}
		}
	}
}
