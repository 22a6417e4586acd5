package nbd

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// The mark really holds a waiting reader back until that many bytes are
// queued, and back at 1 lets it go at the first byte.
func TestLowWaterHoldsReader(t *testing.T) {
	client, server := tcpPair(t)
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

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}

// The socket's raw Read and Write keep net.Conn's contract: a write bigger
// than the kernel's buffers waits for room and arrives whole and in order,
// a read waits for data, a closed peer is io.EOF, a deadline interrupts a
// waiting read, and closing the connection interrupts a waiting read with
// net.ErrClosed.
func TestSocketReadWrite(t *testing.T) {
	client, server := tcpPair(t)
	s := newSocket(server)
	if s == nil {
		t.Fatal("no socket for a TCP connection")
	}

	// 32 MiB is far more than the socket buffers hold: Write must wait.
	want := pattern(32<<20, 7)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(client, int64(len(want))))
		got <- b
	}()
	if n, err := s.Write(want); err != nil || n != len(want) {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the peer read %d bytes, not the %d written", len(b), len(want))
	}

	go func() {
		time.Sleep(20 * time.Millisecond) // the reader waits first
		client.Write([]byte("hello"))
	}()
	buf := make([]byte, 64)
	if n, err := io.ReadAtLeast(s, buf, 5); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("Read: %q, %v", buf[:n], err)
	}

	server.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if _, err := s.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline: %v, want a timeout", err)
	}
	server.SetReadDeadline(time.Time{})

	client.Close()
	if n, err := s.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("Read after the peer closed: %d, %v, want io.EOF", n, err)
	}

	_, server2 := tcpPair(t)
	s2 := newSocket(server2)
	done := make(chan error, 1)
	go func() {
		_, err := s2.Read(buf)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	server2.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read interrupted by Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not interrupt a waiting Read")
	}
}
