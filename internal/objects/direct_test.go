package objects

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/basalt-storage/basalt/internal/md5lanes"
	"golang.org/x/sys/unix"
)

// chunkReader returns p in pieces of random size, many shorter than an
// MD5 block, as a body arriving over a slow socket does.
type chunkReader struct {
	p []byte
	r *rand.Rand
}

func (c *chunkReader) Read(b []byte) (int, error) {
	if len(c.p) == 0 {
		return 0, io.EOF
	}
	k := 1 + c.r.IntN(100)
	if c.r.IntN(3) == 0 {
		k = 1 + c.r.IntN(300<<10)
	}
	k = copy(b[:min(k, len(b))], c.p)
	c.p = c.p[k:]
	return k, nil
}

func isDirect(t *testing.T, f *os.File) bool {
	t.Helper()
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fl&unix.O_DIRECT != 0
}

// TestReceiveBodies: bodies of every size around the block, buffer and
// O_DIRECT boundaries, arriving in pieces of any size, are written byte
// for byte and hashed right (copyHashed reuses a buffer only once what
// was added from it is hashed, however small the pieces).
func TestReceiveBodies(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	b := &Backend{log: slog.New(slog.DiscardHandler)}
	dir := t.TempDir()
	for _, size := range []int{0, 1, 63, 64, 4095, 4096, directMin - 1, directMin, directMin + 1,
		1 << 20, 1<<20 + 4095, 2 << 20, 3<<20 + 17} {
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(r.Uint32())
		}
		f, err := os.Create(filepath.Join(dir, "body"))
		if err != nil {
			t.Fatal(err)
		}
		length := int64(size)
		h := md5lanes.NewStream()
		n, err := copyHashed(b.bodyFile(f, &length), &chunkReader{p: body, r: r}, h)
		if err != nil || n != int64(size) {
			t.Fatalf("size %d: copied %d, %v", size, n, err)
		}
		f.Close()
		got, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, body) {
			t.Fatalf("size %d: the file differs from the body", size)
		}
		if want := md5.Sum(body); hex.EncodeToString(h.Sum(nil)) != hex.EncodeToString(want[:]) {
			t.Fatalf("size %d: MD5 %x, want %x", size, h.Sum(nil), want)
		}
	}
}

// TestBodyFileDirect: a big body's whole blocks go direct; its tail, or
// an unaligned buffer, turns O_DIRECT off and goes through the cache.
func TestBodyFileDirect(t *testing.T) {
	b := &Backend{log: slog.New(slog.DiscardHandler)}
	dir := t.TempDir()
	buf := (*bufPool.Get().(*[]byte))[:1<<20]
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	f, err := os.Create(filepath.Join(dir, "body"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	length := int64(3<<20 + 100)
	w := b.bodyFile(f, &length)
	if !w.direct {
		// The file system refused O_DIRECT: that is remembered, and
		// the body goes through the page cache.
		if !b.noDirect.Load() || isDirect(t, f) {
			t.Fatalf("not direct, but noDirect %v, O_DIRECT %v", b.noDirect.Load(), isDirect(t, f))
		}
		t.Logf("%s refuses O_DIRECT; checked the fallback only", dir)
		return
	}
	if _, err := w.Write(buf); err != nil {
		t.Fatal(err)
	}
	if !w.direct || !isDirect(t, f) {
		t.Fatal("whole aligned blocks turned O_DIRECT off")
	}
	if _, err := w.Write(buf[1:]); err != nil { // unaligned
		t.Fatal(err)
	}
	if w.direct || isDirect(t, f) {
		t.Fatal("an unaligned buffer was written with O_DIRECT on")
	}
	if _, err := w.Write(buf[:100]); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	want := append(append(append([]byte(nil), buf...), buf[1:]...), buf[:100]...)
	if !bytes.Equal(got, want) {
		t.Fatal("the file differs from what was written")
	}

	// A small body never tries.
	small := int64(directMin - 1)
	g, err := os.Create(filepath.Join(dir, "small"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if w := b.bodyFile(g, &small); w.direct || isDirect(t, g) {
		t.Fatal("a small body is written direct")
	}

	// Nor does any body with Config.BufferedIO.
	buffered, err := New(Config{Root: filepath.Join(dir, "root"), Work: filepath.Join(dir, "work"),
		Buckets: &memBuckets{}, BufferedIO: true})
	if err != nil {
		t.Fatal(err)
	}
	defer buffered.Shutdown()
	if w := buffered.bodyFile(g, &length); w.direct || isDirect(t, g) {
		t.Fatal("a body is written direct with BufferedIO")
	}
}

func TestAlignedBuf(t *testing.T) {
	for _, n := range []int{0, 1, 4096, 1 << 20} {
		for range 20 {
			b := alignedBuf(n)
			if len(b) != n || cap(b) != n || (n > 0 && uintptr(unsafe.Pointer(&b[0]))%uintptr(directAlign) != 0) {
				t.Fatalf("alignedBuf(%d): len %d cap %d at %p, alignment %d", n, len(b), cap(b), unsafe.SliceData(b), directAlign)
			}
		}
	}
}
