package objects

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/basalt-storage/basalt/internal/md5lanes"
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

// TestReceiveBodies: bodies of every size around the block, buffer and
// write-behind boundaries, arriving in pieces of any size, are written byte
// for byte and hashed right (copyHashed reuses a buffer only once what
// was added from it is hashed, however small the pieces).
func TestReceiveBodies(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	dir := t.TempDir()
	for _, size := range []int{0, 1, 63, 64, 4095, 4096, writeBehindMin - 1, writeBehindMin, writeBehindMin + 1,
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
		n, err := copyHashed(newBodyFile(f, &length), &chunkReader{p: body, r: r}, h)
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

// TestBodyFileWriteBehind: a large body (or one of unknown length)
// starts each piece's write-back, a small one does not; where that is
// refused (here a pipe) the writes go on without it.
func TestBodyFileWriteBehind(t *testing.T) {
	big, small := int64(writeBehindMin), int64(writeBehindMin-1)
	for _, c := range []struct {
		length *int64
		behind bool
	}{{&big, true}, {nil, true}, {&small, false}} {
		if w := newBodyFile(nil, c.length); w.behind != c.behind {
			t.Errorf("length %v: behind %v, want %v", c.length, w.behind, c.behind)
		}
	}

	f, err := os.Create(filepath.Join(t.TempDir(), "body"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := newBodyFile(f, &big)
	p := bytes.Repeat([]byte("basalt"), 100000)
	for range 3 {
		if n, err := w.Write(p); n != len(p) || err != nil {
			t.Fatalf("write: %d, %v", n, err)
		}
	}
	if !w.behind || w.off != int64(3*len(p)) {
		t.Fatalf("file: behind %v, off %d", w.behind, w.off)
	}

	r, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer pw.Close()
	go io.Copy(io.Discard, r)
	w = newBodyFile(pw, &big)
	if n, err := w.Write(p); n != len(p) || err != nil {
		t.Fatalf("pipe write: %d, %v", n, err)
	}
	if w.behind {
		t.Fatal("a pipe took sync_file_range")
	}
	if n, err := w.Write(p); n != len(p) || err != nil {
		t.Fatalf("pipe write after: %d, %v", n, err)
	}
}
