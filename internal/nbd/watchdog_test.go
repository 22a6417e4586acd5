package nbd

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Small writes are run by the reader, one after another: pipelined
// writes never overlap in the device, and all land.
func TestSmallWritesOneAtATime(t *testing.T) {
	modes(t, func(t *testing.T, structured bool) {
		file, _ := sparseFile(t, testSize)
		var running, most, slow atomic.Int32
		dev := &hookDevice{Device: file, write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			start := time.Now()
			err := next(p, off, fua)
			if time.Since(start) > writeNowSlow {
				slow.Add(1) // the watchdog may have let the writes run in parallel
			}
			return err
		}}
		_, addr := serve(t, dev, nil)
		c, _ := open(t, addr, structured, false)
		const n = 64
		for try := 0; ; try++ {
			var batch []byte
			for i := range n {
				batch = append(batch, encRequest(0, cmdWrite, uint64(i), uint64(i*4096), 4096)...)
				batch = append(batch, pattern(4096, byte(i+try))...)
			}
			if err := c.write(batch); err != nil {
				t.Fatal(err)
			}
			for range n {
				ch, err := c.readReply()
				if err != nil {
					t.Fatal(err)
				}
				if e, msg := ch.err(); e != 0 {
					t.Fatalf("write %d: errno %d %s", ch.cookie, e, msg)
				}
			}
			for i := range n {
				if !bytes.Equal(c.mustRead(uint64(i*4096), 4096), pattern(4096, byte(i+try))) {
					t.Fatalf("write %d not read back", i)
				}
			}
			if slow.Load() == 0 {
				break
			}
			if try == 3 {
				t.Skip("every try met a slow write; cannot judge on this machine")
			}
			slow.Store(0)
			most.Store(0)
			time.Sleep(writeNowBypass)
		}
		if m := most.Load(); m != 1 {
			t.Fatalf("up to %d small writes ran at once, want 1", m)
		}
	})
}

// A write that blocks does not hold up the requests behind it for longer
// than writeNowSlow: the watchdog starts a new reader, which answers them
// while the blocked write waits, and its own reply comes once it is done.
func TestSlowWriteHandsOverReader(t *testing.T) {
	modes(t, func(t *testing.T, structured bool) {
		file, _ := sparseFile(t, testSize)
		release := make(chan struct{})
		var stuck atomic.Bool
		dev := &hookDevice{Device: file, write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
			if off == 0 {
				stuck.Store(true)
				<-release
			}
			return next(p, off, fua)
		}}
		_, addr := serve(t, dev, nil)
		var once sync.Once
		unblock := func() { once.Do(func() { close(release) }) }
		t.Cleanup(unblock) // before the server's: it waits for the write
		c, _ := open(t, addr, structured, false)
		c.mustWrite(8192, pattern(4096, 2))

		const blocked = 1000
		if err := c.send(0, cmdWrite, blocked, 0, 4096, pattern(4096, 1)); err != nil {
			t.Fatal(err)
		}
		if !waitFor(ioTimeout, stuck.Load) {
			t.Fatal("the write never reached the device")
		}
		// Answered while the first write is still blocked.
		if !bytes.Equal(c.mustRead(8192, 4096), pattern(4096, 2)) {
			t.Fatal("read behind a blocked write: wrong data")
		}
		c.mustWrite(16384, pattern(4096, 3))
		unblock()
		if cs := c.reply(blocked); cs[0].errno != 0 {
			t.Fatalf("blocked write: %v", cs)
		}
		for i, want := range [][]byte{pattern(4096, 1), nil, pattern(4096, 2), nil, pattern(4096, 3)} {
			if want != nil && !bytes.Equal(c.mustRead(uint64(i*4096), 4096), want) {
				t.Fatalf("block %d: wrong data", i)
			}
		}
	})
}
