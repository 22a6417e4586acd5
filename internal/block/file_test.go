package block

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// openZeroed opens a new file of n zero bytes as a File.
func openZeroed(t *testing.T, n int) (string, *File) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data.img")
	if err := os.WriteFile(path, make([]byte, n), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := OpenFile(path, false)
	if err != nil {
		t.Fatal(err)
	}
	return path, d
}

// A file removed while open takes later writes with it at Close: Flush and
// FUA writes must not call them durable.
func TestFileUnlinkedIsNotDurable(t *testing.T) {
	path, d := openZeroed(t, 1<<20)
	defer d.Close()
	buf := []byte("still here")
	if err := d.WriteAt(buf, 0, true); err != nil {
		t.Fatalf("FUA write while linked: %v", err)
	}
	if err := d.Flush(); err != nil {
		t.Fatalf("flush while linked: %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAt(buf, 4096, false); err != nil {
		t.Fatalf("plain write after unlink: %v", err)
	}
	if err := d.Flush(); !errors.Is(err, ErrUnlinked) {
		t.Fatalf("flush after unlink = %v, want ErrUnlinked", err)
	}
	if err := d.WriteAt(buf, 8192, true); !errors.Is(err, ErrUnlinked) {
		t.Fatalf("FUA write after unlink = %v, want ErrUnlinked", err)
	}
}

// WriteAtV lands the buffers' concatenation, more of them than one
// pwritev takes (IOV_MAX), empty ones included, with and without FUA;
// ReadAtV and (for the page cache holds it) TryReadAtV read it back into
// buffers cut another way; the callers' slices are left as they were;
// beyond the end of a file shorter than its device ReadAtV reads zeroes.
func TestFileVectors(t *testing.T) {
	path, d := openZeroed(t, 8<<20)
	defer d.Close()
	for _, fua := range []bool{false, true} {
		var bufs [][]byte
		var want []byte
		for i := range 2*iovMax + 7 {
			b := bytes.Repeat([]byte{byte(i)}, i%5*301)
			bufs = append(bufs, b)
			want = append(want, b...)
		}
		kept := slices.Clone(bufs)
		off := int64(12345)
		if fua {
			off = 3 << 20
		}
		if err := d.WriteAtV(bufs, off, fua); err != nil {
			t.Fatalf("WriteAtV (fua %v): %v", fua, err)
		}
		got := make([]byte, len(want))
		if err := d.ReadAt(got, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("WriteAtV (fua %v): the file differs from the buffers' concatenation", fua)
		}
		for i := range bufs {
			if len(bufs[i]) != len(kept[i]) {
				t.Fatalf("WriteAtV changed the caller's buffer %d", i)
			}
		}
		back := make([]byte, len(want))
		var rbufs [][]byte
		for rest := back; len(rest) > 0; {
			n := min(len(rest), 1+len(rbufs)%3*700)
			rbufs = append(rbufs, rest[:n])
			rest = rest[n:]
		}
		if err := d.ReadAtV(rbufs, off); err != nil || !bytes.Equal(back, want) {
			t.Fatalf("ReadAtV (%d buffers): %v, or the bytes differ", len(rbufs), err)
		}
		clear(back)
		if !d.TryReadAtV(rbufs[:iovMax], off) {
			t.Fatal("TryReadAtV of what was just written: not answered")
		}
		if n := sumLen(rbufs[:iovMax]); !bytes.Equal(back[:n], want[:n]) {
			t.Fatal("TryReadAtV: the bytes differ")
		}
		if d.TryReadAtV(rbufs, off) {
			t.Fatal("TryReadAtV of more than IOV_MAX buffers answered")
		}
	}
	// Past the file's end (the device is bigger than the file): zeroes.
	if err := os.Truncate(path, 8<<20-100); err != nil {
		t.Fatal(err)
	}
	tail := [][]byte{bytes.Repeat([]byte{1}, 150), bytes.Repeat([]byte{1}, 50)}
	if err := d.ReadAtV(tail, 8<<20-200); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tail[1], make([]byte, 50)) || !bytes.Equal(tail[0][100:], make([]byte, 50)) {
		t.Fatalf("ReadAtV past the end of the file: %v", tail)
	}
}

func sumLen(bufs [][]byte) (n int) {
	for _, b := range bufs {
		n += len(b)
	}
	return n
}

// piece cuts a write's buffers at the first writePiece boundary after its
// offset, and nowhere else: what it returns is a prefix of the buffers'
// concatenation exactly that long, and the caller's slice is unchanged.
func TestWritePieces(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		var batch [][]byte
		var all []byte
		for range 1 + rng.IntN(6) {
			b := make([]byte, rng.IntN(3*writePiece/2))
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			batch = append(batch, b)
			all = append(all, b...)
		}
		kept := slices.Clone(batch)
		off := rng.Int64N(4 * writePiece)
		if rng.IntN(4) == 0 {
			off = off / writePiece * writePiece // on a boundary
		}
		want := min(int64(len(all)), (off/writePiece+1)*writePiece-off)
		got := slices.Concat(piece(batch, off)...)
		if int64(len(got)) != want || !bytes.Equal(got, all[:want]) {
			t.Fatalf("piece at %d of %d bytes: %d bytes, want the first %d", off, len(all), len(got), want)
		}
		for i := range batch {
			if len(batch[i]) != len(kept[i]) {
				t.Fatalf("piece changed the caller's buffer %d", i)
			}
		}
	}
}
