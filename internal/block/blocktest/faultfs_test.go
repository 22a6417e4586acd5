package blocktest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// The model itself: what a crash keeps of metadata and data files.
func TestFaultFSCrashKeepsOnlyDurable(t *testing.T) {
	for _, c := range []struct {
		name string
		keep func(int) bool
	}{{"keep none", nil}, {"keep all", KeepAll}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			fs := NewFaultFS()
			fs.Keep = c.keep
			env := block.Env{Dir: dir, Size: 64 << 10, Create: true, MetaFS: fs.Open}
			l, err := block.Build(env, Spec(t, Cached(t, `{"type":"file","params":{"path":"d.img"}}`)))
			if err != nil {
				t.Fatal(err)
			}
			m, _ := env.OpenMeta("m")
			a, b, f := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096), bytes.Repeat([]byte{3}, 100)
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			must(l.WriteAt(a, 0, false))
			must(l.Flush())
			must(l.WriteAt(b, 0, false))    // cached over a
			must(l.WriteAt(f, 50, true))    // durable, inside b's range
			must(l.WriteAt(b, 8192, false)) // cached, never flushed
			must(l.Close())                 // closing makes nothing durable
			env.Create = false
			l, err = block.Build(env, Spec(t, Cached(t, `{"type":"file","params":{"path":"d.img"}}`)))
			must(err)
			view := make([]byte, 4096)
			must(l.ReadAt(view, 0)) // another handle shares the cache
			if !bytes.Equal(view[:50], b[:50]) || !bytes.Equal(view[50:150], f) || !bytes.Equal(view[150:], b[150:]) {
				t.Fatal("a reopened file does not read its cached writes")
			}
			if _, err := m.WriteAt(a[:10], 0); err != nil {
				t.Fatal(err)
			}
			must(m.Sync())
			if _, err := m.WriteAt(b[:10], 5); err != nil { // never synced
				t.Fatal(err)
			}
			got := make([]byte, 20)
			m.ReadAt(got, 0)
			if !bytes.Equal(got, append(append(append([]byte(nil), a[:5]...), b[:10]...), make([]byte, 5)...)) {
				t.Fatalf("metadata reads %v before the crash", got)
			}

			r := fs.Restart()
			disk, err := os.ReadFile(filepath.Join(dir, "d.img"))
			if err != nil {
				t.Fatal(err)
			}
			want := bytes.Clone(a)
			wantMeta := append(append([]byte(nil), a[:10]...), make([]byte, 10)...)
			if c.keep != nil {
				copy(want, b)
				copy(wantMeta[5:], b[:10])
			}
			copy(want[50:], f) // durable whatever older write landed
			if !bytes.Equal(disk[:4096], want) {
				t.Fatal("block 0 after the crash is not what was durable (and kept)")
			}
			if kept := bytes.Equal(disk[8192:12288], b); kept != (c.keep != nil) {
				t.Fatalf("the unflushed write landed: %v", kept)
			}
			rm, _ := r.Open(filepath.Join(dir, "m"))
			rm.ReadAt(got, 0)
			if !bytes.Equal(got, wantMeta) {
				t.Fatalf("metadata after the crash %v, want %v", got, wantMeta)
			}
			if _, err := m.WriteAt(a, 0); err == nil {
				t.Fatal("a metadata write after the crash succeeded")
			}
			if err := l.WriteAt(a, 0, false); err == nil {
				t.Fatal("a data write after the crash succeeded")
			}
			l.Close()
		})
	}
}
