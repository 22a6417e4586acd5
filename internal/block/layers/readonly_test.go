package layers_test

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// dirState maps every file under dir to its size and mtime.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[p] = fmt.Sprint(info.ModTime().Format(time.RFC3339Nano), " ", info.Mode(), " ", info.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Opening a stack read-only (how `volume show` describes a closed stack)
// creates and changes nothing, even when a layer's metadata file is gone.
func TestReadOnlyOpenWritesNothing(t *testing.T) {
	for name, js := range stacks {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			spec := blocktest.Spec(t, js)
			l, err := block.Build(block.Env{Dir: dir, Size: 8 << 20, Create: true}, spec)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.WriteAt(make([]byte, 4096), 4096, false); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			before := dirState(t, dir)
			time.Sleep(10 * time.Millisecond) // mtimes would move
			ro, err := block.Build(block.Env{Dir: dir, Size: 8 << 20, ReadOnly: true}, spec)
			if err != nil {
				t.Fatal(err)
			}
			ro.Describe()
			if err := ro.ReadAt(make([]byte, 8192), 0); err != nil {
				t.Fatal(err)
			}
			if err := ro.Close(); err != nil {
				t.Fatal(err)
			}
			if after := dirState(t, dir); !maps.Equal(before, after) {
				t.Fatalf("a read-only open changed the stack's files:\nbefore %v\nafter  %v", before, after)
			}
			// A metadata file that is not there is not created either.
			for p := range before {
				if filepath.Ext(p) == ".meta" {
					os.Remove(p)
					if ro, err := block.Build(block.Env{Dir: dir, Size: 8 << 20, ReadOnly: true}, spec); err == nil {
						ro.Close()
					}
					if _, err := os.Stat(p); err == nil {
						t.Fatalf("a read-only open created %s", p)
					}
				}
			}
		})
	}
}
