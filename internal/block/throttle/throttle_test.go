package throttle

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/file"
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

	l := throttle(t, `{"iops":5}`, f)
	n := 0
	for n < 100 && l.TryReadAt(p, 0) {
		n++
	}
	if n != 5 {
		t.Fatalf("%d reads answered at once under iops 5 (burst 5), want 5", n)
	}

	l = throttle(t, `{"bps":2097152}`, f) // burst: 1 MiB
	if l.TryReadAt(make([]byte, 1<<20+4096), 0) {
		t.Fatal("a read bigger than the byte burst was answered at once")
	}
	n = 0
	for n < 1000 && l.TryReadAt(p, 0) {
		n++
	}
	if n != 256 {
		t.Fatalf("%d 4 KiB reads answered at once under a 1 MiB byte burst, want 256", n)
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
