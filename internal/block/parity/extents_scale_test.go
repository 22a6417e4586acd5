package parity

import (
	"fmt"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// The extents of a large, mostly sparse parity volume (a new one's: the
// copy-on-write layer above walks them at every open) take a number of
// calls that grows with its data, not its size: answering chunk by chunk,
// 64 chunks a call, describing 3 TiB took 786,432 calls of 256 leg
// questions each — minutes at every create and attach.
func TestExtentsOfALargeSparseVolume(t *testing.T) {
	var kids []string
	for i := range 4 {
		kids = append(kids, fmt.Sprintf(`{"type":"file","params":{"path":"leg%d.img"}}`, i))
	}
	spec := fmt.Sprintf(`{"type":"parity","children":[%s]}`, strings.Join(kids, ","))
	env := block.Env{Dir: t.TempDir(), Size: 3 << 40, Create: true}
	l, err := block.Build(env, blocktest.Spec(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const chunk = 64 << 10
	for _, off := range []int64{0, 7 * chunk, l.Size() - chunk} {
		if err := l.WriteAt([]byte{1}, off, false); err != nil {
			t.Fatal(err)
		}
	}
	calls := 0
	var data []int64
	for off := int64(0); off < l.Size(); {
		ex, err := l.Extents(off, l.Size()-off)
		if err != nil {
			t.Fatal(err)
		}
		calls++
		if calls > 1000 {
			t.Fatalf("more than %d Extents calls to describe a volume holding three chunks of data (at %d of %d bytes)", calls-1, off, l.Size())
		}
		for _, e := range ex {
			if e.Length <= 0 {
				t.Fatalf("extent %+v at %d", e, off)
			}
			if !e.Zero {
				data = append(data, off/chunk)
			}
			off += e.Length
		}
	}
	want := []int64{0, 7, l.Size()/chunk - 1}
	if fmt.Sprint(data) != fmt.Sprint(want) {
		t.Fatalf("data in chunks %v, want %v", data, want)
	}
}
