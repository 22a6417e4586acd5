package block

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Extents asked while a range is written and trimmed beside it never
// reports an extent of no bytes: data SEEK_DATA found at the offset and
// punched before SEEK_HOLE looked made a zero-length first extent, which
// breaks the contract (the NBD server then answers "unknown" for the
// whole range; layers above pass the empty extent on).
func TestExtentsUnderConcurrentTrimHaveLength(t *testing.T) {
	_, d := openZeroed(t, 1<<20)
	defer d.Close()
	if err := d.Trim(0, 1<<20, false); err != nil {
		t.Fatal(err)
	}
	const at, n = 128 << 10, 64 << 10
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := bytes.Repeat([]byte{1}, n)
		for !stop.Load() {
			d.WriteAt(buf, at, false)
			d.Trim(at, n, false)
		}
	}()
	defer wg.Wait()
	defer stop.Store(true)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		ex, err := d.Extents(at, 512<<10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ex) == 0 {
			t.Fatal("no extent")
		}
		total := int64(0)
		for _, e := range ex {
			if e.Length <= 0 {
				t.Fatalf("extent of length %d in %+v", e.Length, ex)
			}
			total += e.Length
		}
		if total > 512<<10 {
			t.Fatalf("extents cover %d bytes of a %d-byte query: %+v", total, 512<<10, ex)
		}
	}
}
