package crypt

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// slowDev is a child whose armed write lands in two steps — its first
// split bytes, then (after the test lets it go on, or a timeout) the rest
// — as a file's pwrite does to a concurrent pread: the kernel copies
// into the page cache with no lock against readers, so a read racing a
// write may return part of each.
type slowDev struct {
	block.Layer
	mu     sync.Mutex
	armed  bool
	split  int
	landed chan struct{} // closed when the first part has landed
	resume chan struct{} // closed to let the rest land
}

func (d *slowDev) WriteAt(p []byte, off int64, fua bool) error {
	d.mu.Lock()
	armed := d.armed
	d.armed = false
	d.mu.Unlock()
	if !armed {
		return d.Layer.WriteAt(p, off, fua)
	}
	if err := d.Layer.WriteAt(p[:d.split], off, false); err != nil {
		return err
	}
	close(d.landed)
	select {
	case <-d.resume:
	case <-time.After(300 * time.Millisecond):
		// A read that waits for this write (as it must) never lets it
		// go on: finish anyway.
	}
	return d.Layer.WriteAt(p[d.split:], off+int64(d.split), fua)
}

// TestPartialReadRacingPartialWrite: a read of some bytes of a sector
// while a write changes other bytes of it — ranges that do not overlap,
// so the read must return those bytes as they are. The write
// re-encrypts the whole sector; were the read to decrypt the child's
// sector while that write was landing, it could meet a 512-byte part
// half new ciphertext and half the zeroes of a hole, which is no longer
// an all-zero part and decrypts to garbage: bytes nobody wrote would read
// as random. 512-byte requests are what a client with 512-byte sectors
// (qemu for most guests) sends, so such pairs are ordinary.
func TestPartialReadRacingPartialWrite(t *testing.T) {
	dir := t.TempDir()
	keys := newKeys(t)
	l := build(t, block.Env{Dir: dir, Size: 1 << 20, Create: true, Keys: keys})
	l.Close()
	d := &slowDev{Layer: fileChild(t, dir, false, 0)}
	c, err := New(block.Env{Keys: keys}, nil, []block.Layer{d})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Sector 3 is a hole. The write covers its first 512 bytes; the
	// read its second 512, whose ciphertext the child has landed only
	// half of when the read comes.
	const sec = 3 * SectorSize
	d.split = 512 + 256
	d.landed, d.resume = make(chan struct{}), make(chan struct{})
	d.mu.Lock()
	d.armed = true
	d.mu.Unlock()
	werr := make(chan error, 1)
	go func() { werr <- c.WriteAt(bytes.Repeat([]byte{0xa5}, 512), sec, false) }()
	<-d.landed
	got := make([]byte, 512)
	rerr := c.ReadAt(got, sec+512)
	close(d.resume)
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if rerr != nil {
		t.Fatal(rerr)
	}
	if !bytes.Equal(got, make([]byte, 512)) {
		i := bytes.IndexFunc(got, func(r rune) bool { return r != 0 })
		t.Fatalf("bytes %d+512, which no write touched, read non-zero from byte %d on: the read decrypted a sector while a write re-encrypted it", sec+512, sec+512+i)
	}
	if w := mustRead(t, c, sec, 1024); !bytes.Equal(w[:512], bytes.Repeat([]byte{0xa5}, 512)) || !bytes.Equal(w[512:], make([]byte, 512)) {
		t.Fatal("sector contents after both")
	}
}

// TestRangeLockShared: shared requests that overlap are granted together;
// an exclusive one waits for them, and a shared one arriving after a
// waiting exclusive one waits behind it (no writer starves).
func TestRangeLockShared(t *testing.T) {
	var rl rangeLock
	a := rl.rlock(0, 10)
	b := rl.rlock(5, 15) // shared with a: at once
	got := make(chan string, 2)
	go func() { r := rl.lock(8, 8); got <- "exclusive"; rl.unlock(r) }()
	for { // wait until the exclusive request is queued
		rl.mu.Lock()
		n := len(rl.reqs)
		rl.mu.Unlock()
		if n == 3 {
			break
		}
	}
	go func() { r := rl.rlock(8, 9); got <- "shared"; rl.unlock(r) }()
	for {
		rl.mu.Lock()
		n := len(rl.reqs)
		rl.mu.Unlock()
		if n == 4 {
			break
		}
	}
	select {
	case s := <-got:
		t.Fatalf("%s granted while shared holders and an earlier exclusive request overlap it", s)
	case <-time.After(20 * time.Millisecond):
	}
	rl.unlock(a)
	rl.unlock(b)
	if first, second := <-got, <-got; first != "exclusive" || second != "shared" {
		t.Fatalf("order %s, %s", first, second)
	}
}
