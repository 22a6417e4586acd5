package block

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A file removed while open takes later writes with it at Close: Flush and
// FUA writes must not call them durable.
func TestFileUnlinkedIsNotDurable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data.img")
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := OpenFile(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	buf := []byte("still here")
	if err := d.WriteAt(buf, 0, true); err != nil {
		t.Fatalf("FUA write while linked: %v", err)
	}
	if err := d.Flush(); err != nil {
		t.Fatalf("flush while linked: %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAt(buf, 4096, false); err != nil {
		t.Fatalf("plain write after unlink: %v", err)
	}
	if err := d.Flush(); !errors.Is(err, ErrUnlinked) {
		t.Fatalf("flush after unlink = %v, want ErrUnlinked", err)
	}
	if err := d.WriteAt(buf, 8192, true); !errors.Is(err, ErrUnlinked) {
		t.Fatalf("FUA write after unlink = %v, want ErrUnlinked", err)
	}
}
