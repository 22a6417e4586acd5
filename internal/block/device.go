// Package block defines the block device interface every basalt data path
// speaks: the NBD server serves a Device, and layers (later) are Devices
// built on Devices.
//
// Contract, for every implementation:
//   - Offsets and lengths are bytes. A request reaching beyond Size(),
//     starting before 0 or of negative length is refused with
//     ErrOutOfRange (CheckRange) and touches nothing: the NBD server
//     checks first, but a layer's other callers (jobs, copies, the layers
//     above) are code too, and one bad offset must be an error, never a
//     panic of the whole server or bytes written where no read finds them.
//   - An operation a device does not declare in Capabilities returns
//     ErrNotSupported; a device never silently ignores one.
//   - WriteAt with fua=true, and any operation followed by a successful
//     Flush, is on stable storage before it returns.
//   - Devices are safe for concurrent use; ordering between overlapping
//     concurrent operations is the caller's business (as with a disk).
package block

import (
	"errors"
	"fmt"
	"syscall"
)

// Capabilities declares what a device supports. The NBD server advertises
// exactly these.
type Capabilities struct {
	ReadOnly    bool
	Flush       bool // Flush makes earlier completed writes durable
	FUA         bool // WriteAt(fua) is durable on return
	Trim        bool
	WriteZeroes bool
	// FastZero: WriteZeroes with ZeroFast either completes faster than a
	// write of zeroes would, or fails with ErrNotSupported at once.
	FastZero bool
	Extents  bool // Extents reports holes and zero ranges
	// MultiConn: Flush through one handle covers writes completed
	// through every handle of the same device (NBD CAN_MULTI_CONN).
	MultiConn bool
}

// ZeroFlags modify WriteZeroes.
type ZeroFlags struct {
	NoHole bool // keep the range allocated
	Fast   bool // fail with ErrNotSupported rather than be slow
	FUA    bool
}

// Extent describes a range's allocation.
type Extent struct {
	Length int64
	Hole   bool // not allocated
	Zero   bool // reads as zeroes
}

// Device is a block device.
type Device interface {
	Size() int64
	Capabilities() Capabilities
	ReadAt(p []byte, off int64) error
	WriteAt(p []byte, off int64, fua bool) error
	WriteZeroes(off, length int64, f ZeroFlags) error
	Trim(off, length int64, fua bool) error
	Flush() error
	// Extents describes [off, off+length) as consecutive extents starting
	// at off; the last may end before off+length (callers ask again) but
	// there is at least one, and none is empty. A length of 0 has nothing
	// to describe: the answer is no extents and no error (an extent of no
	// bytes would be one a caller walking the answer never gets past, and
	// the NBD server takes one for a broken device), whether or not the
	// device declares Extents.
	Extents(off, length int64) ([]Extent, error)
	Close() error
}

// MaxSize bounds the size of every device a layer builds or grows to: far
// beyond any volume (4 EiB), and small enough that the arithmetic layers
// do on offsets and sizes (off+n, rounding up to a chunk, a share times
// the number of children) cannot overflow int64. Layers that combine
// their children's sizes refuse a result beyond it rather than wrap.
const MaxSize = 1 << 62

// CheckRange refuses a request of n bytes at off on a device of size
// bytes that does not lie inside it, with ErrOutOfRange. It cannot
// overflow: off+n is never computed.
func CheckRange(off, n, size int64) error {
	if off < 0 || n < 0 || off > size-n {
		return fmt.Errorf("%d+%d beyond %d: %w", off, n, size, ErrOutOfRange)
	}
	return nil
}

// Errors with a meaning the NBD server maps to its error values.
var (
	ErrNotSupported = errors.New("operation not supported by this device")
	ErrReadOnly     = errors.New("device is read-only")
	ErrOutOfRange   = errors.New("range beyond the end of the device")
	ErrClosed       = errors.New("device is closed")
	ErrUnlinked     = errors.New("backing file was removed while open; nothing written since is durable")
	// ErrStoreReadOnly marks an EROFS that the whole file system gives,
	// not one file of it (File finds which: StoreRefused).
	ErrStoreReadOnly = errors.New("the file system is read-only")
	// ErrFenced: this node may no longer write the device (it lost the
	// volume's write lease to another node); see Env.Fence.
	ErrFenced = errors.New("write fenced: this node no longer holds the volume's write lease")
)

// StoreRefused reports whether err is the refusal of the file system under
// a device as a whole rather than a fault of the device: no space or
// quota left (ENOSPC, EDQUOT), or a file system turned read-only
// (ErrStoreReadOnly: ext4 remounts itself so after an error). Redundant
// layers do not fail a leg for it: their legs share that file system,
// nothing is wrong with the leg, and failing it would leave every
// redundant volume on the store degraded (and a parity volume, with two
// legs failed, unreadable) until repaired. A bare EROFS — one storage
// target of a parallel file system refusing its files' writes — is the
// leg's failure. A write fence's refusal (ErrFenced) is one too: the
// fence refuses every leg alike, and only for a while when the node's
// lease of the metadata cluster went unrenewed but did not expire (a
// renewal then lets writes through again, on the same open stack).
func StoreRefused(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, ErrStoreReadOnly) ||
		errors.Is(err, ErrFenced)
}

// NoWaitReader is implemented by devices that can sometimes serve a read
// without waiting — for a file, when the range is in the page cache. The
// NBD server tries it in the goroutine that reads requests, so a cached
// read is answered without a hand-off to another goroutine, and the
// replies of a burst of such reads leave in one write.
//
// A layer offers it only by implementing it itself: wrappers that embed a
// Device interface do not promote it, so a layer that does not know about
// it never passes it through (it then simply is not offered).
type NoWaitReader interface {
	// TryReadAt fills p from off and returns true if it could do so at
	// once: without waiting for I/O, and without waiting for a lock that
	// another operation holds. false promises nothing about p: the
	// caller reads with ReadAt, which also meets and reports any error
	// (TryReadAt reports none).
	TryReadAt(p []byte, off int64) bool
}

// Splicer is implemented by devices that can move a range's bytes into a
// pipe straight from the page cache (splice(2)), for the NBD server to
// move on into the client's socket: a big read then reaches the client
// without being copied through a buffer in between (bench/RESULTS.md,
// session 18: 1 MiB reads over loopback TCP took 380–395 µs of the
// server's CPU per MiB copied through a buffer, 157–183 spliced). Only a
// layer whose bytes lie as they are in a file can: never a cipher, never
// one that must verify them first. As with NoWaitReader, a layer offers it
// only by implementing it itself.
type Splicer interface {
	// SpliceTo moves up to n bytes of the device from off into the pipe
	// whose write end is pipe, which has room for the pages they span
	// (a pipe holds whole pages), and returns how
	// many it moved: the bytes from off on, the rest (from off+moved)
	// being the caller's to read with ReadAt, which also meets and reports
	// any error (SpliceTo reports none). With nowait it moves only what it
	// can without waiting for I/O or for a lock another operation holds.
	SpliceTo(pipe int, off int64, n int, nowait bool) int
}

// SpliceWriter is implemented by devices that can take a write's bytes
// from a pipe straight into the page cache (splice(2)): the NBD server
// moves a big write's payload from the client's socket into a pipe
// (references to the received pages, no copy) and the device moves it on,
// so the bytes are copied once instead of into a buffer first. Like
// Splicer, only a layer whose bytes lie as they are in a file can, and a
// layer offers it only by implementing it itself.
type SpliceWriter interface {
	// SpliceFrom writes up to n bytes at off, taking them in order from
	// the pipe whose read end is pipe, which holds at least n bytes, and
	// returns how many it took, all of them written (as by WriteAt
	// without FUA). The rest stay in the pipe, in order: the caller reads
	// them and writes them with WriteAt, which also meets and reports any
	// error (SpliceFrom reports none).
	SpliceFrom(pipe int, off int64, n int) int
}

// SpliceFrom is d's SpliceFrom when d offers it, else 0.
func SpliceFrom(d Device, pipe int, off int64, n int) int {
	if s, ok := d.(SpliceWriter); ok {
		return s.SpliceFrom(pipe, off, n)
	}
	return 0
}

// SpliceMinPiece: a layer that splits a range into pieces on its
// children (stripe units, parity chunks) splices only pieces of at least
// this size; with smaller ones a big read or write would take a system
// call per few KiB, and copying it costs less.
const SpliceMinPiece = 64 << 10

// SpliceTo is d's SpliceTo when d offers it, else 0.
func SpliceTo(d Device, pipe int, off int64, n int, nowait bool) int {
	if s, ok := d.(Splicer); ok {
		return s.SpliceTo(pipe, off, n, nowait)
	}
	return 0
}

// VectorWriter is implemented by devices that take one write given in
// several buffers, for consecutive bytes from off, in one call — for a
// file, one pwritev instead of a pwrite per buffer, which the kernel
// copies into the page cache as one write. A layer that splits requests
// (stripe) hands each child its pieces that way. As with NoWaitReader, a
// layer offers it only by implementing it itself.
type VectorWriter interface {
	// WriteAtV is WriteAt of the buffers' concatenation.
	WriteAtV(bufs [][]byte, off int64, fua bool) error
}

// WriteAtV writes bufs to d at consecutive offsets from off: in one call
// when d offers VectorWriter, else one WriteAt per buffer.
func WriteAtV(d Device, bufs [][]byte, off int64, fua bool) error {
	if v, ok := d.(VectorWriter); ok {
		return v.WriteAtV(bufs, off, fua)
	}
	for _, b := range bufs {
		if err := d.WriteAt(b, off, fua); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}

// VectorReader is the read side of VectorWriter: reads into several
// buffers, for consecutive bytes from off, in one call (for a file,
// preadv; preadv2 with RWF_NOWAIT for TryReadAtV).
type VectorReader interface {
	// ReadAtV is ReadAt into the buffers' concatenation.
	ReadAtV(bufs [][]byte, off int64) error
	// TryReadAtV is TryReadAt (NoWaitReader) into the buffers'
	// concatenation.
	TryReadAtV(bufs [][]byte, off int64) bool
}

// ReadAtV reads bufs from d at consecutive offsets from off: in one call
// when d offers VectorReader, else one ReadAt per buffer.
func ReadAtV(d Device, bufs [][]byte, off int64) error {
	if v, ok := d.(VectorReader); ok {
		return v.ReadAtV(bufs, off)
	}
	for _, b := range bufs {
		if err := d.ReadAt(b, off); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}

// TryReadAtV is TryReadAt of bufs at consecutive offsets from off: in one
// call when d offers VectorReader, else one TryReadAt per buffer.
func TryReadAtV(d Device, bufs [][]byte, off int64) bool {
	if v, ok := d.(VectorReader); ok {
		return v.TryReadAtV(bufs, off)
	}
	for _, b := range bufs {
		if !TryReadAt(d, b, off) {
			return false
		}
		off += int64(len(b))
	}
	return true
}

// TryReadAt is d's TryReadAt when d offers it, else false.
func TryReadAt(d Device, p []byte, off int64) bool {
	t, ok := d.(NoWaitReader)
	return ok && t.TryReadAt(p, off)
}
