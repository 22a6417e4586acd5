package block

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// plain hides File's FileCopier: the generic, user-space path.
type plain struct{ Device }

// TestCopyPaths: CopyOut and CopyIn give the same bytes by the kernel path
// (File is a FileCopier) and the user-space one, and leave holes as holes.
func TestCopyPaths(t *testing.T) {
	const size = 3<<20 + 1000
	dir := t.TempDir()
	want := make([]byte, size)
	copy(want[4096:], bytes.Repeat([]byte("basalt"), 5000))
	copy(want[2<<20:], bytes.Repeat([]byte{9}, 100000))
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(src, size); err != nil {
		t.Fatal(err)
	}
	d, err := OpenFile(src, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.WriteAt(want[4096:4096+30000], 4096, false); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAt(want[2<<20:2<<20+100000], 2<<20, false); err != nil {
		t.Fatal(err)
	}
	for name, dev := range map[string]Device{"kernel": d, "user": plain{d}} {
		t.Run(name, func(t *testing.T) {
			out, err := os.Create(filepath.Join(t.TempDir(), "out"))
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			rep, err := CopyOut(dev, out, size, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(out.Name()); !bytes.Equal(got, want) {
				t.Fatal("CopyOut: wrong bytes")
			}
			if name == "user" && rep.UserBytes != rep.DataBytes || name == "kernel" && rep.UserBytes != 0 {
				t.Fatalf("report %+v", rep)
			}
			if rep.DataBytes > 1<<20 {
				t.Fatalf("report %+v: holes were copied", rep)
			}
			// Back in: a new sparse file of the same size.
			back := filepath.Join(t.TempDir(), "back")
			if err := os.WriteFile(back, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(back, size); err != nil {
				t.Fatal(err)
			}
			bd, err := OpenFile(back, false)
			if err != nil {
				t.Fatal(err)
			}
			defer bd.Close()
			var in Device = bd
			if name == "user" {
				in = plain{bd}
			}
			if _, err := CopyIn(in, out, size, nil); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(back); !bytes.Equal(got, want) {
				t.Fatal("CopyIn: wrong bytes")
			}
		})
	}
}
