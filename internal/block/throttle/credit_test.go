package throttle

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/stripe"
	"golang.org/x/sys/unix"
)

// halfSplicer moves at most half of each splice (what is not moved the
// caller reads or writes with ReadAt or WriteAt).
type halfSplicer struct{ block.Layer }

func (h halfSplicer) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	return block.SpliceTo(h.Layer, pipe, off, n/2, nowait)
}

func (h halfSplicer) SpliceFrom(pipe int, off int64, n int) int {
	return block.SpliceFrom(h.Layer, pipe, off, n/2)
}

// A splice the child makes in part, or not at all (a stripe of units under
// block.SpliceMinPiece is a Splicer that never moves anything), is followed
// by the caller's ReadAt or WriteAt of the rest, as the NBD server does:
// the bytes must be paid for once, not once by the splice and again by
// the ReadAt or WriteAt (only the operation is paid twice: docs/layers.md).
func TestSplicedInPartPaysEachByteOnce(t *testing.T) {
	striped, err := stripe.New(block.Env{}, json.RawMessage(`{"chunk":8192}`),
		[]block.Layer{blocktest.NewMem(1<<20, false), blocktest.NewMem(1<<20, false)})
	if err != nil {
		t.Fatal(err)
	}
	children := map[string]block.Layer{"stripe of 8 KiB units": striped, "half": halfSplicer{plainFile(t)}}
	const n = 256 << 10
	for name, child := range children {
		t.Run(name, func(t *testing.T) {
			fds := blocktest.Pipe(t)
			// 1 byte/s: the 1 MiB burst is all there is for the test.
			l := throttle(t, `{"bps":1}`, child)
			got := make([]byte, n)
			k := l.SpliceTo(fds[1], 0, n, false)
			blocktest.ReadPipe(t, fds[0], got[:k])
			if err := l.ReadAt(got[k:], int64(k)); err != nil {
				t.Fatal(err)
			}
			p := make([]byte, n)
			if _, err := unix.Write(fds[1], p); err != nil { // the pipe holds 1 MiB
				t.Fatal(err)
			}
			k = l.SpliceFrom(fds[0], 0, n)
			blocktest.ReadPipe(t, fds[0], p[k:])
			if err := l.WriteAt(p[k:], int64(k), false); err != nil {
				t.Fatal(err)
			}
			want := float64(l.burst - 2*n)
			if b := l.bytes.TokensAt(time.Now()); b < want-10 || b > want+10 {
				t.Fatalf("%.0f byte tokens left after reading and writing %d bytes each against a burst of %d, want %.0f",
					b, n, l.burst, want)
			}
		})
	}
}

// Requests waiting for tokens when the layer is closed end at once with
// block.ErrClosed: they do not wait out their turn (with a low limit, hours)
// to be refused by the closed child.
func TestCloseEndsWaitingRequests(t *testing.T) {
	l := throttle(t, `{"iops":1000,"bps":1}`, plainFile(t)) // burst 1 MiB, then 1 byte/s
	if err := l.ReadAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() { done <- l.ReadAt(make([]byte, 4096), 0) }()
	go func() { done <- l.WriteAt(make([]byte, 4096), 0, false) }()
	time.Sleep(50 * time.Millisecond) // both wait for byte tokens
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, block.ErrClosed) {
				t.Fatalf("a request waiting at Close ended with %v, want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a request waiting for tokens still waits 5 s after Close")
		}
	}
	if err := l.ReadAt(make([]byte, 4096), 0); !errors.Is(err, block.ErrClosed) {
		t.Fatalf("a read after Close: %v, want ErrClosed", err)
	}
}
