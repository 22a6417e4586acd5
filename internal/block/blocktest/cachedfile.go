package blocktest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/fault"
	"github.com/basalt-storage/basalt/internal/block/file"
)

// The "cachedfile" layer is a file layer (same parameters, same file)
// whose writes wait in the volatile cache (see Cached) of the FaultFS that is the
// stack's Env.MetaFS until it makes them durable as block.File's
// contract says: Flush, FUA, Resize. A crash of that FaultFS drops what
// is still cached (but what its Keep selects), so a crash test built on
// it sees what a power loss would leave — unlike a plain file, whose
// unflushed writes the page cache keeps through any test's "crash".
func init() {
	block.Register(block.Type{
		Name: "cachedfile", Doc: "a file whose writes are volatile until flushed (crash tests)",
		MinChildren: 0, MaxChildren: 0, New: newCachedFile,
		Files: func(raw json.RawMessage) []string {
			var p file.Params
			if block.DecodeParams(raw, &p) != nil || p.Path == "" {
				return nil
			}
			return []string{p.Path}
		},
	})
}

// Cached returns spec with every file layer in it replaced by a
// cachedfile layer over the same file.
func Cached(t testing.TB, spec string) string {
	t.Helper()
	var walk func(s *block.Spec)
	walk = func(s *block.Spec) {
		if s.Type == "file" {
			s.Type = "cachedfile"
		}
		for i := range s.Children {
			walk(&s.Children[i])
		}
	}
	sp := Spec(t, spec)
	walk(&sp)
	b, err := json.Marshal(sp)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// cachedFile is an open cachedfile layer.
type cachedFile struct {
	block.Layer // the file layer: size, capabilities, the real file
	fs          *FaultFS
	df          *dataFile
	fence       block.Fence
	closed      atomic.Bool
}

func newCachedFile(env block.Env, raw json.RawMessage, _ []block.Layer) (block.Layer, error) {
	if env.MetaFS == nil {
		return nil, errors.New("cachedfile: Env.MetaFS must be a blocktest.FaultFS")
	}
	l, err := file.New(env, raw, nil)
	if err != nil {
		return nil, err
	}
	path := l.Describe().Path
	st, err := os.Stat(path)
	if err == nil {
		var mf block.MetaFile
		if mf, err = env.MetaFS(path); err == nil {
			if ff, ok := mf.(*faultFile); ok {
				return ff.fs.attach(l, path, st, env.Fence), nil
			}
			err = errors.New("Env.MetaFS must be a blocktest.FaultFS")
		}
	}
	l.Close()
	return nil, fmt.Errorf("cachedfile: %w", err)
}

// attach returns the layer over the file layer l at path, sharing the
// cache of earlier handles of the same file.
func (fs *FaultFS) attach(l block.Layer, path string, st os.FileInfo, fence block.Fence) *cachedFile {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	df := fs.data[path]
	if df == nil || !os.SameFile(df.id, st) {
		df = &dataFile{path: path, id: st}
		fs.data[path] = df
	}
	return &cachedFile{Layer: l, fs: fs, df: df, fence: fence}
}

// begin fails when the layer cannot take a write now; else end must
// follow once the write is done. The caller holds fs.mu.
func (d *cachedFile) begin() error {
	switch {
	case d.closed.Load():
		return block.ErrClosed
	case d.fs.crashed:
		return fault.ErrCrashed
	case d.Capabilities().ReadOnly:
		return block.ErrReadOnly
	case d.fence != nil:
		return d.fence.Enter()
	}
	return nil
}

// end ends a write begin let through.
func (d *cachedFile) end() {
	if d.fence != nil {
		d.fence.Exit()
	}
}

// ReadAt implements block.Device: the file, with the cache over it.
func (d *cachedFile) ReadAt(p []byte, off int64) error {
	d.fs.mu.Lock()
	defer d.fs.mu.Unlock()
	if d.closed.Load() {
		return block.ErrClosed
	}
	if err := d.Layer.ReadAt(p, off); err != nil {
		return err
	}
	d.df.cache.overlay(p, off)
	return nil
}

// WriteAt implements block.Device: into the cache, or with fua to the
// file, durably.
func (d *cachedFile) WriteAt(p []byte, off int64, fua bool) error {
	return d.write(p, off, fua, func() error { return d.Layer.WriteAt(p, off, true) })
}

// WriteZeroes implements block.Device as a write of zeroes.
func (d *cachedFile) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	return d.write(make([]byte, n), off, f.FUA, func() error {
		return d.Layer.WriteZeroes(off, n, block.ZeroFlags{NoHole: f.NoHole, FUA: true})
	})
}

// Trim implements block.Device as a write of zeroes (what the file's
// trim leaves).
func (d *cachedFile) Trim(off, n int64, fua bool) error {
	return d.write(make([]byte, n), off, fua, func() error { return d.Layer.Trim(off, n, true) })
}

// write caches p at off, or with fua runs durable, which writes it to
// the file and makes it durable, and drops what the cache held there.
func (d *cachedFile) write(p []byte, off int64, fua bool, durable func() error) error {
	d.fs.mu.Lock()
	defer d.fs.mu.Unlock()
	if err := d.begin(); err != nil {
		return err
	}
	defer d.end()
	if !fua {
		d.fs.cacheWrite(&d.df.cache, p, off)
		return nil
	}
	if err := durable(); err != nil {
		return err
	}
	d.df.cache.supersede(off, int64(len(p)))
	return nil
}

// settle writes the cache to the file. The caller holds fs.mu.
func (d *cachedFile) settle() error {
	for _, w := range d.df.cache {
		if err := d.Layer.WriteAt(w.data, w.off, false); err != nil {
			return err
		}
	}
	d.df.cache = nil
	return nil
}

// Flush implements block.Device: the cache to the file, then the file's
// flush (which also fails if the file was unlinked).
func (d *cachedFile) Flush() error {
	d.fs.mu.Lock()
	defer d.fs.mu.Unlock()
	if d.Capabilities().ReadOnly && !d.closed.Load() {
		return nil
	}
	if err := d.begin(); err != nil {
		return err
	}
	defer d.end()
	if err := d.settle(); err != nil {
		return err
	}
	return d.Layer.Flush()
}

// Resize implements block.Resizer: the file's resize fsyncs the whole
// file, so the cache is settled first.
func (d *cachedFile) Resize(n int64) error {
	d.fs.mu.Lock()
	defer d.fs.mu.Unlock()
	if err := d.begin(); err != nil {
		return err
	}
	defer d.end()
	if err := d.settle(); err != nil {
		return err
	}
	return d.Layer.(block.Resizer).Resize(n)
}

// Extents implements block.Device: all data (the file's holes may be
// cached writes).
func (d *cachedFile) Extents(off, n int64) ([]block.Extent, error) {
	if d.closed.Load() {
		return nil, block.ErrClosed
	}
	return []block.Extent{{Length: n}}, nil
}

// Describe implements block.Layer.
func (d *cachedFile) Describe() block.Node {
	n := d.Layer.Describe()
	n.Type = "cachedfile"
	return n
}

// Close implements block.Device. What is cached stays in the machine's
// cache: closing a file does not make it durable.
func (d *cachedFile) Close() error {
	d.fs.mu.Lock()
	defer d.fs.mu.Unlock()
	d.closed.Store(true)
	return d.Layer.Close()
}
