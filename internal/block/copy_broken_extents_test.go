package block

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// brokenExtents answers every Extents with what the contract forbids
// for a range of bytes: nothing, or one extent of no bytes.
type brokenExtents struct {
	plain
	empty bool
}

func (b brokenExtents) Extents(off, n int64) ([]Extent, error) {
	if b.empty {
		return []Extent{{Length: 0}}, nil
	}
	return nil, nil
}

// TestCopyOutBrokenExtents: a copy over a device whose block status
// answers no extent, or an empty one, fails with an error naming the
// offset. It asked again at the same offset for ever.
func TestCopyOutBrokenExtents(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := OpenFile(src, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, empty := range []bool{false, true} {
		out, err := os.Create(filepath.Join(t.TempDir(), "out"))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := CopyOut(brokenExtents{plain{d}, empty}, out, 1<<20, nil)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("empty extent %v: copied with no error", empty)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("empty extent %v: CopyOut still running after 10 s", empty)
		}
		out.Close()
	}
}
