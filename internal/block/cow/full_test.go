package cow

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// fullMeta opens metadata files on a file system that fills up: while full
// is set, a write to a file named one of names lands (it reached the page
// cache) and then fails with ENOSPC, as a writeback refused for want of
// space reports it — so whether the file holds the new copy is unknown to
// the writer — and a sync fails the same way.
type fullMeta struct {
	names []string
	full  atomic.Bool
}

func (m *fullMeta) open(path string) (block.MetaFile, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for _, n := range m.names {
		if filepath.Base(path) == n {
			return &fullFile{File: f, full: &m.full}, nil
		}
	}
	return f, nil
}

type fullFile struct {
	*os.File
	full *atomic.Bool
}

func (f *fullFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	if err == nil && f.full.Load() {
		err = syscall.ENOSPC
	}
	return n, err
}

func (f *fullFile) Sync() error {
	if f.full.Load() {
		return syscall.ENOSPC
	}
	return f.File.Sync()
}

// TestSnapshotCommitRefusedForSpace: a snapshot whose cow.sb write the full
// store refuses fails with ENOSPC, and the write may have landed, so cow.sb
// may name the new image or the old; until that is settled nothing may be
// acknowledged. But it must not stay so until someone reopens the volume:
// once space is back, the next write settles it (cow.sb rewritten to name
// the top the layer writes into) and goes through, and a reopen then finds
// that top with what was written into it.
func TestSnapshotCommitRefusedForSpace(t *testing.T) {
	const chunk = 8192
	env, fm, l := fullLayer(t, chunk)
	defer func() { l.Close() }()
	old := bytes.Repeat([]byte{1}, chunk)
	if err := l.WriteAt(old, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	top := l.Top()

	fm.full.Store(true)
	if _, err := l.Snapshot("s"); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("snapshot with cow.sb refused: %v, want ENOSPC", err)
	}
	if err := l.WriteAt(bytes.Repeat([]byte{2}, chunk), 2*chunk, false); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write while cow.sb is unsettled and the store still full: %v, want ENOSPC", err)
	}
	got := make([]byte, chunk)
	if err := l.ReadAt(got, 0); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("read after the refused snapshot: %v", err)
	}

	fm.full.Store(false)
	want := bytes.Repeat([]byte{3}, chunk)
	if err := l.WriteAt(want, 4*chunk, false); err != nil {
		t.Fatalf("write once space is back: %v", err)
	}
	if err := l.Flush(); err != nil {
		t.Fatalf("flush once space is back: %v", err)
	}
	env.Create = false
	l.Close()
	l = build(t, env, fileSpec)
	if l.Top() != top || l.Depth() != 1 || l.FrozenFor("s") {
		t.Fatalf("after reopen the top is %s at depth %d (frozen for s: %v), want %s at depth 1: cow.sb still names the refused snapshot's image",
			l.Top(), l.Depth(), l.FrozenFor("s"), top)
	}
	for _, c := range []struct {
		off  int64
		want []byte
	}{{0, old}, {4 * chunk, want}} {
		if err := l.ReadAt(got, c.off); err != nil || !bytes.Equal(got, c.want) {
			t.Fatalf("after reopen, chunk at %d: %v, or not what was flushed", c.off, err)
		}
	}
	if img, err := l.Snapshot("s"); err != nil || img != top {
		t.Fatalf("the snapshot again, with space: %s, %v; want it to freeze %s", img, err, top)
	}
}

// TestCollapseCommitRefusedForSpace: the same for a collapse, whose commit
// is the cow.sb write naming the parent as the top: refused, writes wait
// for space, then go on into the parent, which holds all the volume's data
// by then, and a reopen finds the parent as the top; the collapse, run
// again, finds its work done. The refused write may have landed, and then
// the old top is in no chain on disk: a collection meanwhile ("collected")
// removes it, and the layer must not name it in cow.sb again and write
// into its removed files.
func TestCollapseCommitRefusedForSpace(t *testing.T) {
	for _, collected := range []bool{false, true} {
		t.Run(map[bool]string{false: "kept", true: "collected"}[collected], func(t *testing.T) {
			const chunk = 8192
			env, fm, l := fullLayer(t, chunk)
			defer func() { l.Close() }()
			model := make([]byte, env.Size)
			for i, c := range []int64{0, 3} {
				p := bytes.Repeat([]byte{byte(10 + i)}, chunk)
				if err := l.WriteAt(p, c*chunk, false); err != nil {
					t.Fatal(err)
				}
				copy(model[c*chunk:], p)
				if i == 0 {
					if _, err := l.Snapshot("s"); err != nil {
						t.Fatal(err)
					}
				}
			}
			parent, top := l.top.meta.Parent, l.Top()

			fm.full.Store(true)
			if err := l.Collapse(t.Context(), parent, nil); !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("collapse with cow.sb refused: %v, want ENOSPC", err)
			}
			if collected {
				named, err := TopOf(env.Dir)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := Collect(env.Images, []string{named}, 0); err != nil {
					t.Fatal(err)
				}
			}
			expect(t, l, model, "after the refused collapse")

			fm.full.Store(false)
			p := bytes.Repeat([]byte{20}, chunk)
			if err := l.WriteAt(p, 5*chunk, false); err != nil {
				t.Fatalf("write once space is back: %v", err)
			}
			copy(model[5*chunk:], p)
			if err := l.Flush(); err != nil {
				t.Fatalf("flush once space is back: %v", err)
			}
			env.Create = false
			l.Close()
			l = build(t, env, fileSpec)
			if l.Top() != parent || l.Depth() != 1 {
				t.Fatalf("after reopen the top is %s at depth %d, want the parent %s at depth 1 (the old top was %s)", l.Top(), l.Depth(), parent, top)
			}
			expect(t, l, model, "reopened after the refused collapse")
			if err := l.Collapse(t.Context(), parent, nil); err != nil {
				t.Fatalf("the collapse again, with space: %v", err)
			}
			expect(t, l, model, "collapsed")
		})
	}
}

// TestResizeAfterRefusedCommit: after a snapshot whose cow.sb write the
// full store refused, cow.sb may name the refused snapshot's new image
// rather than the top the layer goes on with. A Resize then grows that
// top and is acknowledged; it must settle cow.sb first (as a write does),
// or a reopen before anything else rewrote cow.sb finds the other image,
// at the old size: the acknowledged growth is lost.
func TestResizeAfterRefusedCommit(t *testing.T) {
	const chunk = 8192
	env, fm, l := fullLayer(t, chunk)
	defer func() { l.Close() }()
	data := bytes.Repeat([]byte{1}, chunk)
	if err := l.WriteAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	top := l.Top()
	fm.full.Store(true)
	if _, err := l.Snapshot("s"); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("snapshot with cow.sb refused: %v, want ENOSPC", err)
	}
	fm.full.Store(false)
	if err := l.Resize(16 * chunk); err != nil {
		t.Fatalf("resize once space is back: %v", err)
	}
	// A crash now: nothing flushed or wrote since the resize.
	l.Close()
	env.Create = false
	l = build(t, env, fileSpec)
	if l.Top() != top || l.Size() != 16*chunk {
		t.Fatalf("after reopen: top %s of %d bytes, want %s of %d bytes (the acknowledged resize)", l.Top(), l.Size(), top, 16*chunk)
	}
	got := make([]byte, chunk)
	if err := l.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after reopen chunk 0: %v, or not what was flushed", err)
	}
}

// fullLayer builds a layer of 8 chunks whose cow.sb is on a store that
// fills up when the returned fullMeta says so.
func fullLayer(t *testing.T, chunk int64) (block.Env, *fullMeta, *Layer) {
	fm := &fullMeta{names: []string{volFile}}
	env := testEnv(t, 8*chunk)
	env.MetaFS = fm.open
	return env, fm, build(t, env, fileSpec)
}
