// Package blocktest holds what every layer's tests share: the conformance
// driver (random operations checked against a byte model, then close,
// reopen and check again) and FaultFS, a model of one machine's storage
// for crash tests: metadata files and the data files of "cachedfile"
// layers behind a volatile write cache, crashing at a chosen metadata
// write and losing what was never made durable.
package blocktest

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/block"
)

// Spec parses a JSON stack spec or fails the test.
func Spec(t testing.TB, s string) block.Spec {
	t.Helper()
	var sp block.Spec
	if err := json.Unmarshal([]byte(s), &sp); err != nil {
		t.Fatal(err)
	}
	return sp
}

// Conformance builds spec in env (env.Create must be true), drives it
// with ops random reads, writes (some FUA), write-zeroes, trims and extent
// queries, comparing every read with a byte model, then flushes, closes,
// reopens (Create false) and compares the whole device again. A device
// that offers block.NoWaitReader has every read tried that way too (and
// a 4 KiB read at its start), and what it answers compared alike (with
// at least one answer required: its data was just written, so the page
// cache holds it). A device that offers block.Splicer has every read also
// spliced into a pipe, and what it moved followed by ReadAt of the rest
// compared alike; one that offers block.SpliceWriter has some writes
// taken from a pipe, the rest written with WriteAt. It returns the model
// so callers can check more.
func Conformance(t *testing.T, env block.Env, spec string, ops int) []byte {
	t.Helper()
	l, err := block.Build(env, Spec(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	size := l.Size()
	if size <= 0 {
		t.Fatalf("size %d", size)
	}
	caps := l.Capabilities()
	nowait, tryable := l.(block.NoWaitReader)
	tried := 0
	splicer, splices := l.(block.Splicer)
	var pipe [2]int
	if splices {
		pipe = Pipe(t)
	}
	spliceW, splicesW := l.(block.SpliceWriter)
	var wpipe [2]int
	if splicesW {
		wpipe = Pipe(t)
	}
	zeroLength(t, l, caps)
	model := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, uint64(len(spec))))
	for i := 0; i < ops; i++ {
		off := rng.Int64N(size)
		n := min(rng.Int64N(256<<10)+1, size-off)
		if rng.IntN(2) == 0 { // aligned requests are the common case
			off &^= 4095
			n = max(4096, n&^4095)
			n = min(n, size-off)
		}
		switch rng.IntN(6) {
		case 0, 1:
			p := make([]byte, n)
			for j := range p {
				p[j] = byte(rng.IntN(256))
			}
			fua := rng.IntN(4) == 0
			if splicesW && !fua && rng.IntN(2) == 0 {
				// What the device takes from a pipe is written; the rest
				// stays in the pipe, in order, for WriteAt.
				if _, err := unix.Write(wpipe[1], p); err != nil {
					t.Fatal(err)
				}
				k := spliceW.SpliceFrom(wpipe[0], off, int(n))
				if k < 0 || int64(k) > n {
					t.Fatalf("op %d: SpliceFrom %d+%d took %d bytes", i, off, n, k)
				}
				rest := make([]byte, n-int64(k))
				ReadPipe(t, wpipe[0], rest)
				if !bytes.Equal(rest, p[k:]) {
					t.Fatalf("op %d: SpliceFrom %d+%d took %d bytes but left others in the pipe", i, off, n, k)
				}
				copy(model[off:], p[:k])
				p, off = p[k:], off+int64(k)
			}
			if err := l.WriteAt(p, off, fua); err != nil {
				t.Fatalf("write %d+%d: %v", off, len(p), err)
			}
			copy(model[off:], p)
		case 2:
			if !caps.WriteZeroes {
				continue
			}
			if err := l.WriteZeroes(off, n, block.ZeroFlags{NoHole: rng.IntN(2) == 0}); err != nil {
				t.Fatalf("zero %d+%d: %v", off, n, err)
			}
			clear(model[off : off+n])
		case 3:
			got := make([]byte, n)
			if err := l.ReadAt(got, off); err != nil {
				t.Fatalf("read %d+%d: %v", off, n, err)
			}
			if !bytes.Equal(got, model[off:off+n]) {
				t.Fatalf("op %d: read %d+%d differs from the model", i, off, n)
			}
			if splices {
				// What the device moves into a pipe, then ReadAt of the
				// rest, is the range.
				k := splicer.SpliceTo(pipe[1], off, int(n), rng.IntN(2) == 0)
				if k < 0 || int64(k) > n {
					t.Fatalf("op %d: SpliceTo %d+%d moved %d bytes", i, off, n, k)
				}
				clear(got)
				ReadPipe(t, pipe[0], got[:k])
				if err := l.ReadAt(got[k:], off+int64(k)); err != nil {
					t.Fatalf("read %d+%d: %v", off+int64(k), n-int64(k), err)
				}
				if !bytes.Equal(got, model[off:off+n]) {
					t.Fatalf("op %d: %d bytes spliced of %d+%d, then the rest read: differs from the model", i, k, off, n)
				}
			}
			if !tryable {
				continue
			}
			// The same range, then its first aligned 4 KiB (the size of
			// most small reads, which some layers limit TryReadAt to).
			for _, r := range [][2]int64{{off, n}, {off &^ 4095, min(4096, size-off&^4095)}} {
				got := make([]byte, r[1])
				if nowait.TryReadAt(got, r[0]) {
					tried++
					if !bytes.Equal(got, model[r[0]:r[0]+r[1]]) {
						t.Fatalf("op %d: TryReadAt %d+%d differs from the model", i, r[0], r[1])
					}
				}
			}
		case 4:
			ex, err := l.Extents(off, n)
			if err != nil || len(ex) == 0 {
				t.Fatalf("extents %d+%d: %v %v", off, n, ex, err)
			}
			at := off
			for _, e := range ex {
				if e.Length <= 0 {
					t.Fatalf("extent of length %d", e.Length)
				}
				if e.Zero {
					end := min(at+e.Length, off+n)
					if !bytes.Equal(model[at:end], make([]byte, end-at)) {
						t.Fatalf("extent %d+%d reported zero but holds data", at, e.Length)
					}
				}
				at += e.Length
			}
		case 5:
			// Trim may leave the old data or zeroes: the model learns
			// what the device now says.
			if !caps.Trim {
				continue
			}
			if err := l.Trim(off, n, false); err != nil {
				t.Fatalf("trim %d+%d: %v", off, n, err)
			}
			if err := l.ReadAt(model[off:off+n], off); err != nil {
				t.Fatalf("read after trim: %v", err)
			}
		}
	}
	if tryable && tried == 0 {
		t.Errorf("the device offers TryReadAt but never answered one")
	}
	outOfRange(t, l, caps)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if err := l.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("final contents differ from the model")
	}
	if d := l.Describe(); d.State != block.StateOK || d.Type == "" {
		t.Fatalf("describe: %+v", d)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	env.Create = false
	l, err = block.Build(env, Spec(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("after reopen: %v", err)
	}
	return model
}

// zeroLength checks requests of no bytes, at the start, inside and at the
// end of l: each does nothing and succeeds (where declared), and Extents
// answers no extents (block.Device). They are asked before the random
// operations, so these draw the same numbers as before.
func zeroLength(t *testing.T, l block.Device, caps block.Capabilities) {
	t.Helper()
	for _, off := range []int64{0, l.Size()/2&^4095 + 1, l.Size()} {
		if err := l.ReadAt(nil, off); err != nil {
			t.Errorf("read %d+0: %v", off, err)
		}
		if err := l.WriteAt(nil, off, false); err != nil {
			t.Errorf("write %d+0: %v", off, err)
		}
		if caps.WriteZeroes {
			if err := l.WriteZeroes(off, 0, block.ZeroFlags{}); err != nil {
				t.Errorf("zero %d+0: %v", off, err)
			}
		}
		if caps.Trim {
			if err := l.Trim(off, 0, false); err != nil {
				t.Errorf("trim %d+0: %v", off, err)
			}
		}
		if ex, err := l.Extents(off, 0); err != nil || len(ex) != 0 {
			t.Errorf("extents %d+0: %v, %v; want no extents", off, ex, err)
		}
	}
}

// Pipe returns a non-blocking pipe (read end, write end) with room for
// 1 MiB, closed when the test ends: what block.Splicer moves bytes into.
func Pipe(t testing.TB) [2]int {
	t.Helper()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Close(fds[0])
		unix.Close(fds[1])
	})
	if _, err := unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, 1<<20); err != nil {
		t.Fatal(err)
	}
	return fds
}

// ReadPipe fills p from the pipe's read end, which must hold that much.
func ReadPipe(t testing.TB, fd int, p []byte) {
	t.Helper()
	for r := 0; r < len(p); {
		m, err := unix.Read(fd, p[r:])
		if err != nil || m == 0 {
			t.Fatalf("pipe: read %d of %d bytes: %v", r, len(p), err)
		}
		r += m
	}
}

// SpliceReads splices rounds random ranges of d, of up to maxLen bytes
// each (every other one with nowait), reads the rest of each with ReadAt
// and compares the whole with model; it returns how many bytes were
// spliced.
func SpliceReads(t testing.TB, d interface {
	block.Device
	block.Splicer
}, model []byte, rng *rand.Rand, rounds int, maxLen int64, what string) int {
	t.Helper()
	fds := Pipe(t)
	spliced := 0
	for i := range rounds {
		off := rng.Int64N(int64(len(model)))
		n := int(min(rng.Int64N(maxLen)+1, int64(len(model))-off))
		k := d.SpliceTo(fds[1], off, n, i%2 == 0)
		if k < 0 || k > n {
			t.Fatalf("%s: SpliceTo(%d, %d) moved %d", what, off, n, k)
		}
		got := make([]byte, n)
		ReadPipe(t, fds[0], got[:k])
		if err := d.ReadAt(got[k:], off+int64(k)); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !bytes.Equal(got, model[off:off+int64(n)]) {
			t.Fatalf("%s: range %d+%d (%d spliced): wrong bytes", what, off, n, k)
		}
		spliced += k
	}
	return spliced
}
