package e2e

import (
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// writeTree writes a few directories of files with random contents under
// root and returns path (relative) → sha256.
func writeTree(t *testing.T, root string) map[string]string {
	t.Helper()
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	sums := map[string]string{}
	dirs := []string{"", "etc", "home/alice", "home/alice/docs", "var/lib/data"}
	for i := 0; i < 24; i++ {
		d := dirs[i%len(dirs)]
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
		var size int
		switch i % 4 {
		case 0:
			size = rng.IntN(100) // tiny, possibly empty
		case 1:
			size = 4096 * (1 + rng.IntN(8))
		case 2:
			size = rng.IntN(300 * 1024)
		default:
			size = 1<<20 + rng.IntN(1<<20)
		}
		data := randomBytes(t, size)
		rel := filepath.Join(d, fmt.Sprintf("file-%02d.bin", i))
		if err := os.WriteFile(filepath.Join(root, rel), data, 0o644); err != nil {
			t.Fatalf("write %s: %v", rel, err)
		}
		sums[rel] = sum(data)
	}
	// An empty directory and a symlink, for good measure.
	if err := os.MkdirAll(filepath.Join(root, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("etc/file-01.bin", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	return sums
}

// readTree returns path (relative) → sha256 of every regular file under root.
func readTree(t *testing.T, root string) map[string]string {
	t.Helper()
	sums := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			sums[rel] = sum(b)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read tree %s: %v", root, err)
	}
	return sums
}

func compareTrees(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	var missing, wrong, extra []string
	for p, s := range want {
		switch g, ok := got[p]; {
		case !ok:
			missing = append(missing, p)
		case g != s:
			wrong = append(wrong, p)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok && p != "lost+found" {
			extra = append(extra, p)
		}
	}
	sort.Strings(missing)
	sort.Strings(wrong)
	sort.Strings(extra)
	if len(missing)+len(wrong)+len(extra) > 0 {
		t.Errorf("%s: %d files missing %v, %d with other contents %v, %d unexpected %v",
			what, len(missing), missing, len(wrong), wrong, len(extra), extra)
	}
}

// TestNBDFuseFilesystem: nbdfuse + mkfs.ext4 + fuse2fs on a rw attachment,
// write a tree of files, unmount, detach; attach read-only to two hosts, mount
// both and read every file back from both.
func TestNBDFuseFilesystem(t *testing.T) {
	t.Parallel()
	requireTools(t, "nbdfuse", "fuse2fs", "mkfs.ext4", "fusermount3")
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Fatalf("/dev/fuse: %v (FUSE is needed)", err)
	}
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	admin.CreateVolume("--size", "128MiB", "--name", "fs")
	// Short paths: mount points live under a fresh temp dir.
	dir := t.TempDir()

	rw := admin.Attach("fs", "builder", "rw")
	nbdRW := nbdfuseMount(t, filepath.Join(dir, "nbd-rw"), rw.NBDURI, false)
	img := filepath.Join(nbdRW.Dir, "nbd")
	if st, err := os.Stat(img); err != nil || st.Size() != 128*MiB {
		t.Fatalf("nbdfuse file %s: %v %v, want 128 MiB", img, st, err)
	}
	toolOK(t, 2*time.Minute, "mkfs.ext4", "-q", "-F", img)
	fsRW := fuse2fsMount(t, img, filepath.Join(dir, "fs-rw"), false)
	want := writeTree(t, fsRW.Dir)
	compareTrees(t, "the tree read back on the rw mount", readTree(t, fsRW.Dir), want)
	fsRW.Unmount()
	nbdRW.Unmount()
	admin.Detach(rw.ID)

	// Two read-only hosts at once.
	roA := admin.Attach("fs", "host-a", "ro")
	roB := admin.Attach("fs", "host-b", "ro")
	var trees []*fuseMount
	for _, a := range []Attachment{roA, roB} {
		nm := nbdfuseMount(t, filepath.Join(dir, "nbd-"+a.Host), a.NBDURI, true)
		trees = append(trees, fuse2fsMount(t, filepath.Join(nm.Dir, "nbd"), filepath.Join(dir, "fs-"+a.Host), true))
	}
	for i, m := range trees {
		host := []string{"host-a", "host-b"}[i]
		compareTrees(t, "the tree read back on "+host, readTree(t, m.Dir), want)
		if target, err := os.Readlink(filepath.Join(m.Dir, "link")); err != nil || target != "etc/file-01.bin" {
			t.Errorf("%s: symlink reads %q, %v", host, target, err)
		}
		if err := os.WriteFile(filepath.Join(m.Dir, "new"), []byte("x"), 0o644); err == nil {
			t.Errorf("%s: writing a file on the read-only mount succeeded", host)
		}
	}
	// Reading through host A again while host B is mounted too.
	compareTrees(t, "the tree read again on host-a", readTree(t, trees[0].Dir), want)
	// Writing to the ro nbdfuse file itself fails.
	if f, err := os.OpenFile(filepath.Join(dir, "nbd-host-a", "nbd"), os.O_WRONLY, 0); err == nil {
		_, werr := f.WriteAt([]byte("x"), 0)
		f.Close()
		if werr == nil {
			t.Errorf("writing to the ro attachment's nbdfuse file succeeded")
		}
	}
}
