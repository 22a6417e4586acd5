package throttle

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/file"
	"golang.org/x/sys/unix"
)

// cachedFile is a file layer whose 1 MiB is in the page cache; the test
// is skipped where the file system cannot read without waiting.
func cachedFile(t *testing.T) block.Layer {
	t.Helper()
	f, err := file.New(block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}, json.RawMessage(`{"path":"a.img"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.WriteAt(bytes.Repeat([]byte{7}, 1<<20), 0, false); err != nil {
		t.Fatal(err)
	}
	if !block.TryReadAt(f, make([]byte, 4096), 0) {
		t.Skip("this file system cannot read without waiting (RWF_NOWAIT)")
	}
	return f
}

func throttle(t *testing.T, params string, child block.Layer) *Layer {
	t.Helper()
	l, err := New(block.Env{}, json.RawMessage(params), []block.Layer{child})
	if err != nil {
		t.Fatal(err)
	}
	return l.(*Layer)
}

// notNow hides its device's NoWaitReader: every TryReadAt through it fails.
type notNow struct{ block.Layer }

// Reads tried without waiting keep to the limits, and a read the child
// cannot answer at once costs nothing.
func TestTryReadAtKeepsTheLimits(t *testing.T) {
	f := cachedFile(t)
	p := make([]byte, 4096)

	// The buckets refill while the loop runs (slowly under the race
	// detector): what may have come in meanwhile is allowed on top.
	refilled := func(start time.Time, rate float64) int {
		return int(time.Since(start).Seconds()*rate) + 1
	}
	l := throttle(t, `{"iops":5}`, f)
	n, start := 0, time.Now()
	for n < 100 && l.TryReadAt(p, 0) {
		n++
	}
	if extra := refilled(start, 5); n < 5 || n > 5+extra {
		t.Fatalf("%d reads answered at once under iops 5 (burst 5), want 5 (+%d refilled)", n, extra)
	}

	l = throttle(t, `{"bps":2097152}`, f) // burst: 1 MiB
	if l.TryReadAt(make([]byte, 1<<20+4096), 0) {
		t.Fatal("a read bigger than the byte burst was answered at once")
	}
	n, start = 0, time.Now()
	for n < 1000 && l.TryReadAt(p, 0) {
		n++
	}
	if extra := refilled(start, 2097152.0/4096); n < 256 || n > 256+extra {
		t.Fatalf("%d 4 KiB reads answered at once under a 1 MiB byte burst, want 256 (+%d refilled)", n, extra)
	}

	l = throttle(t, `{"iops":5,"bps":2097152}`, notNow{f})
	for range 50 {
		if l.TryReadAt(p, 0) {
			t.Fatal("answered at once though the child cannot")
		}
	}
	now := time.Now()
	if ops, b := l.ops.TokensAt(now), l.bytes.TokensAt(now); ops < 4.99 || b < 1<<20-1 {
		t.Fatalf("tokens left after refused tries: %.2f ops, %.0f bytes; want all back", ops, b)
	}
}

// plainFile is a 4 MiB file layer.
func plainFile(t *testing.T) block.Layer {
	t.Helper()
	f, err := file.New(block.Env{Dir: t.TempDir(), Size: 4 << 20, Create: true}, json.RawMessage(`{"path":"a.img"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// Every operation that moves or changes data takes an operation token;
// reads and writes also take their length in byte tokens; flush and
// extents take none. Checked on the buckets, not on a clock.
func TestEveryOperationPaysItsTokens(t *testing.T) {
	const n, size = 4, 64 << 10
	p := make([]byte, size)
	ops := []struct {
		name  string
		bytes bool // takes byte tokens
		do    func(*Layer) error
	}{
		{"read", true, func(l *Layer) error { return l.ReadAt(p, 0) }},
		{"write", true, func(l *Layer) error { return l.WriteAt(p, 0, false) }},
		{"write-fua", true, func(l *Layer) error { return l.WriteAt(p, size, true) }},
		{"write-zeroes", false, func(l *Layer) error { return l.WriteZeroes(0, size, block.ZeroFlags{}) }},
		{"trim", false, func(l *Layer) error { return l.Trim(0, size, false) }},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			l := throttle(t, `{"iops":4,"bps":8388608}`, plainFile(t)) // bursts: 4 ops, 1 MiB
			start := time.Now()
			for range n {
				if err := op.do(l); err != nil {
					t.Fatal(err)
				}
			}
			now := time.Now()
			refill := now.Sub(start).Seconds()
			if got := l.ops.TokensAt(now); got > 4*refill+0.01 {
				t.Errorf("%.2f operation tokens left after %d operations against a burst of %d", got, n, n)
			}
			want := float64(l.burst)
			if op.bytes {
				want -= n * size
			}
			if got := l.bytes.TokensAt(now); got < want-1 || got > want+8388608*refill+1 {
				t.Errorf("%.0f byte tokens left, want %.0f", got, want)
			}
		})
	}
	t.Run("flush and extents", func(t *testing.T) {
		l := throttle(t, `{"iops":4,"bps":8388608}`, plainFile(t))
		for range 20 {
			if err := l.Flush(); err != nil {
				t.Fatal(err)
			}
			if _, err := l.Extents(0, 1<<20); err != nil {
				t.Fatal(err)
			}
		}
		now := time.Now()
		if ops, b := l.ops.TokensAt(now), l.bytes.TokensAt(now); ops < 4-0.01 || b < float64(l.burst)-1 {
			t.Errorf("flush and extents took tokens: %.2f ops, %.0f bytes left", ops, b)
		}
	})
}

// Over time the limits hold: past the burst, operations and bytes go at
// the configured rates. Only lower bounds on time are checked (a slow
// machine makes a run longer, never shorter).
func TestLimitsHoldOverTime(t *testing.T) {
	p := make([]byte, 4096)
	l := throttle(t, `{"iops":50}`, plainFile(t))
	start := time.Now()
	for i := range 75 { // 50 in the burst, 25 at 50/s
		if err := l.WriteAt(p, int64(i)*4096, false); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d < 450*time.Millisecond {
		t.Errorf("75 writes under iops 50 (burst 50) took %v, want at least 0.5 s", d)
	}

	big := make([]byte, 256<<10)
	l = throttle(t, `{"bps":2097152}`, plainFile(t)) // burst 1 MiB
	start = time.Now()
	for i := range 12 { // 3 MiB: 1 MiB in the burst, 2 MiB at 2 MiB/s
		if err := l.ReadAt(big, int64(i%16)*int64(len(big))); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Errorf("3 MiB read under 2 MiB/s (burst 1 MiB) took %v, want at least 1 s", d)
	}
}

// Splices keep to the limits as reads do: without waiting only while
// tokens are there, and a splice the child cannot make costs nothing; the
// bytes spliced are the child's.
func TestSpliceToKeepsTheLimits(t *testing.T) {
	f := cachedFile(t)
	refilled := func(start time.Time, rate float64) int { return int(time.Since(start).Seconds()*rate) + 1 }
	fds := blocktest.Pipe(t)
	got := make([]byte, 64<<10)

	l := throttle(t, `{"iops":5}`, f)
	n, start := 0, time.Now()
	for n < 100 {
		k := l.SpliceTo(fds[1], 4096, len(got), true)
		if k == 0 {
			break
		}
		blocktest.ReadPipe(t, fds[0], got[:k])
		if !bytes.Equal(got[:k], bytes.Repeat([]byte{7}, k)) {
			t.Fatal("spliced bytes differ from the child's")
		}
		n++
	}
	if extra := refilled(start, 5); n < 5 || n > 5+extra {
		t.Fatalf("%d splices made at once under iops 5 (burst 5), want 5 (+%d refilled)", n, extra)
	}
	// Waiting, the next splice is made once a token comes (0.2 s).
	start = time.Now()
	if k := l.SpliceTo(fds[1], 0, len(got), false); k != len(got) {
		t.Fatalf("a waiting splice moved %d of %d bytes", k, len(got))
	}
	blocktest.ReadPipe(t, fds[0], got)
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Fatalf("a splice over the limit did not wait (%v)", waited)
	}

	// A child that cannot splice: nothing moved, nothing charged.
	l = throttle(t, `{"iops":5,"bps":2097152}`, notNow{f})
	for range 50 {
		if l.SpliceTo(fds[1], 0, len(got), true)+l.SpliceTo(fds[1], 0, len(got), false) != 0 {
			t.Fatal("spliced through a child that cannot")
		}
	}
	now := time.Now()
	if ops, b := l.ops.TokensAt(now), l.bytes.TokensAt(now); ops < 4.99 || b < 1<<20-1 {
		t.Fatalf("tokens left after splices the child could not make: %.2f ops, %.0f bytes; want all", ops, b)
	}
}

// Writes taken from a pipe wait for the limits as writes do and land in
// the child; a child that cannot take them costs nothing.
func TestSpliceFromKeepsTheLimits(t *testing.T) {
	f := plainFile(t)
	fds := blocktest.Pipe(t)
	p := bytes.Repeat([]byte{9}, 64<<10)
	l := throttle(t, `{"iops":5}`, f)
	start := time.Now()
	for i := range 6 {
		if _, err := unix.Write(fds[1], p); err != nil {
			t.Fatal(err)
		}
		if k := l.SpliceFrom(fds[0], int64(i)*int64(len(p)), len(p)); k != len(p) {
			t.Fatalf("took %d of %d bytes", k, len(p))
		}
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Fatalf("6 writes under iops 5 (burst 5) took %v: the sixth did not wait", waited)
	}
	got := make([]byte, 6*len(p))
	if err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{9}, len(got))) {
		t.Fatalf("the child does not hold the spliced writes (%v)", err)
	}

	l = throttle(t, `{"iops":5}`, notNow{f})
	for range 50 {
		if l.SpliceFrom(fds[0], 0, len(p)) != 0 {
			t.Fatal("took bytes for a child that cannot")
		}
	}
	if ops := l.ops.TokensAt(time.Now()); ops < 4.99 {
		t.Fatalf("%.2f operation tokens left after writes the child could not take; want all", ops)
	}
}
