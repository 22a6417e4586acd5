package nbd

import (
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// A connection that never gets past the handshake — anyone can open
// thousands, no authentication needed, each living HandshakeTimeout —
// must cost little memory: the big transmission buffers (64 KiB to read,
// 256 KiB to write) are for connections that reached an export.
func TestHandshakeMemory(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, nil)
	const n = 200
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	for range n {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
		// The greeting: the server has set the connection up.
		nc.SetDeadline(time.Now().Add(ioTimeout))
		if _, err := io.ReadFull(nc, make([]byte, 18)); err != nil {
			t.Fatal(err)
		}
	}
	if !waitFor(5*time.Second, func() bool { return s.Connections() == n }) {
		t.Fatalf("%d connections, want %d", s.Connections(), n)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapInuse) - int64(before.HeapInuse)) / n
	t.Logf("%d bytes of heap per connection in the handshake", per)
	if per > 64<<10 {
		t.Errorf("a connection in the handshake holds %d KiB of heap, want well under the 320 KiB of transmission buffers", per>>10)
	}
}

// A client that sends requests right behind its GO, before reading the
// reply, has them answered: bytes the handshake's reader holds are not
// lost when the transmission's buffers replace it.
func TestRequestsBehindGo(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	_, addr := serve(t, dev, nil)
	c := connect(t, addr, clientFixed|clientNoZeroes)
	payload := pattern(3000, 9)
	b := encOption(optGo, encInfoGo("disk"))
	b = append(b, encRequest(0, cmdWrite, 1, 4096, uint32(len(payload)))...)
	b = append(b, payload...)
	for i := range 300 { // more than the handshake's buffer holds
		b = append(b, encRequest(0, cmdFlush, uint64(100+i), 0, 0)...)
	}
	c.mu.Lock()
	c.reads[2] = uint32(len(payload))
	c.mu.Unlock()
	b = append(b, encRequest(0, cmdRead, 2, 4096, uint32(len(payload)))...)
	if err := c.write(b); err != nil {
		t.Fatal(err)
	}
	for {
		r, err := c.readOptReply()
		if err != nil {
			t.Fatal(err)
		}
		if r.typ == repAck {
			break
		}
		if r.isErr() {
			t.Fatalf("GO: %v", r)
		}
	}
	seen := map[uint64]bool{}
	for len(seen) < 302 {
		ch, err := c.readReply()
		if err != nil {
			t.Fatalf("after %d replies: %v", len(seen), err)
		}
		if e, _ := ch.err(); e != 0 {
			t.Fatalf("reply %v", ch)
		}
		seen[ch.cookie] = true
	}
	if got := c.mustRead(4096, uint32(len(payload))); string(got) != string(payload) {
		t.Fatal("read back other bytes than written")
	}
}

// Once an export is chosen the connection gets its full-size buffers
// (fewer system calls per request), unless its reader holds bytes.
func TestGrowBuffers(t *testing.T) {
	s := &Server{}
	s.defaults()
	for _, held := range []bool{false, true} {
		a, b := net.Pipe()
		c := newConn(s, a)
		if c.r.Size() != handshakeBufSize || c.w.Size() != handshakeBufSize {
			t.Fatalf("handshake buffers %d/%d bytes, want %d", c.r.Size(), c.w.Size(), handshakeBufSize)
		}
		wantR := readBufSize
		if held {
			go b.Write([]byte("0123456789"))
			if _, err := c.r.ReadByte(); err != nil {
				t.Fatal(err)
			}
			wantR = handshakeBufSize
		}
		c.growBuffers()
		if c.r.Size() != wantR || c.w.Size() != writeBufSize {
			t.Errorf("held=%v: transmission buffers %d/%d bytes, want %d/%d", held, c.r.Size(), c.w.Size(), wantR, writeBufSize)
		}
		if held && c.r.Buffered() == 0 {
			t.Error("bytes the reader held were dropped")
		}
		a.Close()
		b.Close()
	}
}
