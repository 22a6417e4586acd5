package bitmap

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/basalt-storage/basalt/internal/block/fault"
)

func TestPersistAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "map")
	n := int64(3*BitsPerPage + 17)
	b, err := Open(path, n)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		i := rng.Int64N(n)
		if rng.IntN(3) == 0 {
			b.Clear(i)
			delete(want, i)
		} else {
			b.Set(i)
			want[i] = true
		}
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	b.Set(5) // not synced: may be lost, but must not break anything
	b.Close()
	b, err = Open(path, n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if int(b.Count()) != len(want) && int(b.Count()) != len(want)+1 {
		t.Fatalf("count %d, want %d", b.Count(), len(want))
	}
	for i := range want {
		if !b.Get(i) {
			t.Fatalf("bit %d lost", i)
		}
	}
	// NextSet walks exactly the set bits.
	seen := 0
	for i := b.NextSet(0); i >= 0; i = b.NextSet(i + 1) {
		if !want[i] && i != 5 {
			t.Fatalf("NextSet found %d, never set", i)
		}
		seen++
	}
	if seen != int(b.Count()) {
		t.Fatalf("NextSet saw %d of %d", seen, b.Count())
	}
}

func TestGrow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "map")
	b, _ := Open(path, 10)
	b.Set(9)
	if err := b.Grow(2 * BitsPerPage); err != nil {
		t.Fatal(err)
	}
	b.Set(BitsPerPage + 1)
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	b.Close()
	b, _ = Open(path, 2*BitsPerPage)
	defer b.Close()
	if !b.Get(9) || !b.Get(BitsPerPage+1) || b.Count() != 2 {
		t.Fatal("grown bitmap lost bits")
	}
	if b.Grow(5) == nil {
		t.Fatal("shrink accepted")
	}
}

// TestCrashAtEveryWrite stops a Sync at each of its writes, whole or torn,
// and checks that every page then reads as its old or its new content, and
// that a completed earlier Sync is never lost.
func TestCrashAtEveryWrite(t *testing.T) {
	n := int64(3 * BitsPerPage)
	base := fault.New(nil, -1, nil)
	b, err := OpenFile(base, n)
	if err != nil {
		t.Fatal(err)
	}
	for p := range int64(3) {
		b.Set(p*BitsPerPage + 1)
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	old := base.Image()
	update := func(b *Bitmap) error {
		for p := range int64(3) {
			b.Set(p*BitsPerPage + 2)
			b.Clear(p*BitsPerPage + 1)
		}
		return b.Sync()
	}
	// Count the writes of the update.
	counter := fault.New(old, -1, nil)
	cb, _ := OpenFile(counter, n)
	if err := update(cb); err != nil {
		t.Fatal(err)
	}
	writes := counter.Writes()
	if writes != 3 {
		t.Fatalf("update made %d writes, want 3 (one per dirty page)", writes)
	}
	for k := range writes + 1 {
		for _, tear := range []func(int) bool{nil, fault.Half(SlotSize)} {
			f := fault.New(old, k, tear)
			fb, _ := OpenFile(f, n)
			err := update(fb)
			if k < writes && err == nil {
				t.Fatalf("crash at write %d: Sync succeeded", k)
			}
			r, err := OpenFile(fault.New(f.Image(), -1, nil), n)
			if err != nil {
				t.Fatal(err)
			}
			if k == writes && (r.Get(1) || !r.Get(2)) {
				t.Fatal("a completed Sync was not read back")
			}
			for p := range int64(3) {
				oldPage := r.Get(p*BitsPerPage+1) && !r.Get(p*BitsPerPage+2)
				newPage := !r.Get(p*BitsPerPage+1) && r.Get(p*BitsPerPage+2)
				if !oldPage && !newPage {
					t.Fatalf("crash at write %d: page %d is neither old nor new", k, p)
				}
			}
		}
	}
}
