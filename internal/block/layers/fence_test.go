package layers_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/keys"
)

// dirContent maps every file under dir to the hash of its bytes.
func dirContent(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		out[p] = sha256.Sum256(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Once a stack's fence closes (the node lost the volume's write lease),
// nothing reaches its files: FUA writes and flushes fail, and neither other
// writes, zeroes, trims, background work nor Close — which flushes layer
// metadata in several layers — changes a byte.
func TestFenceStopsEveryWrite(t *testing.T) {
	all := maps.Clone(stacks)
	all["cow-mirror"] = `{"type":"cow","children":[{"type":"mirror","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}]}`
	all["crypt-cow"] = `{"type":"crypt","children":[{"type":"cow","children":[{"type":"file","params":{"path":"a.img"}}]}]}`
	all["checksum-cow-parity"] = `{"type":"checksum","children":[{"type":"cow","children":[{"type":"parity","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}},{"type":"file","params":{"path":"c.img"}}]}]}]}`
	k, err := keys.New(keys.Generate())
	if err != nil {
		t.Fatal(err)
	}
	for name, js := range all {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			f := &countingFence{}
			fenced := &f.closed
			env := block.Env{Dir: dir, Images: filepath.Join(dir, "images"), Size: 8 << 20, Create: true, Keys: k, Fence: f}
			l, err := block.Build(env, blocktest.Spec(t, js))
			if err != nil {
				t.Fatal(err)
			}
			data := bytes.Repeat([]byte{0xab}, 64<<10)
			if err := l.WriteAt(data, 0, false); err != nil {
				t.Fatal(err)
			}
			if err := l.Flush(); err != nil {
				t.Fatal(err)
			}
			// Written but not flushed when the fence closes.
			if err := l.WriteAt(data, 1<<20, false); err != nil {
				t.Fatal(err)
			}
			before := dirContent(t, dir)
			fenced.Store(true)
			// Redundant layers may report the fence as failed legs; what
			// matters is that nothing succeeds and nothing lands.
			if err := l.WriteAt(data, 3<<20, true); err == nil {
				t.Errorf("FUA write after the fence succeeded")
			}
			if err := l.Flush(); err == nil {
				t.Errorf("flush after the fence succeeded")
			}
			if err := l.WriteAt(data, 2<<20, false); err != nil && !errors.Is(err, block.ErrFenced) {
				t.Logf("write after the fence: %v", err) // may be buffered above; never lands
			}
			if c := l.Capabilities(); c.WriteZeroes {
				l.WriteZeroes(0, 4096, block.ZeroFlags{})
			}
			if c := l.Capabilities(); c.Trim {
				l.Trim(0, 4096, false)
			}
			time.Sleep(50 * time.Millisecond) // background work (resyncs) would write now
			l.Close()
			if n := f.inflight.Load(); n != 0 {
				t.Errorf("%d writes the fence let through never exited it (the fence's owner would wait for them for good)", n)
			}
			if after := dirContent(t, dir); !maps.Equal(before, after) {
				for p, h := range after {
					if before[p] != h {
						t.Errorf("%s changed after the fence closed", p)
					}
				}
			}
		})
	}
}

// countingFence refuses writes once closed, and counts those it let
// through that are under way.
type countingFence struct {
	closed   atomic.Bool
	inflight atomic.Int64
}

func (f *countingFence) Enter() error {
	f.inflight.Add(1)
	if f.closed.Load() {
		f.inflight.Add(-1)
		return block.ErrFenced
	}
	return nil
}

func (f *countingFence) Exit() { f.inflight.Add(-1) }
