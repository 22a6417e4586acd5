package nbd

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// splicing counts the bytes its file moves into pipes. With part, it
// moves only that share of each range (the server reads the rest into a
// buffer); with handler, TryReadAt refuses (reads run in a goroutine of
// their own, not the reader); with failRest, ReadAt fails.
type splicing struct {
	*block.File
	part              float64
	handler, failRest bool
	spliced           atomic.Int64
}

func (d *splicing) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	if d.part > 0 {
		n = int(float64(n) * d.part)
	}
	k := d.File.SpliceTo(pipe, off, n, nowait)
	d.spliced.Add(int64(k))
	return k
}

func (d *splicing) TryReadAt(p []byte, off int64) bool {
	return !d.handler && d.File.TryReadAt(p, off)
}

var errRest = errors.New("the unspliced rest is unreadable")

func (d *splicing) ReadAt(p []byte, off int64) error {
	if d.failRest {
		return errRest
	}
	return d.File.ReadAt(p, off)
}

// Reads of 64 KiB to 1 MiB are spliced from the file into the socket,
// whole or in part (the rest read into a buffer and sent after), in both
// reply modes, many in flight at once; they return the file's bytes, a
// read whose rest fails returns EIO without harming the connection, and
// no pipe is left open but the idle ones.
func TestSplicedReads(t *testing.T) {
	const size = 8 << 20
	want := make([]byte, size)
	r := rand.New(rand.NewPCG(5, 6))
	for i := range want {
		want[i] = byte(r.Uint32())
	}
	lengths := []uint32{64 << 10, 64<<10 + 1, 300 << 10, 1 << 20, 1<<20 + 4096, 4096}
	for _, tc := range []struct {
		name              string
		part              float64
		handler, failRest bool
		local             bool // served as to a client on this host: copied, not spliced
	}{
		{"whole", 0, false, false, false},
		{"part", 0.4, false, false, false},
		{"whole-handler", 0, true, false, false},
		{"part-handler", 0.4, true, false, false},
		{"rest-fails", 0.4, true, true, false},
		{"local", 0, false, false, true},
		{"local-handler", 0.4, true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			modes(t, func(t *testing.T, structured bool) {
				file, path := sparseFile(t, size)
				if err := os.WriteFile(path, want, 0o644); err != nil {
					t.Fatal(err)
				}
				dev := &splicing{File: file, part: tc.part, handler: tc.handler, failRest: tc.failRest}
				_, addr := serve(t, dev, func(s *Server) { s.spliceLocal = !tc.local })
				c, _ := open(t, addr, structured, false)
				type read struct {
					off uint64
					n   uint32
				}
				reads := map[uint64]read{}
				for i := range 48 {
					n := lengths[i%len(lengths)]
					off := uint64(r.IntN(size-int(n)+1)) &^ 511
					if i%3 == 0 {
						off |= 7 // unaligned
						off = min(off, uint64(size)-uint64(n))
					}
					reads[uint64(i)] = read{off, n}
					if err := c.send(0, cmdRead, uint64(i), off, n, nil); err != nil {
						t.Fatal(err)
					}
				}
				for range reads {
					ch, err := c.readReply()
					if err != nil {
						t.Fatal(err)
					}
					rd, ok := reads[ch.cookie]
					if !ok {
						t.Fatalf("reply with unknown cookie %#x", ch.cookie)
					}
					errno, _ := ch.err()
					if tc.failRest {
						if errno != errIO {
							t.Fatalf("read of %d at %d: errno %d, want EIO (the rest failed)", rd.n, rd.off, errno)
						}
						continue
					}
					if errno != 0 {
						t.Fatalf("read of %d at %d: errno %d", rd.n, rd.off, errno)
					}
					if !bytes.Equal(ch.data(), want[rd.off:rd.off+uint64(rd.n)]) {
						t.Fatalf("read of %d at %d returned wrong data", rd.n, rd.off)
					}
				}
				if !tc.failRest {
					// The connection is whole: one more read.
					if got := c.mustRead(4096, 1<<20); !bytes.Equal(got, want[4096:4096+1<<20]) {
						t.Fatal("read after the batch returned wrong data")
					}
				}
				if spliced := dev.spliced.Load(); tc.local != (spliced == 0) {
					t.Fatalf("%d bytes spliced for a client on this host: %v", spliced, tc.local)
				}
				c.disc()
			})
		})
	}
	if !waitFor(5*time.Second, func() bool {
		pipes.mu.Lock()
		defer pipes.mu.Unlock()
		return pipes.live == len(pipes.idle)
	}) {
		t.Fatalf("%d pipes open, %d of them idle", pipes.live, len(pipes.idle))
	}
}

type addrConn struct {
	net.Conn
	local, remote net.Addr
}

func (c addrConn) LocalAddr() net.Addr  { return c.local }
func (c addrConn) RemoteAddr() net.Addr { return c.remote }

func TestOnThisHost(t *testing.T) {
	tcp := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 10809} }
	for _, tc := range []struct {
		local, remote net.Addr
		want          bool
	}{
		{tcp("127.0.0.1"), tcp("127.0.0.1"), true},
		{tcp("::1"), tcp("::1"), true},
		{tcp("10.0.0.1"), tcp("10.0.0.1"), true}, // dialled one of the host's own addresses
		{tcp("10.0.0.1"), tcp("10.0.0.2"), false},
		{tcp("::ffff:10.0.0.1"), tcp("10.0.0.1"), true},
		{&net.UnixAddr{Name: "a"}, &net.UnixAddr{Name: "b"}, false},
	} {
		if got := onThisHost(addrConn{local: tc.local, remote: tc.remote}); got != tc.want {
			t.Errorf("local %v remote %v: %v, want %v", tc.local, tc.remote, got, tc.want)
		}
	}
}
