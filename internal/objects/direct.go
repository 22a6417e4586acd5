package objects

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Large bodies are written around the page cache (O_DIRECT). A PUT syncs
// its data before it answers anyway; through the cache the same bytes
// cost a copy into it and the write-back's work on every page at the
// sync, about a third of the CPU of writing and syncing 1 MiB here
// (bench/RESULTS.md, session 17), and they then sit in memory the
// gateway will not read soon. The sync after a direct write still
// matters: it makes the file's size and blocks durable, and flushes the
// device's cache.
//
// Only whole, aligned blocks go direct. A body's last partial block, a
// buffer that is not aligned, and every body on a file system that
// refuses O_DIRECT (tmpfs, some FUSE file systems) are written through
// the cache, from then on for that file: the two kinds of write never
// touch the same block.

// directAlign: O_DIRECT offsets, lengths and buffer addresses are
// multiples of it. The page size covers any logical block size, and
// Lustre asks for whole pages (64 KiB on some ppc64le and arm64 hosts).
var directAlign = max(4096, os.Getpagesize())

// directMin: smaller bodies go through the cache (for them the direct
// write's wait costs more than the copy it saves).
const directMin = 256 << 10

// alignedBuf returns n bytes starting on a directAlign boundary.
func alignedBuf(n int) []byte {
	b := make([]byte, n+directAlign)
	off := (directAlign - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(directAlign))) % directAlign
	return b[off : off+n : off+n]
}

// bodyFile is the temp file a request body is written to.
type bodyFile struct {
	f      *os.File
	b      *Backend
	direct bool
}

// bodyFile returns the writer for a body of length bytes (nil: unknown)
// going to f, direct if the body is big enough and the store allows it.
func (b *Backend) bodyFile(f *os.File, length *int64) *bodyFile {
	w := &bodyFile{f: f, b: b}
	if length != nil && *length >= directMin && !b.noDirect.Load() {
		if err := setDirect(f, true); err != nil {
			b.refuseDirect(err)
		} else {
			w.direct = true
		}
	}
	return w
}

// Write writes p at the end of the file: its whole aligned blocks
// direct while the file is direct, the rest through the cache.
func (w *bodyFile) Write(p []byte) (int, error) {
	done := 0
	if w.direct {
		if n := len(p) &^ (directAlign - 1); n > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(p)))%uintptr(directAlign) == 0 {
			k, err := w.f.Write(p[:n])
			done = k
			if err != nil && !(k == 0 && errors.Is(err, syscall.EINVAL)) {
				return done, err
			}
			if err != nil {
				w.b.refuseDirect(err)
			}
		}
		if done < len(p) {
			w.direct = false
			if err := setDirect(w.f, false); err != nil {
				return done, fmt.Errorf("clear O_DIRECT: %w", err)
			}
		}
	}
	k, err := w.f.Write(p[done:])
	return done + k, err
}

// refuseDirect records that the store's file system refused O_DIRECT:
// every later body goes through the page cache.
func (b *Backend) refuseDirect(err error) {
	if !b.noDirect.Swap(true) {
		b.log.Info("object store: writing bodies through the page cache (no O_DIRECT)", "err", err)
	}
}

// setDirect turns O_DIRECT on or off for f.
func setDirect(f *os.File, on bool) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	err = rc.Control(func(fd uintptr) {
		var fl int
		if fl, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0); ferr != nil {
			return
		}
		if on {
			fl |= unix.O_DIRECT
		} else {
			fl &^= unix.O_DIRECT
		}
		_, ferr = unix.FcntlInt(fd, unix.F_SETFL, fl)
	})
	if err != nil {
		return err
	}
	return ferr
}
