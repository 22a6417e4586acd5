package store

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestClaim: a store without a marker is claimed once; a second claim,
// even concurrent, gets the first one's id; ReadMarker reads it back, says
// "none" for a directory without one (or none at all), and refuses a
// marker that is not one.
func TestClaim(t *testing.T) {
	root := filepath.Join(t.TempDir(), "nested", "store")
	if _, ok, err := ReadMarker(root); ok || err != nil {
		t.Fatalf("ReadMarker of a missing root: ok %v, %v", ok, err)
	}
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Go(func() {
			m, err := Claim(root, Marker{ID: strings.Repeat(string(rune('a'+i)), 4), Cluster: "c1"})
			if err != nil {
				t.Error(err)
			}
			ids[i] = m.ID
		})
	}
	wg.Wait()
	for _, id := range ids[1:] {
		if id != ids[0] {
			t.Fatalf("concurrent claims got ids %v: want one", ids)
		}
	}
	if m, ok, err := ReadMarker(root); err != nil || !ok || m.ID != ids[0] || m.Cluster != "c1" {
		t.Fatalf("ReadMarker: %+v %v %v, want %q of c1", m, ok, err, ids[0])
	}
	if again, err := Claim(root, Marker{ID: "other", Cluster: "c2"}); err != nil || again.ID != ids[0] || again.Cluster != "c1" {
		t.Fatalf("a claim of a claimed store: %+v, %v", again, err)
	}
	if left, _ := filepath.Glob(filepath.Join(root, MarkerFile+".*")); len(left) != 0 {
		t.Errorf("claims left %v behind", left)
	}
	if err := os.WriteFile(filepath.Join(root, MarkerFile), []byte("not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadMarker(root); err == nil {
		t.Fatal("a marker that is not one was read")
	}
}

// TestCheckFindsMarkerGone: a store whose marker vanished (its file system
// unmounted under the node: the mount point is left) or names another
// store is not healthy.
func TestCheckFindsMarkerGone(t *testing.T) {
	root := t.TempDir()
	m, err := Claim(root, Marker{ID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	s.ID = m.ID
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(root, MarkerFile))
	if err := s.Check(); err == nil || !strings.Contains(err.Error(), "mounted") {
		t.Fatalf("check without the marker: %v", err)
	}
	if _, err := Claim(root, Marker{ID: "s2"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(); err == nil || !strings.Contains(err.Error(), "s2") {
		t.Fatalf("check with another store's marker: %v", err)
	}
}
