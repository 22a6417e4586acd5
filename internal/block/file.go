package block

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// File is a Device over one (normally sparse) file. After Close every
// operation fails with ErrClosed (the descriptor number may already belong
// to another file: a late write must not land there).
//
// Durability: FUA writes use pwritev2(RWF_DSYNC), one system call; Flush is
// fdatasync. Because every handle of a file shares the kernel's page cache
// and fdatasync covers the whole inode, MultiConn is true.
type File struct {
	f        *os.File
	fd       int
	size     atomic.Int64
	readOnly bool
	closed   atomic.Bool
	dsync    atomic.Bool // pwritev2(RWF_DSYNC) works here
	noWait   atomic.Bool // preadv2(RWF_NOWAIT) works here
	splice   atomic.Bool // splice(2) from this file works
	spliceIn atomic.Bool // splice(2) into this file works
	cstat    atomic.Bool // cachestat(2) works here
	fence    Fence
	dir      string // the file's directory (storeReadOnly's probe)
}

// SetFence makes every later write, zeroing, trim, resize and flush
// enter fence (Env.Fence).
func (d *File) SetFence(fence Fence) { d.fence = fence }

// begin fails when the device is closed, read-only or fenced; else the
// write may go on, and end must be called once its system calls are done.
func (d *File) begin() error {
	if d.closed.Load() {
		return ErrClosed
	}
	if d.readOnly {
		return ErrReadOnly
	}
	if d.fence != nil {
		return d.fence.Enter()
	}
	return nil
}

// end ends a write begin let through.
func (d *File) end() {
	if d.fence != nil {
		d.fence.Exit()
	}
}

// OpenFile opens path as a device; readOnly opens it O_RDONLY.
func OpenFile(path string, readOnly bool) (*File, error) {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("open device %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	d := &File{f: f, fd: int(f.Fd()), readOnly: readOnly, dir: filepath.Dir(path)}
	d.size.Store(st.Size())
	d.dsync.Store(true)
	d.noWait.Store(true)
	d.splice.Store(true)
	d.spliceIn.Store(true)
	d.cstat.Store(true)
	return d, nil
}

// Size implements Device.
func (d *File) Size() int64 { return d.size.Load() }

// Resize grows the file to n bytes (sparse) and syncs the new size.
func (d *File) Resize(n int64) error {
	if err := d.begin(); err != nil {
		return err
	}
	defer d.end()
	if n < d.size.Load() {
		return fmt.Errorf("resize: cannot shrink from %d to %d bytes", d.size.Load(), n)
	}
	if err := d.f.Truncate(n); err != nil {
		return fmt.Errorf("resize: %w", err)
	}
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("resize: %w", err)
	}
	d.size.Store(n)
	return nil
}

// Capabilities implements Device.
func (d *File) Capabilities() Capabilities {
	return Capabilities{ReadOnly: d.readOnly, Flush: true, FUA: true, Trim: true, WriteZeroes: true,
		FastZero: true, Extents: true, MultiConn: true}
}

// ReadAt implements Device.
func (d *File) ReadAt(p []byte, off int64) error {
	return d.ReadAtV([][]byte{p}, off)
}

// ReadAtV implements VectorReader: preadv, going on after short reads;
// what lies beyond the end of a file shorter than its device reads as
// zeroes.
func (d *File) ReadAtV(bufs [][]byte, off int64) error {
	if d.closed.Load() {
		return ErrClosed
	}
	if err := d.inRange(off, vlen(bufs)); err != nil {
		return err
	}
	rest, err := transfer(bufs, off, func(batch [][]byte, off int64) (int, error) {
		if len(batch) == 1 {
			return unix.Pread(d.fd, batch[0], off)
		}
		return unix.Preadv(d.fd, batch, off)
	})
	if err != nil {
		return fmt.Errorf("read at %d: %w", off, err)
	}
	for _, b := range rest { // beyond EOF of a file shorter than its device: zeroes
		clear(b)
	}
	return nil
}

// TryReadAt implements NoWaitReader: preadv2 with RWF_NOWAIT, which reads
// only what the page cache holds. A short read (part of the range is not
// cached, or the file ends) is left to ReadAt; so is everything on a file
// system that does not support the flag.
func (d *File) TryReadAt(p []byte, off int64) bool {
	return d.TryReadAtV([][]byte{p}, off)
}

// TryReadAtV implements VectorReader: TryReadAt into several buffers (at
// most iovMax of them; more are left to ReadAtV).
func (d *File) TryReadAtV(bufs [][]byte, off int64) bool {
	total := vlen(bufs)
	if !d.noWait.Load() || d.closed.Load() || len(bufs) > iovMax || d.inRange(off, total) != nil {
		return false
	}
	n, err := rawPreadv2(d.fd, bufs, off)
	if err == unix.EOPNOTSUPP || err == unix.EINVAL {
		d.noWait.Store(false)
	}
	return err == nil && int64(n) == total
}

// vlen is the number of bytes in bufs.
func vlen(bufs [][]byte) int64 {
	n := int64(0)
	for _, b := range bufs {
		n += int64(len(b))
	}
	return n
}

// inRange refuses a request of n bytes at off that does not lie inside
// the device (block.Device): a write there would grow the file.
func (d *File) inRange(off, n int64) error {
	if err := CheckRange(off, n, d.size.Load()); err != nil {
		return fmt.Errorf("file: %w", err)
	}
	return nil
}

// SpliceTo implements Splicer: splice(2) from the file into the pipe. It
// stops short at the end of a file shorter than its device (ReadAt gives
// the zeroes beyond). With nowait it first asks the page cache
// (cachestat(2), Linux 6.5) whether it holds the whole range, and moves
// nothing if not or if it cannot tell (pages evicted between the two calls
// are read from the device: rare, and only a delay). A file system that
// cannot splice is found out once.
func (d *File) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	if !d.splice.Load() || d.closed.Load() || d.inRange(off, int64(n)) != nil || (nowait && !d.cached(off, n)) {
		return 0
	}
	// (EAGAIN: a non-blocking pipe is full; what is left is ReadAt's.)
	return spliceAll(&d.splice, off, n, func(o *int64, m int) (int64, error) {
		return unix.Splice(d.fd, o, pipe, nil, m, unix.SPLICE_F_MOVE)
	})
}

var _ Splicer = (*File)(nil)

// SpliceFrom implements SpliceWriter: splice(2) from the pipe into the
// file. A file system that cannot is found out once.
func (d *File) SpliceFrom(pipe int, off int64, n int) int {
	if !d.spliceIn.Load() || d.inRange(off, int64(n)) != nil || d.begin() != nil {
		return 0
	}
	defer d.end()
	return spliceAll(&d.spliceIn, off, n, func(o *int64, m int) (int64, error) {
		return unix.Splice(pipe, nil, d.fd, o, int(pieceEnd(*o, int64(m))-*o), unix.SPLICE_F_MOVE)
	})
}

// spliceAll calls one — one splice(2) of up to m bytes at file offset o —
// until n bytes from off have moved, or one moves none or fails, and
// returns the bytes moved. An error saying the file cannot splice this way
// turns works off.
func spliceAll(works *atomic.Bool, off int64, n int, one func(o *int64, m int) (int64, error)) int {
	moved := 0
	for moved < n {
		o := off + int64(moved)
		k, err := one(&o, n-moved)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EINVAL || err == unix.ENOSYS || err == unix.EOPNOTSUPP {
			works.Store(false)
		}
		if err != nil || k == 0 {
			break
		}
		moved += int(k)
	}
	return moved
}

var _ SpliceWriter = (*File)(nil)

// cached reports whether the page cache holds all of [off, off+n).
func (d *File) cached(off int64, n int) bool {
	if !d.cstat.Load() {
		return false
	}
	page := int64(os.Getpagesize())
	first, end := off/page, (off+int64(n)+page-1)/page
	r := unix.CachestatRange{Off: uint64(first * page), Len: uint64((end - first) * page)}
	var st unix.Cachestat_t
	if err := unix.Cachestat(uint(d.fd), &r, &st, 0); err != nil {
		if err == unix.ENOSYS || err == unix.EOPNOTSUPP {
			d.cstat.Store(false)
		}
		return false
	}
	return int64(st.Cache) >= end-first
}

// WriteAt implements Device.
func (d *File) WriteAt(p []byte, off int64, fua bool) error {
	return d.WriteAtV([][]byte{p}, off, fua)
}

// WriteAtV implements VectorWriter: pwritev, or pwritev2 with RWF_DSYNC
// for FUA.
func (d *File) WriteAtV(bufs [][]byte, off int64, fua bool) error {
	if err := d.inRange(off, vlen(bufs)); err != nil {
		return err
	}
	if err := d.begin(); err != nil {
		return err
	}
	defer d.end()
	if fua && d.dsync.Load() {
		err := d.pwrite(bufs, off, unix.RWF_DSYNC)
		if err == nil {
			return d.linked()
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
			return err
		}
		d.dsync.Store(false) // an old kernel or file system: write then sync
	}
	if err := d.pwrite(bufs, off, 0); err != nil {
		return err
	}
	if fua {
		return d.Flush()
	}
	return nil
}

// iovMax is the most buffers one pwritev takes (IOV_MAX on Linux).
const iovMax = 1024

// pwrite writes bufs from off.
func (d *File) pwrite(bufs [][]byte, off int64, flags int) error {
	rest, err := transfer(bufs, off, func(batch [][]byte, off int64) (int, error) {
		switch {
		case flags != 0:
			return unix.Pwritev2(d.fd, batch, off, flags)
		case len(batch) == 1:
			b := batch[0]
			return unix.Pwrite(d.fd, b[:pieceEnd(off, int64(len(b)))-off], off)
		default:
			return unix.Pwritev(d.fd, piece(batch, off), off)
		}
	})
	if err == nil && len(rest) > 0 {
		err = io.ErrShortWrite // no byte written and no error: never from a file
	}
	if err != nil {
		return d.refused(fmt.Errorf("write at %d: %w", off, err))
	}
	return nil
}

// writePiece bounds a buffered write system call: every write (and
// splice) into the file is issued in pieces that end at multiples of
// writePiece in the file. The kernel sizes the page-cache folio a write
// creates by the write's length, and ext4 (large folios since Linux 6.16,
// through buffer heads) then walks every block of that folio for each
// later small write into it: measured here, a 4 KiB write into a file
// filled by 1 MiB writes cost 17–27 µs of kernel time, 8 µs when filled
// by 256 KiB writes, 2.4 µs by 4 KiB ones; sequential 1 MiB overwrites
// and reads ran as fast over 256 KiB folios as over 1 MiB ones, 10–30 %
// slower over 64 KiB. Guests write images sequentially (installs,
// imports, copies) and then at random, so the random writes pay for the
// fill's folios for as long as the pages stay cached. Four system calls
// per MiB cost nothing against that; other file systems (iomap-based XFS,
// network file systems that gather pages at write-back) do not mind.
// FUA writes (RWF_DSYNC) are not cut: each piece would be synced alone.
const writePiece = 256 << 10

// pieceEnd is where a write of n bytes at off stops: at off+n or the next
// multiple of writePiece, whichever comes first.
func pieceEnd(off, n int64) int64 {
	return min(off+n, (off/writePiece+1)*writePiece)
}

// piece returns the start of batch that a write at off stops after
// (pieceEnd). It copies the slice only to cut a buffer in it.
func piece(batch [][]byte, off int64) [][]byte {
	room := pieceEnd(off, writePiece) - off
	for i, b := range batch {
		if int64(len(b)) < room {
			room -= int64(len(b))
			continue
		}
		if int64(len(b)) == room {
			return batch[:i+1]
		}
		out := slices.Clone(batch[:i+1])
		out[i] = b[:room]
		return out
	}
	return batch
}

// refused marks err, from a write to the file, with ErrStoreReadOnly when
// it is EROFS and the file system as a whole refuses writes: a file cannot
// be created beside this one either. A parallel file system can refuse the
// files of one storage target with EROFS while the rest of it takes
// writes; that is this file's failure, not the store's (StoreRefused).
func (d *File) refused(err error) error {
	if !errors.Is(err, unix.EROFS) {
		return err
	}
	f, perr := os.CreateTemp(d.dir, ".rocheck-*")
	if perr == nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if errors.Is(perr, unix.EROFS) {
		return fmt.Errorf("%w: %w", ErrStoreReadOnly, err)
	}
	return err
}

// transfer runs op (one pread- or pwrite-like call) over bufs from off,
// at most iovMax buffers a call, going on after short transfers and
// EINTR. It returns the buffers not reached when op moved nothing (the
// end of a file, for reads).
func transfer(bufs [][]byte, off int64, op func(batch [][]byte, off int64) (int, error)) ([][]byte, error) {
	owned := false
	for len(bufs) > 0 {
		if len(bufs[0]) == 0 {
			bufs = bufs[1:]
			continue
		}
		n, err := op(bufs[:min(len(bufs), iovMax)], off)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return bufs, err
		}
		off += int64(n)
		bufs = consume(bufs, n, &owned)
	}
	return nil, nil
}

// consume drops the first n bytes of bufs. A buffer cut in the middle is
// cut in a copy of bufs (then *owned is set): the caller's slice is not
// ours to change.
func consume(bufs [][]byte, n int, owned *bool) [][]byte {
	for n > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if n > 0 {
		if !*owned {
			bufs, *owned = slices.Clone(bufs), true
		}
		bufs[0] = bufs[0][n:]
	}
	return bufs
}

// WriteZeroes implements Device: a punched hole unless NoHole, else a
// zeroed allocated range (FALLOC_FL_ZERO_RANGE); both are metadata
// operations, hence fast. Without fallocate support it writes zeroes, or
// with Fast refuses.
func (d *File) WriteZeroes(off, length int64, f ZeroFlags) error {
	if err := d.inRange(off, length); err != nil {
		return err
	}
	if err := d.begin(); err != nil {
		return err
	}
	defer d.end()
	if length == 0 {
		return nil // fallocate refuses a zero length (EINVAL); nothing to do
	}
	mode := uint32(unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE)
	if f.NoHole {
		mode = unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE
	}
	err := unix.Fallocate(d.fd, mode, off, length)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		if f.Fast {
			return ErrNotSupported
		}
		err = d.writeZeroBuffers(off, length)
	} else if err != nil {
		err = d.refused(fmt.Errorf("zero %d+%d: %w", off, length, err))
	}
	if err == nil && f.FUA {
		err = d.Flush()
	}
	return err
}

// writeZeroBuffers writes zeroes over [off, off+length) in buffers of up
// to 1 MiB. Its caller entered the fence once; the fence is asked again
// before every buffer after the first, as a copy asks before every piece
// (CopyFromFile): a range of gigabytes must not go on being written long
// after the lease it was started under ran out.
func (d *File) writeZeroBuffers(off, length int64) error {
	buf := make([]byte, min(length, 1<<20))
	for first := true; length > 0; first = false {
		if !first {
			if err := d.begin(); err != nil {
				return err
			}
			d.end()
		}
		n := min(length, int64(len(buf)))
		if err := d.pwrite([][]byte{buf[:n]}, off, 0); err != nil {
			return err
		}
		off, length = off+n, length-n
	}
	return nil
}

// Trim implements Device by punching a hole.
func (d *File) Trim(off, length int64, fua bool) error {
	if err := d.inRange(off, length); err != nil {
		return err
	}
	if err := d.begin(); err != nil {
		return err
	}
	defer d.end()
	if length == 0 {
		return nil // fallocate refuses a zero length (EINVAL); nothing to do
	}
	err := unix.Fallocate(d.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return nil // trim is advisory
	}
	if err != nil {
		return d.refused(fmt.Errorf("trim %d+%d: %w", off, length, err))
	}
	if fua {
		return d.Flush()
	}
	return nil
}

// Flush implements Device.
func (d *File) Flush() error {
	if d.closed.Load() {
		return ErrClosed
	}
	if d.readOnly {
		return nil
	}
	if d.fence != nil {
		if err := d.fence.Enter(); err != nil {
			return err
		}
		defer d.fence.Exit()
	}
	if err := unix.Fdatasync(d.fd); err != nil {
		return d.refused(fmt.Errorf("flush: %w", err))
	}
	return d.linked()
}

// linked fails with ErrUnlinked once the file has no name left: writes to
// it still succeed but vanish at Close, so nothing may be called durable
// (a mirror then fails the leg instead of trusting it).
func (d *File) linked() error {
	var st unix.Stat_t
	if err := unix.Fstat(d.fd, &st); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	if st.Nlink == 0 {
		return ErrUnlinked
	}
	return nil
}

// Extents implements Device with SEEK_DATA/SEEK_HOLE. Holes read as zero.
func (d *File) Extents(off, length int64) ([]Extent, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if err := d.inRange(off, length); err != nil {
		return nil, err
	}
	end := off + length
	var out []Extent
	for tries := 0; off < end && len(out) < 1024; tries++ {
		if tries == 4096 {
			// Data found and punched again at every look (below): the
			// rest reported as data, which is never wrong.
			return AppendExtent(out, Extent{Length: end - off}), nil
		}
		data, err := unix.Seek(d.fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // only a hole until EOF
			out = append(out, Extent{Length: end - off, Hole: true, Zero: true})
			break
		}
		if err != nil {
			return []Extent{{Length: length}}, nil // unknown: report allocated
		}
		if data > off {
			n := min(data, end) - off
			out = append(out, Extent{Length: n, Hole: true, Zero: true})
			off += n
			continue
		}
		hole, err := unix.Seek(d.fd, off, unix.SEEK_HOLE)
		if err != nil {
			hole = end
		}
		if hole <= off {
			// The data SEEK_DATA found at off was punched (a trim or
			// write-zeroes running beside this query) before SEEK_HOLE
			// looked: look again rather than report an extent of no
			// bytes, which breaks the contract (an NBD client gets
			// "unknown" for the range, a layer above an empty extent).
			continue
		}
		n := min(hole, end) - off
		out = append(out, Extent{Length: n})
		off += n
	}
	return out, nil
}

// Close implements Device.
func (d *File) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	return d.f.Close()
}

// rawPreadv2 is preadv2(RWF_NOWAIT) as a raw system call. The flag makes
// the call return rather than wait for the device, so the runtime's
// bookkeeping for a call that may block (unix.Preadv2 enters and leaves
// the "syscall" state, and wakes the runtime's monitor thread after an
// idle spell) is pure cost on the NBD server's hottest path: a 4 KiB read
// answered from the page cache (bench/RESULTS.md, 2026-11-27).
func rawPreadv2(fd int, bufs [][]byte, off int64) (int, error) {
	if len(bufs) == 0 {
		return 0, nil
	}
	var small [4]unix.Iovec // no allocation for the usual one buffer
	iov := small[:]
	if len(bufs) > len(small) {
		iov = make([]unix.Iovec, len(bufs))
	}
	iov = iov[:len(bufs)]
	for i, b := range bufs {
		if len(b) > 0 {
			iov[i].Base = &b[0]
			iov[i].SetLen(len(b))
		}
	}
	// (On 64-bit Linux the offset's high half, the fifth argument, is
	// ignored: the fourth holds all of it.)
	n, _, e := unix.RawSyscall6(unix.SYS_PREADV2, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)), uintptr(off), 0, unix.RWF_NOWAIT)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
