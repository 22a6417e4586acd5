package objects

import (
	"io"
	"os"
	"sync"
)

// fileBody is the body of a GET: the n bytes of an object file from its
// current offset. s3api hands it to fasthttp, which closes it when the
// answer is written.
//
// fasthttp writes a body that has a WriteTo method through it, into the
// connection's write buffer holding the answer's headers. fileBody first
// sends those headers on their own, then copies the bytes with the file's
// length known, so that on a plain TCP connection they go out in a single
// sendfile(2) straight from the page cache. Handed an *os.File instead,
// fasthttp fills the rest of its 4 KiB buffer with a read(2) of the
// file, writes, then sendfiles the remainder until a last call finds the
// end of the file: four system calls for a 4 KiB object, where fileBody
// makes two. A byte range was copied through user space; it is now sent
// like a whole object, from the range's offset.
//
// Over TLS there is no sendfile: the bytes must pass through the cipher.
// fasthttp's buffer would then take them 4 KiB at a time — a read, a TLS
// record and a system call per 4 KiB — so an encrypted connection gets
// them in pieces of copyPiece, which crypto/tls cuts into full 16 KiB
// records.
type fileBody struct {
	f         *os.File
	n         int64 // bytes left to send
	encrypted bool  // the connection is TLS: copy in large pieces
}

// newFileBody serves length bytes of f from offset start, over a TLS
// connection if encrypted.
func newFileBody(f *os.File, start, length int64, encrypted bool) (*fileBody, error) {
	if start != 0 {
		if _, err := f.Seek(start, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return &fileBody{f: f, n: length, encrypted: encrypted}, nil
}

// copyPiece is how much of a body an encrypted connection is given at a
// time.
const copyPiece = 256 << 10

var copyPieces = sync.Pool{New: func() any { b := make([]byte, copyPiece); return &b }}

// onlyWriter and onlyReader hide io.ReaderFrom and io.WriterTo from
// io.CopyBuffer, which then copies through the buffer it is given.
type onlyWriter struct{ io.Writer }
type onlyReader struct{ io.Reader }

func (b *fileBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.f.Read(p)
	b.n -= int64(n)
	return n, err
}

// WriteTo sends what is left to w, flushing what w buffered first when w
// is a buffered writer (fasthttp's), so that the copy below reaches the
// connection's ReadFrom — sendfile for a TCP connection — in one piece.
func (b *fileBody) WriteTo(w io.Writer) (int64, error) {
	if bw, ok := w.(interface{ Flush() error }); ok {
		if err := bw.Flush(); err != nil {
			return 0, err
		}
	}
	lr := &io.LimitedReader{R: b.f, N: b.n}
	var n int64
	var err error
	if b.encrypted {
		// A write larger than the emptied buffer goes straight through
		// to the connection.
		buf := copyPieces.Get().(*[]byte)
		n, err = io.CopyBuffer(onlyWriter{w}, onlyReader{lr}, *buf)
		copyPieces.Put(buf)
	} else {
		n, err = io.Copy(w, lr)
	}
	b.n = lr.N
	if err == nil && b.n > 0 {
		err = io.ErrUnexpectedEOF // the file shrank under the request
	}
	return n, err
}

func (b *fileBody) Close() error { return b.f.Close() }
