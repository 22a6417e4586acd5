package cow

import (
	"bytes"
	"errors"
	"runtime"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// bigSpec is a cow layer with the default chunk (64 KiB) over one file.
const bigSpec = `{"type":"cow","children":[{"type":"file","params":{"path":"data.img"}}]}`

// heapNow is the live heap after a collection.
func heapNow() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestLargeSparseVolumeMemory: creating, writing a few chunks far apart in,
// and reopening an 8 TiB volume that holds almost nothing costs memory for
// what it holds, not for its size. A flat owner table (4 bytes a chunk)
// took 512 MiB of heap at open, and the flat unsynced bitset 16 MiB more.
// What is left is the top's allocation map, which package bitmap keeps in
// memory whole (1 bit a chunk: 16 MiB here): the bound is that plus a
// little.
func TestLargeSparseVolumeMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("an 8 TiB sparse file")
	}
	const size = 8 << 40
	const chunk = DefaultChunk
	allocMap := chunks(size, chunk) / 8
	bound := allocMap + 4<<20
	env := testEnv(t, size)

	before := heapNow()
	l := buildBig(t, env)
	grew := heapNow() - before
	t.Logf("opening an 8 TiB volume: heap grew by %.1f MiB (allocation map %.1f MiB)", mib(grew), mib(allocMap))
	if grew > bound {
		l.Close()
		t.Fatalf("opening an 8 TiB empty volume grew the heap by %.1f MiB, want under %.1f MiB", mib(grew), mib(bound))
	}

	// A few chunks far apart: each costs its own page of the table, not
	// the pages between.
	offs := []int64{0, 3*chunk + 100, 1 << 40, 5<<40 + 7*chunk, size - 4096}
	before = heapNow()
	for i, off := range offs {
		if err := l.WriteAt(bytes.Repeat([]byte{byte(i + 1)}, 4096), off, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	grew = heapNow() - before
	t.Logf("writing %d chunks far apart: heap grew by %.1f KiB", len(offs), float64(grew)/1024)
	if grew > 1<<20 {
		t.Fatalf("writing %d chunks grew the heap by %.1f MiB", len(offs), mib(grew))
	}
	checkPages(t, l, 4) // chunks 0 and 3 share a page

	l = reopen(t, l, &env, bigSpec)
	defer l.Close()
	checkPages(t, l, 4)
	for i, off := range offs {
		p := make([]byte, 4096)
		if err := l.ReadAt(p, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(p, bytes.Repeat([]byte{byte(i + 1)}, 4096)) {
			t.Fatalf("after reopen: the chunk at %d does not read back", off)
		}
	}
}

// TestLargeSparseVolumeGrowMemory: growing a volume to 8 TiB keeps what
// it holds and costs no table entries for the new, empty part.
func TestLargeSparseVolumeGrowMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("an 8 TiB sparse file")
	}
	const size = 8 << 40
	env := testEnv(t, 1<<30)
	l := buildBig(t, env)
	defer l.Close()
	want := bytes.Repeat([]byte{7}, 8192)
	if err := l.WriteAt(want, 1<<30-8192, false); err != nil {
		t.Fatal(err)
	}
	before := heapNow()
	if err := l.Resize(size); errors.Is(err, syscall.EFBIG) {
		t.Skipf("the test's file system holds no 8 TiB file: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	grew := heapNow() - before
	allocMap := chunks(size, DefaultChunk) / 8
	t.Logf("growing to 8 TiB: heap grew by %.1f MiB (allocation map %.1f MiB)", mib(grew), mib(allocMap))
	// The allocation map grows by appending a page at a time, so its
	// slice may end up with spare capacity: twice the map is allowed.
	if bound := 2*allocMap + 4<<20; grew > bound {
		t.Fatalf("growing to 8 TiB grew the heap by %.1f MiB, want under %.1f MiB", mib(grew), mib(bound))
	}
	got := make([]byte, 8192)
	if err := l.ReadAt(got, 1<<30-8192); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the data written before the resize does not read back")
	}
	if err := l.WriteAt(want, size-8192, false); err != nil {
		t.Fatal(err)
	}
	if err := l.ReadAt(got, size-8192); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the data written at the new end does not read back")
	}
	checkPages(t, l, 2)
}

// buildBig builds bigSpec, skipping the test where the file system cannot
// hold a file of env's size (sparse).
func buildBig(t *testing.T, env block.Env) *Layer {
	t.Helper()
	l, err := block.Build(env, blocktest.Spec(t, bigSpec))
	if errors.Is(err, syscall.EFBIG) {
		t.Skipf("the test's file system holds no %d-byte file: %v", env.Size, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return l.(*Layer)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
