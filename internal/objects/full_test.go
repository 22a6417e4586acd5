package objects

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// storeFull tells a file system with no block left from one with room,
// which is how a setxattr's ENOSPC is told apart: a full store (507) or
// a record too large for the file system's xattr space (400).
func TestStoreFullTellsAFullFileSystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	defer exec.Command("umount", mnt).Run()
	f, err := os.Create(filepath.Join(mnt, "obj"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if storeFull(f) {
		t.Fatal("an empty file system reported full")
	}
	filler, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	for err == nil {
		_, err = filler.Write(make([]byte, 64<<10))
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling: %v", err)
	}
	if !storeFull(f) {
		t.Fatal("a full file system not reported full")
	}
}
