package cow

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// pagesAllocated is how many pages of t are allocated.
func (t *ownerTable) pagesAllocated() int {
	n := 0
	for i := range t.pages {
		if t.pages[i].Load() != nil {
			n++
		}
	}
	return n
}

func (s *chunkSet) pagesAllocated() int {
	n := 0
	for i := range s.pages {
		if s.pages[i].Load() != nil {
			n++
		}
	}
	return n
}

// checkPages fails t unless l's owner table has want pages allocated.
func checkPages(t *testing.T, l *Layer, want int) {
	t.Helper()
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	if n := l.owner.pagesAllocated(); n != want {
		t.Fatalf("%d pages of the owner table allocated, want %d", n, want)
	}
}

// mustPanic fails t unless f panics.
func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatalf("%s did not panic", what)
		}
	}()
	f()
}

// TestOwnerTableAbsentPages: a new table reads zero everywhere with no page
// allocated; storing 0 or a compare and swap that changes nothing (or
// fails) allocates nothing; stores at or beyond Len are refused, in the
// last page's tail too (where Load reads 0).
func TestOwnerTableAbsentPages(t *testing.T) {
	const n = 1000 // 62 pages of 16 and a partial one of 8
	tb := newOwnerTable(n, 4)
	if tb.Len() != n || len(tb.pages) != 63 {
		t.Fatalf("Len %d, %d page slots; want %d, 63", tb.Len(), len(tb.pages), n)
	}
	for c := range int64(n) {
		if o := tb.Load(c); o != 0 {
			t.Fatalf("chunk %d of a new table: owner %d", c, o)
		}
	}
	tb.Store(17, 0)
	if !tb.CompareAndSwap(18, 0, 0) {
		t.Fatal("CompareAndSwap(0, 0) on an absent page failed")
	}
	if tb.CompareAndSwap(19, 3, 4) || tb.CompareAndSwap(19, 3, 0) {
		t.Fatal("CompareAndSwap(3, _) on an absent page succeeded")
	}
	if got := tb.nextHeld(0, n); got != n {
		t.Fatalf("nextHeld of an empty table: %d", got)
	}
	if k := tb.pagesAllocated(); k != 0 {
		t.Fatalf("%d pages allocated by storing zeroes", k)
	}
	for _, c := range []int64{n, n + 7, n + 8, 1 << 40, -1} {
		if c >= n && c < n+8 { // in the last page's tail: reads 0
			if o := tb.Load(c); o != 0 {
				t.Fatalf("Load(%d) beyond Len: %d", c, o)
			}
		} else {
			mustPanic(t, fmt.Sprintf("Load(%d)", c), func() { tb.Load(c) })
		}
		mustPanic(t, fmt.Sprintf("Store(%d)", c), func() { tb.Store(c, 1) })
		mustPanic(t, fmt.Sprintf("Store(%d, 0)", c), func() { tb.Store(c, 0) })
		mustPanic(t, fmt.Sprintf("CompareAndSwap(%d)", c), func() { tb.CompareAndSwap(c, 0, 1) })
	}
	if k := tb.pagesAllocated(); k != 0 {
		t.Fatalf("%d pages allocated by refused stores", k)
	}
}

// TestOwnerTableAcrossPages: stores and swaps on either side of page
// boundaries and in the last, partial page land where they should and
// allocate exactly their pages.
func TestOwnerTableAcrossPages(t *testing.T) {
	const n, page = 1000, 16
	tb := newOwnerTable(n, 4)
	model := make([]uint32, n)
	set := func(c int64, o uint32) {
		tb.Store(c, o)
		model[c] = o
	}
	set(15, 1)  // page 0's last
	set(16, 2)  // page 1's first
	set(999, 3) // the last chunk, in the partial last page
	// The partial page's first chunk.
	if !tb.CompareAndSwap(992, 0, 4) {
		t.Fatal("CompareAndSwap(0, 4) failed")
	}
	model[992] = 4
	if tb.CompareAndSwap(16, 0, 5) || tb.CompareAndSwap(16, 1, 5) {
		t.Fatal("CompareAndSwap with the wrong old value succeeded")
	}
	if !tb.CompareAndSwap(16, 2, 6) {
		t.Fatal("CompareAndSwap(2, 6) failed")
	}
	model[16] = 6
	if !tb.CompareAndSwap(15, 1, 0) { // back to zero: the page stays
		t.Fatal("CompareAndSwap(1, 0) failed")
	}
	model[15] = 0
	set(31, 7)
	set(31, 0)
	for c := range int64(n) {
		if o := tb.Load(c); o != model[c] {
			t.Fatalf("chunk %d: owner %d, want %d", c, o, model[c])
		}
	}
	if k := tb.pagesAllocated(); k != 3 {
		t.Fatalf("%d pages allocated, want 3 (0, 1, 62)", k)
	}
	for _, p := range []int{0, 1, n / page} {
		if tb.pages[p].Load() == nil {
			t.Fatalf("page %d not allocated", p)
		}
	}
}

// TestOwnerTableGrow: growing keeps the pages themselves (no entry is
// copied) and every entry; new entries, the old last page's tail among
// them, read zero and take stores.
func TestOwnerTableGrow(t *testing.T) {
	tb := newOwnerTable(40, 4) // 2 pages and a half
	tb.Store(3, 1)
	tb.Store(39, 2)
	p0, p2 := tb.pages[0].Load(), tb.pages[2].Load()
	for _, n := range []int64{40, 41, 48, 1000} {
		tb.grow(n)
		if tb.Len() != n || int64(len(tb.pages)) != (n+15)/16 {
			t.Fatalf("grown to %d: Len %d, %d page slots", n, tb.Len(), len(tb.pages))
		}
		if tb.pages[0].Load() != p0 || tb.pages[2].Load() != p2 || tb.pages[1].Load() != nil {
			t.Fatalf("grown to %d: pages replaced", n)
		}
		for c := range n {
			want := uint32(0)
			switch c {
			case 3:
				want = 1
			case 39:
				want = 2
			}
			if o := tb.Load(c); o != want {
				t.Fatalf("grown to %d: chunk %d owner %d, want %d", n, c, o, want)
			}
		}
	}
	tb.Store(40, 5)
	tb.Store(999, 6)
	if tb.Load(40) != 5 || tb.Load(999) != 6 || tb.pagesAllocated() != 3 {
		t.Fatalf("after stores beyond the old size: %d, %d, %d pages", tb.Load(40), tb.Load(999), tb.pagesAllocated())
	}
	mustPanic(t, "shrink", func() { tb.grow(10) })
}

// ownerRuns is unheld's answer by brute force.
func ownerRuns(model []uint32, from, to int64) [][2]int64 {
	var out [][2]int64
	to = min(to, int64(len(model)))
	for c := from; c < to; c++ {
		if model[c] != 0 {
			continue
		}
		e := c + 1
		for e < to && model[e] == 0 {
			e++
		}
		out = append(out, [2]int64{c, e})
		c = e
	}
	return out
}

// TestOwnerTableWalks: nextHeld, nextUnheld, held and unheld agree with a
// brute-force reading of the table, over random tables from empty to
// full, with and without absent pages, and random ranges (to beyond Len
// among them).
func TestOwnerTableWalks(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for round := range 300 {
		n := rng.Int64N(300) + 1
		shift := uint(rng.IntN(6)) // pages of 1 to 32 entries
		tb := newOwnerTable(n, shift)
		model := make([]uint32, n)
		density := []float64{0, 0.01, 0.1, 0.5, 0.9, 1}[rng.IntN(6)]
		for c := range n {
			if rng.Float64() < density {
				model[c] = uint32(rng.IntN(3) + 1)
				tb.Store(c, model[c])
			}
		}
		if rng.IntN(3) == 0 { // pages allocated but zero again
			for c := range n {
				if model[c] != 0 && rng.IntN(2) == 0 {
					model[c] = 0
					tb.Store(c, 0)
				}
			}
		}
		for range 20 {
			from := rng.Int64N(n + 1)
			to := from + rng.Int64N(n+10-from)
			what := fmt.Sprintf("round %d (n %d, page %d): [%d, %d)", round, n, 1<<shift, from, to)
			end := min(to, n)
			wantHeld, wantUnheld := end, end
			for c := from; c < end; c++ {
				if model[c] != 0 && wantHeld == end {
					wantHeld = c
				}
				if model[c] == 0 && wantUnheld == end {
					wantUnheld = c
				}
			}
			if got := tb.nextHeld(from, to); got != wantHeld {
				t.Fatalf("%s: nextHeld %d, want %d", what, got, wantHeld)
			}
			if got := tb.nextUnheld(from, to); got != wantUnheld {
				t.Fatalf("%s: nextUnheld %d, want %d", what, got, wantUnheld)
			}
			var got, want [][2]int64
			for c := from; c < end; c++ {
				if model[c] != 0 {
					want = append(want, [2]int64{c, int64(model[c])})
				}
			}
			for c, o := range tb.held(from, to) {
				got = append(got, [2]int64{c, int64(o)})
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s: held %v, want %v", what, got, want)
			}
			got = nil
			for c, e := range tb.unheld(from, to) {
				got = append(got, [2]int64{c, e})
			}
			if want := ownerRuns(model, from, to); !slices.Equal(got, want) {
				t.Fatalf("%s: unheld %v, want %v", what, got, want)
			}
		}
		// Stopping early.
		want := ownerRuns(model, 0, n)
		k := 0
		for range tb.unheld(0, n) {
			k++
			break
		}
		if k != min(len(want), 1) {
			t.Fatalf("round %d: unheld yielded %d runs before its break", round, k)
		}
		// unheld's body claiming the run it was given (as claimUnheld
		// does): the walk goes on after the run.
		var got [][2]int64
		for c, e := range tb.unheld(0, n) {
			got = append(got, [2]int64{c, e})
			for k := c; k < e; k += 2 {
				tb.CompareAndSwap(k, 0, 9)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: unheld while claiming %v, want %v", round, got, want)
		}
	}
}

// TestOwnerTableConcurrentFirstStores: many goroutines storing at once
// into the same absent pages, and racing to claim the same chunks, lose
// nothing: every store reads back, every chunk has exactly one claimer.
// (Run with -race.)
func TestOwnerTableConcurrentFirstStores(t *testing.T) {
	const n, workers = 256, 16
	for round := range 50 {
		tb := newOwnerTable(n, 6) // 4 pages of 64
		var claimed [n]int32
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				// Own chunks w, w+workers, ...: plain stores.
				for c := int64(w); c < n/2; c += workers {
					tb.Store(c, uint32(w+1))
					_ = tb.Load(c ^ 1)
				}
				// Shared chunks: a claim each, as writes make them.
				for c := int64(n / 2); c < n; c++ {
					if tb.CompareAndSwap(c, 0, uint32(w+1)) {
						mu.Lock()
						claimed[c]++
						mu.Unlock()
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		for c := range int64(n) {
			o := tb.Load(c)
			if c < n/2 && o != uint32(c%workers+1) {
				t.Fatalf("round %d: chunk %d reads %d, its store was %d", round, c, o, c%workers+1)
			}
			if c >= n/2 && (o == 0 || claimed[c] != 1) {
				t.Fatalf("round %d: chunk %d reads %d, claimed %d times", round, c, o, claimed[c])
			}
		}
		if k := tb.pagesAllocated(); k != 4 {
			t.Fatalf("round %d: %d pages", round, k)
		}
	}
}

// TestChunkSet: the unsynced set over pages: absent pages hold nothing,
// removing from one allocates nothing, bits on either side of page and
// word boundaries are independent, grow keeps the pages, and concurrent
// first adds into one absent page lose nothing.
func TestChunkSet(t *testing.T) {
	s := newChunkSet(1000, 7) // pages of 128 bits
	for c := range int64(1000) {
		if s.has(c) {
			t.Fatalf("chunk %d in a new set", c)
		}
		s.remove(c)
	}
	if s.pagesAllocated() != 0 {
		t.Fatal("removing from an empty set allocated pages")
	}
	mustPanic(t, "add(1000)", func() { s.add(1000) })
	in := map[int64]bool{}
	for _, c := range []int64{0, 63, 64, 127, 128, 999} {
		s.add(c)
		in[c] = true
	}
	s.remove(64)
	delete(in, 64)
	p0 := s.pages[0].Load()
	s.grow(5000)
	if s.pages[0].Load() != p0 {
		t.Fatal("grow replaced a page")
	}
	s.add(4999)
	in[4999] = true
	for c := range int64(5000) {
		if s.has(c) != in[c] {
			t.Fatalf("chunk %d: in the set %v, want %v", c, s.has(c), in[c])
		}
	}
	if k := s.pagesAllocated(); k != 4 {
		t.Fatalf("%d pages, want 4", k)
	}

	for round := range 50 {
		s := newChunkSet(512, 8)
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c := int64(w); c < 512; c += 16 {
					s.add(c)
					s.remove(c ^ 1)
					s.add(c ^ 1)
					_ = s.has((c + 1) & 511)
				}
			}()
		}
		wg.Wait()
		for c := range int64(512) {
			if !s.has(c) {
				t.Fatalf("round %d: chunk %d lost", round, c)
			}
		}
	}
}

// TestLayerWithTinyPages runs the layer's tests with pages of 4 owner
// entries and 64 unsynced bits, so that every scan (claimUnheld, a
// collapse's passes and commit, flatten), claim and copy-up crosses page
// boundaries and absent pages, which at the real page sizes most of their
// volumes never do.
func TestLayerWithTinyPages(t *testing.T) {
	defer func(o, u uint) { ownerShift, unsyncedShift = o, u }(ownerShift, unsyncedShift)
	ownerShift, unsyncedShift = 2, 6
	env := testEnv(t, 1<<20)
	l := build(t, env, fileSpec)
	if l.owner.shift != 2 || l.unsynced.shift != 6 || len(l.owner.pages) != 32 {
		t.Fatalf("tables with pages of %d and %d, %d owner pages", 1<<l.owner.shift, 1<<l.unsynced.shift, len(l.owner.pages))
	}
	l.Close()
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"Conformance", TestConformance},
		{"SnapshotsAndClones", TestSnapshotsAndClones},
		{"LongChainReadBound", TestLongChainReadBound},
		{"FlattenAndCollect", TestFlattenAndCollect},
		{"Resize", TestResize},
		{"ConcurrentCopyUps", TestConcurrentCopyUps},
		{"CrashAtEveryMetadataWrite", TestCrashAtEveryMetadataWrite},
		{"FailedWriteKeepsItsChunks", TestFailedWriteKeepsItsChunks},
		{"FastZero", TestFastZero},
		{"FlushCoversInflightCopyUp", TestFlushCoversInflightCopyUp},
		{"FUAIntoPendingCopyUp", TestFUAIntoPendingCopyUp},
		{"SnapshotAfterCrashKeepsUnheldData", TestSnapshotAfterCrashKeepsUnheldData},
		{"Collapse", TestCollapse},
		{"CollapseUnheldChunks", TestCollapseUnheldChunks},
		{"CollapseWithConcurrentWrites", TestCollapseWithConcurrentWrites},
		{"CollapseCrashKeepsUnpersistedChunks", TestCollapseCrashKeepsUnpersistedChunks},
		{"CollapseCrashAtEveryMetadataWrite", TestCollapseCrashAtEveryMetadataWrite},
		{"FastZeroDuringCollapse", TestFastZeroDuringCollapse},
		{"CopyOutIn", TestCopyOutIn},
		{"SpliceTo", TestSpliceTo},
		{"SpliceFrom", TestSpliceFrom},
	} {
		t.Run(tc.name, tc.f)
	}
}
