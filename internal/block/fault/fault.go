// Package fault is for crash tests of layer metadata: an in-memory file
// that "crashes" at a chosen write, optionally tearing it, so a test can
// stop an update at every point it writes and check what a restart reads.
//
// Tests count the writes an update makes with a File that never crashes
// (Writes), then replay the update once per write index k with CrashAt = k,
// reopen from Image() and assert the invariant.
package fault

import (
	"errors"
	"sync"
)

// ErrCrashed is returned by every call after the crash.
var ErrCrashed = errors.New("fault: crashed")

// File is an in-memory file. The zero value is an empty file that crashes
// at its first write (CrashAt 0); one that never crashes has CrashAt -1
// (New(nil, -1, nil)).
type File struct {
	mu   sync.Mutex
	data []byte
	// CrashAt is the index (from 0) of the write that crashes; negative:
	// never. The crashing write lands only the bytes Tear selects.
	CrashAt int
	// Tear selects which bytes of the crashing write land (nil: none).
	Tear    func(i int) bool
	writes  int
	crashed bool
	// Synced counts successful Syncs.
	Synced int
}

// New returns a file holding a copy of data that crashes at write crashAt.
func New(data []byte, crashAt int, tear func(int) bool) *File {
	return &File{data: append([]byte(nil), data...), CrashAt: crashAt, Tear: tear}
}

// ReadAt reads; bytes beyond the end read as zero.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(p)
	if off < int64(len(f.data)) {
		copy(p, f.data[off:])
	}
	return len(p), nil
}

// WriteAt writes, or crashes.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.crashed {
		return 0, ErrCrashed
	}
	crash := f.CrashAt >= 0 && f.writes == f.CrashAt
	f.writes++
	if need := int(off) + len(p); need > len(f.data) {
		f.data = append(f.data, make([]byte, need-len(f.data))...)
	}
	if crash {
		f.crashed = true
		for i := range p {
			if f.Tear != nil && f.Tear(i) {
				f.data[int(off)+i] = p[i]
			}
		}
		return 0, ErrCrashed
	}
	copy(f.data[off:], p)
	return len(p), nil
}

// Land applies the bytes of p that tear selects (nil: none) without
// counting a write: how a torn write looks afterwards.
func (f *File) Land(p []byte, off int64, tear func(int) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if need := int(off) + len(p); need > len(f.data) {
		f.data = append(f.data, make([]byte, need-len(f.data))...)
	}
	for i := range p {
		if tear != nil && tear(i) {
			f.data[int(off)+i] = p[i]
		}
	}
}

// Sync succeeds until the crash.
func (f *File) Sync() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.crashed {
		return ErrCrashed
	}
	f.Synced++
	return nil
}

// Close does nothing (the image stays readable).
func (f *File) Close() error { return nil }

// Writes is the number of writes attempted so far.
func (f *File) Writes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes
}

// Crashed reports whether the crash happened.
func (f *File) Crashed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.crashed
}

// Image is a copy of the file's bytes: what a restart would read.
func (f *File) Image() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]byte(nil), f.data...)
}

// Half tears a write so that its first half lands.
func Half(n int) func(int) bool { return func(i int) bool { return i < n/2 } }
