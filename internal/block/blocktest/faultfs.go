package blocktest

import (
	"fmt"
	"os"
	"sync"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/fault"
)

// FaultFS models the storage of one machine for crash tests: in-memory
// metadata files (Open, for block.Env.MetaFS) and the data files of
// "cachedfile" layers (real files; see Cached), all behind a
// volatile write cache, as disks and the page cache are. A write is held
// in the cache — read back, but not durable — until its file is synced:
// MetaFile.Sync, or for a data file Flush, a FUA write or zeroing, or a
// Resize (which fsyncs, as block.File's does). Durability is per file, as
// fsync's is.
//
// A crash is a power loss: of the writes still in the cache, only those
// Keep selects reach storage, and every call after it (metadata or data)
// fails but reads. The metadata writes share one counter: the write
// numbered CrashAt (from 0, across all metadata files) crashes the
// machine, landing only the bytes Tear selects; Crash crashes it at any
// other moment. Restart() gives what a restarted machine would read.
type FaultFS struct {
	mu   sync.Mutex
	meta map[string]*metaFile
	data map[string]*dataFile
	// CrashAt is the metadata write that crashes the machine (negative:
	// none does).
	CrashAt int
	// Tear selects which bytes of the crashing write land (nil: none).
	Tear func(int) bool
	// Keep selects which writes still in the cache at the crash reach
	// storage anyway, by their number in order of writing (from 0,
	// metadata and data alike): a disk may have written any of them
	// before power failed. nil keeps none; KeepAll keeps every one (what
	// a killed process leaves: the page cache outlives it).
	Keep    func(int) bool
	writes  int // metadata writes, for CrashAt
	cached  int // writes put in the cache, for Keep
	crashed bool
	err     error // landing kept writes in a data file at the crash
}

// KeepAll keeps every cached write at a crash (FaultFS.Keep).
func KeepAll(int) bool { return true }

// KeepSome keeps an arbitrary, reproducible half of the cached writes at a
// crash (FaultFS.Keep), chosen by seed.
func KeepSome(seed uint64) func(int) bool {
	return func(i int) bool {
		x := seed ^ uint64(i)*0x9e3779b97f4a7c15 // splitmix64 of (seed, i)
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		return (x^x>>31)&1 == 1
	}
}

// NewFaultFS returns an empty FaultFS that never crashes by itself.
func NewFaultFS() *FaultFS {
	return &FaultFS{meta: map[string]*metaFile{}, data: map[string]*dataFile{}, CrashAt: -1}
}

// Open implements block.Env.MetaFS. A file never written reads as empty.
func (fs *FaultFS) Open(path string) (block.MetaFile, error) {
	return &faultFile{fs: fs, path: path}, nil
}

// Writes is the number of metadata writes so far.
func (fs *FaultFS) Writes() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.writes
}

// Crashed reports whether the crash happened.
func (fs *FaultFS) Crashed() bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.crashed
}

// Crash crashes the machine now (nothing if it has crashed already).
func (fs *FaultFS) Crash() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.crash()
}

// Restart crashes the machine if it is still up, and returns a FaultFS
// that never crashes by itself, holding what reached storage: the
// metadata files' durable bytes (the data files are real files, which
// the crash left holding theirs).
func (fs *FaultFS) Restart() *FaultFS {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.crash()
	if fs.err != nil {
		panic(fmt.Sprintf("blocktest: crash: %v", fs.err))
	}
	n := NewFaultFS()
	for p, f := range fs.meta {
		n.meta[p] = &metaFile{durable: append([]byte(nil), f.durable...)}
	}
	return n
}

// crash lands the cached writes Keep selects and drops the others. The
// caller holds fs.mu.
func (fs *FaultFS) crash() {
	if fs.crashed {
		return
	}
	fs.crashed = true
	for _, f := range fs.meta {
		for _, w := range f.cache.take() {
			if fs.Keep != nil && fs.Keep(w.n) {
				f.land(w.data, w.off, nil)
			}
		}
	}
	for _, f := range fs.data {
		var kept []cachedWrite
		for _, w := range f.cache.take() {
			if fs.Keep != nil && fs.Keep(w.n) {
				kept = append(kept, w)
			}
		}
		if err := f.landKept(kept); err != nil && fs.err == nil {
			fs.err = err
		}
	}
}

// cacheWrite puts a copy of p at off in c, numbered for Keep. The caller
// holds fs.mu.
func (fs *FaultFS) cacheWrite(c *writeCache, p []byte, off int64) {
	c.add(fs.cached, append([]byte(nil), p...), off)
	fs.cached++
}

// metaFile is a metadata file: the bytes on storage, and the writes in
// the cache.
type metaFile struct {
	durable []byte
	cache   writeCache
}

// land writes the bytes of p that tear selects (nil: all) to storage.
func (f *metaFile) land(p []byte, off int64, tear func(int) bool) {
	if need := int(off) + len(p); need > len(f.durable) {
		f.durable = append(f.durable, make([]byte, need-len(f.durable))...)
	}
	for i := range p {
		if tear == nil || tear(i) {
			f.durable[int(off)+i] = p[i]
		}
	}
}

// faultFile is an open metadata file of a FaultFS.
type faultFile struct {
	fs   *FaultFS
	path string
}

// file returns the metadata file, created empty on first use. The caller
// holds fs.mu.
func (f *faultFile) file() *metaFile {
	m := f.fs.meta[f.path]
	if m == nil {
		m = &metaFile{}
		f.fs.meta[f.path] = m
	}
	return m
}

// ReadAt reads what the machine holds, cache included; bytes beyond the
// end read as zero.
func (f *faultFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	m := f.file()
	clear(p)
	if off < int64(len(m.durable)) {
		copy(p, m.durable[off:])
	}
	m.cache.overlay(p, off)
	return len(p), nil
}

// WriteAt puts p in the cache, or crashes the machine.
func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.crashed {
		return 0, fault.ErrCrashed
	}
	k := f.fs.writes
	f.fs.writes++
	if f.fs.CrashAt >= 0 && k == f.fs.CrashAt {
		f.fs.crash()
		f.file().land(p, off, func(i int) bool { return f.fs.Tear != nil && f.fs.Tear(i) })
		return 0, fault.ErrCrashed
	}
	f.fs.cacheWrite(&f.file().cache, p, off)
	return len(p), nil
}

// Sync makes the file's cached writes durable.
func (f *faultFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.crashed {
		return fault.ErrCrashed
	}
	m := f.file()
	for _, w := range m.cache.take() {
		m.land(w.data, w.off, nil)
	}
	return nil
}

func (f *faultFile) Close() error { return nil }

// dataFile is the machine's state of one data file: the writes in its
// cache (what storage holds is the real file). It is kept by path for as
// long as the file there is the same one: handles opened one after the
// other share the cache, as they share the page cache.
type dataFile struct {
	path  string
	id    os.FileInfo
	cache writeCache
}

// landKept writes the writes of f a crash keeps to the real file, unless
// it is gone (or another file took its name): with it went its cache.
func (f *dataFile) landKept(kept []cachedWrite) error {
	if len(kept) == 0 {
		return nil
	}
	h, err := os.OpenFile(f.path, os.O_RDWR, 0)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer h.Close()
	if st, err := h.Stat(); err != nil || !os.SameFile(st, f.id) {
		return err
	}
	for _, w := range kept {
		if _, err := h.WriteAt(w.data, w.off); err != nil {
			return fmt.Errorf("%s: %w", f.path, err)
		}
	}
	return nil
}

// cachedWrite is a write in a cache, numbered n in the machine's order.
type cachedWrite struct {
	n    int
	off  int64
	data []byte
}

// writeCache holds a file's writes not yet durable, oldest first.
type writeCache []cachedWrite

func (c *writeCache) add(n int, data []byte, off int64) {
	*c = append(*c, cachedWrite{n: n, off: off, data: data})
}

// overlay applies the cached writes to p, read from storage at off.
func (c writeCache) overlay(p []byte, off int64) {
	end := off + int64(len(p))
	for _, w := range c {
		wend := w.off + int64(len(w.data))
		if wend <= off || w.off >= end {
			continue
		}
		lo, hi := max(off, w.off), min(end, wend)
		copy(p[lo-off:hi-off], w.data[lo-w.off:hi-w.off])
	}
}

// supersede drops the cached bytes of [off, off+n): they were just
// written durably, and an older cached write landing at a crash must not
// bring them back. A write cut in two keeps its number in both pieces.
func (c *writeCache) supersede(off, n int64) {
	end := off + n
	var out writeCache
	for _, w := range *c {
		wend := w.off + int64(len(w.data))
		if wend <= off || w.off >= end {
			out = append(out, w)
			continue
		}
		if w.off < off {
			out = append(out, cachedWrite{n: w.n, off: w.off, data: w.data[:off-w.off]})
		}
		if wend > end {
			out = append(out, cachedWrite{n: w.n, off: end, data: w.data[end-w.off:]})
		}
	}
	*c = out
}

// take empties the cache and returns what it held, oldest first.
func (c *writeCache) take() []cachedWrite {
	out := *c
	*c = nil
	return out
}
