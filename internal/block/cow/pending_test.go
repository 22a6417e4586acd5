package cow

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// Crashes here are what kill -9 leaves: file data written but not synced
// survives (in the page cache), allocation bits only as far as a Sync
// wrote them. Close syncs nothing, so closing without a flush and reopening
// is such a crash, and so is a copy of the files taken while writes run.

// stall, when set, makes every write of a `stallfile` layer at or beyond
// stallFrom wait until stall is closed.
var (
	stallFrom atomic.Int64
	stallMu   sync.Mutex
	stall     chan struct{}
	stalled   = make(chan struct{}, 16)
)

type stalling struct{ block.Layer }

func (s stalling) WriteAt(p []byte, off int64, fua bool) error {
	stallMu.Lock()
	ch := stall
	stallMu.Unlock()
	if ch != nil && off+int64(len(p)) > stallFrom.Load() {
		stalled <- struct{}{}
		<-ch
	}
	return s.Layer.WriteAt(p, off, fua)
}

func init() {
	block.Register(block.Type{Name: "stallfile", MinChildren: 0, MaxChildren: 0,
		New: func(env block.Env, raw json.RawMessage, _ []block.Layer) (block.Layer, error) {
			l, err := block.Build(env, block.Spec{Type: "file", Params: raw})
			return stalling{l}, err
		}})
}

func readChunk(t *testing.T, l block.Device, off, n int64) []byte {
	t.Helper()
	got := make([]byte, n)
	if err := l.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestFlushCoversInflightCopyUp: a write copies chunk 0 up from a base and
// is still busy with chunk 1 when a second write goes straight to chunk 0
// (the top holds it now) and a flush is acknowledged. The flush must
// persist chunk 0's bit, or after a crash chunk 0 reads from the base and
// the flushed write is gone.
func TestFlushCoversInflightCopyUp(t *testing.T) {
	const chunk = 8192
	spec := `{"type":"cow","params":{"chunk":8192},"children":[{"type":"stallfile","params":{"path":"data.img"}}]}`
	env := testEnv(t, 4*chunk)
	l := build(t, env, spec)
	defer l.Close()
	if err := l.WriteAt(bytes.Repeat([]byte{1}, 2*chunk), 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Snapshot("s"); err != nil {
		t.Fatal(err)
	}
	stallFrom.Store(chunk)
	release := make(chan struct{})
	stallMu.Lock()
	stall = release
	stallMu.Unlock()
	done := make(chan error, 1)
	go func() { done <- l.WriteAt(bytes.Repeat([]byte{2}, 2*chunk), 0, false) }()
	<-stalled // chunk 0 copied up; chunk 1's copy-up waits
	want := bytes.Repeat([]byte{3}, chunk)
	if err := l.WriteAt(want, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	crashed := filepath.Join(t.TempDir(), "crashed")
	if err := os.CopyFS(crashed, os.DirFS(filepath.Dir(env.Dir))); err != nil {
		t.Fatal(err)
	}
	stallMu.Lock()
	stall = nil
	stallMu.Unlock()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cenv := block.Env{Dir: filepath.Join(crashed, "vol"), Images: filepath.Join(crashed, "images")}
	c := build(t, cenv, spec)
	defer c.Close()
	if got := readChunk(t, c, 0, chunk); !bytes.Equal(got, want) {
		t.Fatalf("after the crash chunk 0 reads %#x…, want the flushed write's %#x", got[0], want[0])
	}
}

// TestFUAIntoPendingCopyUp: a write copies chunk 0 up (its bit pending
// until a flush), then a FUA write lands in chunk 0. Acknowledged, it must
// survive a crash: the chunk's bit has to be durable too.
func TestFUAIntoPendingCopyUp(t *testing.T) {
	const chunk = 8192
	env := testEnv(t, 4*chunk)
	l := build(t, env, fileSpec)
	if err := l.WriteAt(bytes.Repeat([]byte{1}, chunk), 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Snapshot("s"); err != nil {
		t.Fatal(err)
	}
	if err := l.WriteAt(bytes.Repeat([]byte{2}, 4096), 0, false); err != nil { // copy-up, bit pending
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{3}, 4096)
	if err := l.WriteAt(want, 4096, true); err != nil {
		t.Fatal(err)
	}
	l.Close() // the crash
	env.Create = false
	l = build(t, env, fileSpec)
	defer l.Close()
	if got := readChunk(t, l, 4096, 4096); !bytes.Equal(got, want) {
		t.Fatalf("after the crash the FUA write reads %#x…, want %#x", got[0], want[0])
	}
}

// TestSnapshotAfterCrashKeepsUnheldData: a write whose bit a crash kept
// from the disk, but whose data landed, reads back after the reopen; a
// snapshot must not change that, in the volume or in a clone.
func TestSnapshotAfterCrashKeepsUnheldData(t *testing.T) {
	const chunk = 8192
	env := testEnv(t, 4*chunk)
	l := build(t, env, fileSpec)
	want := bytes.Repeat([]byte{7}, chunk)
	if err := l.WriteAt(want, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.top.dev.Flush(); err != nil { // the data lands; the bit does not
		t.Fatal(err)
	}
	l.Close()
	env.Create = false
	l = build(t, env, fileSpec)
	defer l.Close()
	if got := readChunk(t, l, 0, chunk); !bytes.Equal(got, want) {
		t.Fatalf("after the crash chunk 0 reads %#x…", got[0])
	}
	img, err := l.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	if got := readChunk(t, l, 0, chunk); !bytes.Equal(got, want) {
		t.Fatalf("after a snapshot chunk 0 reads %#x…, want %#x", got[0], want[0])
	}
	c := clone(t, env, img, fileSpec)
	defer c.Close()
	if got := readChunk(t, c, 0, chunk); !bytes.Equal(got, want) {
		t.Fatalf("a clone of the snapshot reads %#x…, want %#x", got[0], want[0])
	}
}

// TestSweepKeepsAncestorsOfUnreadable: when a root's superblock cannot be
// read, its parent is unknown, and so is what it needs: nothing is
// removed and Collect says why.
func TestSweepKeepsAncestorsOfUnreadable(t *testing.T) {
	env := testEnv(t, 1<<20)
	l := build(t, env, fileSpec)
	if err := l.WriteAt(bytes.Repeat([]byte{1}, 8192), 0, false); err != nil {
		t.Fatal(err)
	}
	img, err := l.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	c := clone(t, env, img, fileSpec)
	top := c.Top()
	c.Close()
	l.Close()
	sb := filepath.Join(env.Images, top, imgFile)
	if err := os.Rename(sb, sb+".aside"); err != nil {
		t.Fatal(err)
	}
	removed, err := Collect(env.Images, []string{top}, 0)
	if err == nil || len(removed) != 0 {
		t.Fatalf("Collect with an unreadable root removed %v, err %v; want nothing removed and an error", removed, err)
	}
	if _, err := os.Stat(filepath.Join(env.Images, img)); err != nil {
		t.Fatalf("the clone's base: %v", err)
	}
	if err := os.Rename(sb+".aside", sb); err != nil {
		t.Fatal(err)
	}
	removed, err = Collect(env.Images, []string{top}, 0)
	if err != nil || len(removed) != 1 { // the source volume's top
		t.Fatalf("then removed %v, err %v; want the source's top only", removed, err)
	}
}
