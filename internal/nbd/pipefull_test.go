package nbd

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSplicedWriteTailInFullPipe: while the rest of a payload is to come,
// the bytes past its last sector boundary wait in the pipe; a client that
// sends them in tiny segments (one pipe slot each, as splice takes them
// from the socket) can fill every slot of the pipe with less than a
// sector. The device may have none of them yet, the pipe takes no more,
// and the socket holds the rest of the payload: the write must still
// complete — once it waited for ever (the socket, readable already, was
// waited on again).
func TestSplicedWriteTailInFullPipe(t *testing.T) {
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

	file, _ := sparseFile(t, 1<<20)
	c := &conn{raw: server, nc: server, r: bufio.NewReader(server), log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		dev: file, spliceW: file, sock: newSocket(server), done: make(chan struct{}), cancel: func() {}}
	p := getPipe()
	if p == nil {
		t.Skip("no pipes of pipeSize here")
	}
	defer p.close()
	// Every slot of the pipe taken by one byte: what 256 one-byte
	// segments spliced from the socket leave.
	const slots = pipeSize / 4096
	head := bytes.Repeat([]byte{7}, slots)
	page := make([]byte, slots*4096)
	iov := make([]unix.Iovec, slots)
	for i := range iov {
		page[i*4096] = head[i]
		iov[i].Base = &page[i*4096]
		iov[i].SetLen(1)
	}
	if k, err := unix.Vmsplice(p.w, iov, 0); err != nil || k != slots {
		t.Fatalf("vmsplice: %d, %v", k, err)
	}
	if k, err := unix.Write(p.w, []byte{1}); err == nil {
		t.Fatalf("the pipe took %d more bytes: not full", k)
	}
	rest := bytes.Repeat([]byte{9}, 8192)
	if _, err := client.Write(rest); err != nil {
		t.Fatal(err)
	}
	w := &splicedWrite{p: p, inPipe: slots}
	done := make(chan error, 1)
	go func() {
		err := c.receiveSpliced(request{length: uint32(len(rest))}, w)
		if err == nil {
			err = c.drain(w, w.inPipe)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		server.Close() // ends the wait
		<-done
		t.Fatal("the write's payload was never all taken: the pipe was full of less than a sector")
	}
	got := make([]byte, slots+len(rest))
	if err := file.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, append(head, rest...)) {
		t.Fatal("the file does not hold the payload")
	}
}
