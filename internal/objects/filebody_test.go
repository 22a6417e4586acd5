package objects

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// fileBody over a real TCP connection, as fasthttp drives it: headers in
// a bufio.Writer, then the body's WriteTo, then a final Flush; and read
// directly, as any other caller would. Both ways of copying: sendfile,
// and the large pieces an encrypted connection gets (their path does not
// depend on the connection being TLS).
func TestFileBody(t *testing.T) {
	for _, encrypted := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "encrypted"}[encrypted], func(t *testing.T) { testFileBody(t, encrypted) })
	}
}

func testFileBody(t *testing.T, encrypted bool) {
	data := make([]byte, 3<<20+123)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	path := filepath.Join(t.TempDir(), "obj")
	must(t, os.WriteFile(path, data, 0o644))
	open := func(start, length int64) *fileBody {
		f, err := os.Open(path)
		must(t, err)
		b, err := newFileBody(f, start, length, encrypted)
		must(t, err)
		return b
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()

	for _, r := range []struct{ start, length int64 }{
		{0, int64(len(data))}, {0, 4096}, {1, 4000}, {12345, 1 << 20}, {int64(len(data)) - 7, 7}, {100, 0},
	} {
		want := append([]byte("HTTP/1.1 200 OK\r\n\r\n"), data[r.start:r.start+r.length]...)
		got := make(chan []byte)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				got <- nil
				return
			}
			b, _ := io.ReadAll(c)
			c.Close()
			got <- b
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		must(t, err)
		w := bufio.NewWriterSize(c, 4096)
		w.WriteString("HTTP/1.1 200 OK\r\n\r\n")
		body := open(r.start, r.length)
		n, err := body.WriteTo(w)
		if err != nil || n != r.length {
			t.Fatalf("%+v: WriteTo sent %d, %v", r, n, err)
		}
		must(t, w.Flush())
		must(t, body.Close())
		c.Close()
		if b := <-got; !bytes.Equal(b, want) {
			t.Fatalf("%+v: the peer got %d bytes, want %d (equal prefix: %v)", r, len(b), len(want), bytes.HasPrefix(want, b))
		}

		// Read: the same bytes, then EOF.
		body = open(r.start, r.length)
		b, err := io.ReadAll(body)
		body.Close()
		if err != nil || !bytes.Equal(b, data[r.start:r.start+r.length]) {
			t.Fatalf("%+v: read %d bytes, %v", r, len(b), err)
		}
	}

	// A file that shrank under the request is an error, not a short body.
	body := open(0, int64(len(data)))
	must(t, os.Truncate(path, 1000))
	if _, err := body.WriteTo(io.Discard); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("WriteTo of a shrunk file: %v", err)
	}
	body.Close()
}
