package block

// Moving a device's bytes to and from a plain file: a snapshot exported as
// an S3 object, a volume made from one. The bytes at device offset o are
// the file's bytes at offset o, and the destination is new (it reads
// zeroes everywhere), so ranges that hold no data are skipped and stay
// holes.
//
// The generic path reads and writes through the stack in user space, so
// every layer (crypt, checksum, stripe...) does its work. A layer whose
// data is, for some ranges, a plain file's bytes at the same offsets (file,
// and cow over its images) implements FileCopier and moves those ranges
// file to file inside the kernel: first by reflink (FICLONERANGE: the two
// files share the blocks, copy-on-write, no data moves — XFS, Btrfs,
// OCFS2), else by copy_file_range (an in-kernel copy, or a server-side one
// on NFS 4.2). A reflinked range is still two independent files: a write
// through one never changes the other.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// CopyReport says how the bytes of a CopyOut or CopyIn moved.
type CopyReport struct {
	// Bytes is the length covered; DataBytes of them held data (the rest
	// were holes or zeroes and stay holes).
	Bytes     int64 `json:"bytes"`
	DataBytes int64 `json:"data_bytes"`
	// Of DataBytes: shared by reflink, copied inside the kernel, and
	// copied through user space.
	ClonedBytes int64 `json:"cloned_bytes"`
	KernelBytes int64 `json:"kernel_copied_bytes"`
	UserBytes   int64 `json:"user_copied_bytes"`
}

// FileCopier is implemented by layers that can move a range of their data
// to or from a plain file without passing it through user space. Both
// directions expect the destination to read zeroes in the range (a new
// file, a new volume) and leave the source's holes as holes there.
type FileCopier interface {
	CopyToFile(dst *os.File, off, n int64, r *CopyReport) error
	CopyFromFile(src *os.File, off, n int64, r *CopyReport) error
}

// copyStep is how much CopyOut and CopyIn move between progress reports.
const copyStep = 64 << 20

// CopyOut writes device l's first size bytes into dst (a new, empty file)
// and syncs it.
func CopyOut(l Device, dst *os.File, size int64, p Progress) (CopyReport, error) {
	r := CopyReport{Bytes: size}
	if err := dst.Truncate(size); err != nil {
		return r, fmt.Errorf("size %s: %w", dst.Name(), err)
	}
	for off := int64(0); off < size; {
		n := min(size-off, copyStep)
		if err := CopyRangeOut(l, dst, off, n, &r); err != nil {
			return r, err
		}
		off += n
		if p != nil {
			p(off, size)
		}
	}
	if err := dst.Sync(); err != nil {
		return r, fmt.Errorf("sync %s: %w", dst.Name(), err)
	}
	return r, nil
}

// CopyIn writes src's first size bytes into device l, which must be new
// (reading zeroes), and flushes it.
func CopyIn(l Device, src *os.File, size int64, p Progress) (CopyReport, error) {
	r := CopyReport{Bytes: size}
	for off := int64(0); off < size; {
		n := min(size-off, copyStep)
		if err := CopyRangeIn(l, src, off, n, &r); err != nil {
			return r, err
		}
		off += n
		if p != nil {
			p(off, size)
		}
	}
	return r, l.Flush()
}

// CopyRangeOut copies [off, off+n) of d into dst at the same offsets: by
// d's FileCopier if it has one, else through user space, skipping the
// ranges d reports as zero and blocks that read as zeroes.
func CopyRangeOut(d Device, dst *os.File, off, n int64, r *CopyReport) error {
	if fc, ok := d.(FileCopier); ok {
		return fc.CopyToFile(dst, off, n, r)
	}
	buf := make([]byte, min(n, 1<<20))
	return forData(d, off, n, func(off, n int64) error {
		for n > 0 {
			b := buf[:min(n, int64(len(buf)))]
			if err := d.ReadAt(b, off); err != nil {
				return fmt.Errorf("read at %d: %w", off, err)
			}
			if !allZero(b) {
				if _, err := dst.WriteAt(b, off); err != nil {
					return fmt.Errorf("write %s at %d: %w", dst.Name(), off, err)
				}
				r.DataBytes += int64(len(b))
				r.UserBytes += int64(len(b))
			}
			off, n = off+int64(len(b)), n-int64(len(b))
		}
		return nil
	})
}

// CopyRangeIn copies [off, off+n) of src into d at the same offsets: by
// d's FileCopier if it has one, else through user space, skipping src's
// holes and blocks of zeroes.
func CopyRangeIn(d Device, src *os.File, off, n int64, r *CopyReport) error {
	if fc, ok := d.(FileCopier); ok {
		return fc.CopyFromFile(src, off, n, r)
	}
	buf := make([]byte, min(n, 1<<20))
	return forFileData(src, off, n, func(off, n int64) error {
		for n > 0 {
			b := buf[:min(n, int64(len(buf)))]
			k, err := src.ReadAt(b, off)
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("read %s at %d: %w", src.Name(), off, err)
			}
			// Beyond src's end: zeroes, not what buf held from the read
			// before.
			clear(b[k:])
			if !allZero(b) {
				if err := d.WriteAt(b, off, false); err != nil {
					return fmt.Errorf("write at %d: %w", off, err)
				}
				r.DataBytes += int64(len(b))
				r.UserBytes += int64(len(b))
			}
			off, n = off+int64(len(b)), n-int64(len(b))
		}
		return nil
	})
}

// forData calls fn for the parts of [off, off+n) that d does not report as
// zero (all of it when d has no extents).
func forData(d Device, off, n int64, fn func(off, n int64) error) error {
	if !d.Capabilities().Extents {
		return fn(off, n)
	}
	end := off + n
	for off < end {
		ex, err := d.Extents(off, end-off)
		if err != nil {
			return fmt.Errorf("extents at %d: %w", off, err)
		}
		if len(ex) == 0 {
			// A broken answer (Device.Extents: at least one, none
			// empty): asked again, it would be asked for ever.
			return fmt.Errorf("extents at %d: no extent for %d bytes", off, end-off)
		}
		for _, e := range ex {
			if e.Length <= 0 {
				return fmt.Errorf("extents at %d: an extent of %d bytes", off, e.Length)
			}
			l := min(e.Length, end-off)
			if !e.Zero {
				if err := fn(off, l); err != nil {
					return err
				}
			}
			off += l
		}
	}
	return nil
}

// forFileData calls fn for the data ranges of f within [off, off+n), as
// SEEK_DATA/SEEK_HOLE find them (all of it where the file system cannot
// tell).
func forFileData(f *os.File, off, n int64, fn func(off, n int64) error) error {
	fd := int(f.Fd())
	end := off + n
	for off < end {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // a hole to the end of the file
		}
		if err != nil {
			return fn(off, end-off)
		}
		if data >= end {
			return nil
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil || hole > end {
			hole = end
		}
		if err := fn(data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copyPiece bounds what copyFileRange moves between two calls of its
// check: a writer that lost its lease stops within one piece.
const copyPiece = 4 << 20

// copyFileRange moves the data ranges of src within [off, off+n) to dst at
// the same offsets: reflink where possible, else copy_file_range, else
// read and write. check, if not nil, is asked before each piece (a
// reflink, or up to copyPiece bytes copied); its error ends the copy.
func copyFileRange(dst, src *os.File, off, n int64, r *CopyReport, check func() error) error {
	if check == nil {
		check = func() error { return nil }
	}
	return forFileData(src, off, n, func(off, n int64) error {
		r.DataBytes += n
		if err := check(); err != nil {
			return err
		}
		cloned, err := cloneRange(dst, src, off, n)
		r.ClonedBytes += cloned
		if err != nil {
			return err
		}
		off, n = off+cloned, n-cloned
		for n > 0 {
			if err := check(); err != nil {
				return err
			}
			soff, doff := off, off
			m, err := unix.CopyFileRange(int(src.Fd()), &soff, int(dst.Fd()), &doff, int(min(n, copyPiece)), 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil || m == 0 {
				break // not supported here (or src shorter): user space below
			}
			r.KernelBytes += int64(m)
			off, n = off+int64(m), n-int64(m)
		}
		for n > 0 {
			if err := check(); err != nil {
				return err
			}
			k := min(n, copyPiece)
			if _, err := io.Copy(io.NewOffsetWriter(dst, off), io.NewSectionReader(src, off, k)); err != nil {
				return fmt.Errorf("copy %s to %s at %d: %w", src.Name(), dst.Name(), off, err)
			}
			r.UserBytes += k
			off, n = off+k, n-k
		}
		return nil
	})
}

// cloneRange reflinks the block-aligned part of [off, off+n) from src to
// dst, returning how many bytes from off it shared (0 where the file
// system cannot: other file systems, across devices).
func cloneRange(dst, src *os.File, off, n int64) (int64, error) {
	const blk = 4096
	if off%blk != 0 {
		return 0, nil
	}
	m := n &^ (blk - 1)
	if m == 0 {
		return 0, nil
	}
	err := unix.IoctlFileCloneRange(int(dst.Fd()), &unix.FileCloneRange{
		Src_fd: int64(src.Fd()), Src_offset: uint64(off), Src_length: uint64(m), Dest_offset: uint64(off),
	})
	switch {
	case err == nil:
		return m, nil
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.EINVAL),
		errors.Is(err, unix.ENOTTY), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.ETXTBSY):
		return 0, nil
	}
	return 0, fmt.Errorf("reflink %s to %s at %d: %w", src.Name(), dst.Name(), off, err)
}

var zeroBlock = make([]byte, 64<<10)

func allZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroBlock))
		if !bytes.Equal(b[:n], zeroBlock[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// CopyToFile implements FileCopier.
func (d *File) CopyToFile(dst *os.File, off, n int64, r *CopyReport) error {
	if d.closed.Load() {
		return ErrClosed
	}
	if err := d.inRange(off, n); err != nil {
		return err
	}
	return copyFileRange(dst, d.f, off, n, r, nil)
}

// CopyFromFile implements FileCopier.
func (d *File) CopyFromFile(src *os.File, off, n int64, r *CopyReport) error {
	if err := d.inRange(off, n); err != nil {
		return err
	}
	if err := d.begin(); err != nil {
		return err
	}
	defer d.end()
	// Waited for as a whole by the fence's owner, and asked again before
	// each piece: a copy of many MiB must not go on for long after the
	// lease it was started under ran out.
	return copyFileRange(d.f, src, off, n, r, func() error {
		if err := d.begin(); err != nil {
			return err
		}
		d.end()
		return nil
	})
}
