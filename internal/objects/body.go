package objects

import (
	"os"

	"golang.org/x/sys/unix"
)

// A PUT syncs its body before it answers. Written through the page cache
// and synced only at the end, the body's whole write-back would start at
// the fsync, and the request would wait for all of it. So each piece of a
// body of writeBehindMin bytes or more has its write-back started as soon
// as it is written (sync_file_range SYNC_FILE_RANGE_WRITE, RocksDB's
// bytes_per_sync): the device works while the rest arrives and the MD5 is
// finished, and the fsync waits only for what is left. The pages stay in
// the cache in the large folios the writes made, so a GET soon after is
// served from them cheaply.
//
// O_DIRECT writes were measured first: the same gain for PUTs, but an
// object written so is cached later by readahead, in small folios, and a
// cached 1 MiB read of it cost 2.4 times the CPU (bench/RESULTS.md,
// session 17).

// writeBehindMin: a smaller body is synced at the end only (its write-back
// would start just before the fsync anyway).
const writeBehindMin = 256 << 10

// bodyFile is the temp file a request body is written to, in order.
type bodyFile struct {
	f      *os.File
	off    int64 // bytes written
	behind bool  // start each piece's write-back once written
}

// newBodyFile returns the writer for a body of length bytes (nil: unknown)
// going to f.
func newBodyFile(f *os.File, length *int64) *bodyFile {
	return &bodyFile{f: f, behind: length == nil || *length >= writeBehindMin}
}

// Write appends p, then starts its write-back. That is advice: where the
// file system refuses it, the file's fsync still does all the work.
func (w *bodyFile) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	if w.behind && n > 0 && w.startWriteBack(w.off, int64(n)) != nil {
		w.behind = false
	}
	w.off += int64(n)
	return n, err
}

// startWriteBack starts writing n bytes at off of the file to the device
// and returns without waiting.
func (w *bodyFile) startWriteBack(off, n int64) error {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SyncFileRange(int(fd), off, n, unix.SYNC_FILE_RANGE_WRITE)
	}); err != nil {
		return err
	}
	return serr
}
