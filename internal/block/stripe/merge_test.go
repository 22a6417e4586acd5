package stripe

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// segmented is a child's allocation: consecutive extents from 0, whose
// Extents answer at most limit of them (0: all), as a child that answers
// short does.
type segmented struct {
	ex    []block.Extent
	limit int
}

// at returns the extent holding off and how much of it is left from off.
func (s segmented) at(off int64) (block.Extent, int64) {
	for _, e := range s.ex {
		if off < e.Length {
			return e, e.Length - off
		}
		off -= e.Length
	}
	panic(fmt.Sprintf("offset beyond the child: %d", off))
}

func (s segmented) extents(off, n int64) []block.Extent {
	var out []block.Extent
	at := int64(0)
	for _, e := range s.ex {
		if at+e.Length > off && at < off+n {
			lo := max(at, off)
			// The last one may reach past the range, as children's do.
			out = append(out, block.Extent{Length: at + e.Length - lo, Hole: e.Hole, Zero: e.Zero})
			if s.limit > 0 && len(out) == s.limit {
				break
			}
		}
		at += e.Length
	}
	return out
}

// Extents of random ranges over children with random allocations (some
// answering short) say of each byte what its child says, from the start
// of the range without a gap, and are not split where nothing changes.
func TestStripeExtentsMatchEachChunk(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for round := range 300 {
		const chunk = 4096
		nc := 2 + rng.IntN(4)
		per := int64(1+rng.IntN(40)) * chunk
		kids := make([]block.Layer, nc)
		segs := make([]segmented, nc)
		for i := range kids {
			var s segmented
			for left := per; left > 0; {
				// Runs of whole chunks mostly (long holes or data), some
				// of a few hundred bytes.
				m := min(left, int64(1+rng.IntN(12))*chunk)
				if rng.IntN(4) == 0 {
					m = min(left, int64(1+rng.IntN(3000)))
				}
				kind := rng.IntN(3)
				s.ex = append(s.ex, block.Extent{Length: m, Hole: kind == 0, Zero: kind < 2})
				left -= m
			}
			if rng.IntN(3) == 0 {
				s.limit = 1 + rng.IntN(4)
			}
			segs[i] = s
			kids[i] = &blocktest.Fake{N: per, ExtentsOf: s.extents}
		}
		l, err := New(block.Env{}, []byte(`{"chunk":4096}`), kids)
		if err != nil {
			t.Fatal(err)
		}
		size := l.Size()
		for range 20 {
			off := rng.Int64N(size)
			n := 1 + rng.Int64N(size-off)
			ex, err := l.Extents(off, n)
			if err != nil || len(ex) == 0 {
				t.Fatalf("round %d: extents %d+%d: %v %v", round, off, n, ex, err)
			}
			at, short := off, false
			for _, s := range segs {
				short = short || s.limit > 0
			}
			for i, e := range ex {
				if e.Length <= 0 || at+e.Length > off+n {
					t.Fatalf("round %d: extents %d+%d: extent %d %+v at %d", round, off, n, i, e, at)
				}
				if i > 0 && ex[i-1].Hole == e.Hole && ex[i-1].Zero == e.Zero {
					t.Fatalf("round %d: extents %d+%d: %d and %d not merged", round, off, n, i-1, i)
				}
				for b := at; b < at+e.Length; {
					k := b / chunk
					want, left := segs[k%int64(nc)].at(k/int64(nc)*chunk + b%chunk)
					if want.Hole != e.Hole || want.Zero != e.Zero {
						t.Fatalf("round %d: extents %d+%d: byte %d in %+v, but its child says %+v", round, off, n, b, e, want)
					}
					b += min(left, chunk-b%chunk) // the next byte its child may say otherwise of
				}
				at += e.Length
			}
			if !short && at != off+n {
				t.Fatalf("round %d: extents %d+%d end at %d, though every child answered all", round, off, n, at)
			}
		}
	}
}
