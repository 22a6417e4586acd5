package nbd

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// The mark really holds a waiting reader back until that many bytes are
// queued, and back at 1 lets it go at the first byte.
func TestLowWaterHoldsReader(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	s := newSocket(server)
	if s == nil || !s.setLowat(32<<10) {
		t.Fatal("cannot set the low-water mark on a TCP connection")
	}
	got := make(chan int, 1)
	buf := make([]byte, 64<<10)
	go func() {
		n, _ := io.ReadAtLeast(server, buf, 1)
		got <- n
	}()
	time.Sleep(20 * time.Millisecond) // the reader is waiting (a read finds what is queued, mark or not)
	client.Write(make([]byte, 8<<10))
	select {
	case n := <-got:
		t.Fatalf("reader woke with %d bytes queued, below the mark", n)
	case <-time.After(100 * time.Millisecond):
	}
	client.Write(make([]byte, 24<<10))
	select {
	case n := <-got:
		if n != 32<<10 {
			t.Fatalf("reader woke with %d bytes, want the mark's %d", n, 32<<10)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reader still asleep with the mark reached")
	}

	if !s.setLowat(1) {
		t.Fatal("cannot reset the mark")
	}
	go func() {
		n, _ := io.ReadAtLeast(server, buf, 1)
		got <- n
	}()
	time.Sleep(20 * time.Millisecond)
	client.Write([]byte{1})
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("reader not woken by one byte after the mark went back to 1")
	}
}

// Big write payloads that arrive in pieces, with pauses that let the
// reader consume part of a payload before the rest is sent, are read whole
// (a mark left at the payload's full size would never be reached), and
// a small request after them is answered (the mark is back at 1).
func TestBigPayloadInPieces(t *testing.T) {
	dev, _ := sparseFile(t, 16<<20)
	_, addr := serve(t, dev, nil)
	c, _ := open(t, addr, true, false)
	for i, size := range []int{bigPayload, 1 << 20, 3<<20 + 512} {
		p := pattern(size, byte(i))
		cookie := uint64(100 + i)
		msg := append(encRequest(0, cmdWrite, cookie, uint64(i)<<22, uint32(size)), p...)
		for k := range 3 {
			if err := c.write(msg[len(msg)*k/3 : len(msg)*(k+1)/3]); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if cs := c.reply(cookie); cs[0].errno != 0 {
			t.Fatalf("write of %d bytes: %v", size, cs)
		}
		if e := c.cmd(0, cmdFlush, 0, 0); e != 0 {
			t.Fatalf("flush after a write of %d bytes: errno %d", size, e)
		}
		if !bytes.Equal(c.mustRead(uint64(i)<<22, uint32(size)), p) {
			t.Fatalf("write of %d bytes not read back", size)
		}
	}
}
