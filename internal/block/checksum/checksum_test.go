package checksum

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	_ "github.com/basalt-storage/basalt/internal/block/file"
)

const spec = `{"type":"checksum","children":[{"type":"file","params":{"path":"a.img"}}]}`

// build builds the checksum-over-file stack in dir.
func build(t testing.TB, env block.Env) *Layer {
	t.Helper()
	l, err := block.Build(env, blocktest.Spec(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	return l.(*Layer)
}

func create(t testing.TB, dir string, size int64) *Layer {
	return build(t, block.Env{Dir: dir, Size: size, Create: true})
}

func reopen(t testing.TB, dir string) *Layer {
	return build(t, block.Env{Dir: dir})
}

func random(seed uint64, n int64) []byte {
	var s [32]byte
	s[0], s[1] = byte(seed), byte(seed>>8)
	p := make([]byte, n)
	rand.NewChaCha8(s).Read(p)
	return p
}

// flip XORs the byte at off of the file at path with 0x5a.
func flip(t testing.TB, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func rawWrite(t testing.TB, path string, p []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(p, off); err != nil {
		t.Fatal(err)
	}
}

func rawRead(t testing.TB, path string, n, off int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := make([]byte, n)
	if _, err := f.ReadAt(p, off); err != nil {
		t.Fatal(err)
	}
	return p
}

// crash stops l the way a dying server would: no flush, nothing more
// written.
func crash(l *Layer) {
	l.closed.Store(true)
	l.bm.Close()
	l.child.Close()
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func readAll(t testing.TB, l block.Device) []byte {
	t.Helper()
	p := make([]byte, l.Size())
	must(t, l.ReadAt(p, 0))
	return p
}

func TestLayout(t *testing.T) {
	for _, n := range []int64{0, 1, 4095, 4096, 4097, GroupData - 1, GroupData, GroupData + 1, 3*GroupData + 5000, 1 << 40} {
		cs := ChildSize(n)
		if got := DataSize(cs); got != n {
			t.Errorf("DataSize(ChildSize(%d)) = %d", n, got)
		}
		if want := n + (n+ExtentData-1)/ExtentData*ExtentTables; cs != want {
			t.Errorf("ChildSize(%d) = %d, want %d", n, cs, want)
		}
	}
	// A child ending inside a table area holds none of its extent's data.
	if got := DataSize(extentSpan + 100); got != ExtentData {
		t.Errorf("DataSize of a child ending inside a table area = %d", got)
	}
	for _, c := range []struct{ off, want int64 }{
		{0, ExtentTables}, {GroupData + 5, ExtentTables + GroupData + 5},
		{ExtentData, extentSpan + ExtentTables}, {3*ExtentData + 7, 3*extentSpan + ExtentTables + 7},
	} {
		if got := dataOff(c.off); got != c.want {
			t.Errorf("dataOff(%d) = %d, want %d", c.off, got, c.want)
		}
		if dataOff(c.off)%ExtentTables != c.off%ExtentTables {
			t.Errorf("dataOff(%d) lost the alignment", c.off)
		}
	}
	// Tables and data never overlap: group g's table lies before its
	// extent's data and after the previous extent's.
	for _, g := range []int64{0, 1, ExtentGroups - 1, ExtentGroups, 5*ExtentGroups + 3} {
		x := g / ExtentGroups
		if to := tableOff(g); to < x*extentSpan || to+BlockSize > x*extentSpan+ExtentTables {
			t.Errorf("tableOff(%d) = %d outside extent %d's table area", g, to, x)
		}
	}
	// Entries: zeroes are 0 (fresh tables verify fresh data); a short
	// block is its zero-padded self; a single bit changes the entry.
	if entryOf(make([]byte, BlockSize)) != 0 || entryOf(make([]byte, 100)) != 0 {
		t.Error("a zero block's entry is not 0")
	}
	p := random(1, BlockSize)
	p[BlockSize-1], p[BlockSize-2] = 0, 0
	if entryOf(p) != entryOf(p[:BlockSize-2]) {
		t.Error("a short block is not checksummed zero-padded")
	}
	e := entryOf(p)
	p[77] ^= 1
	if entryOf(p) == e {
		t.Error("a flipped bit kept its entry")
	}
}

func TestConformance(t *testing.T) {
	for name, env := range map[string]block.Env{
		"aligned":   {Size: 8 << 20},
		"unaligned": {Size: 8<<20 + 12345}, // a partial group ending in a short block
	} {
		t.Run(name, func(t *testing.T) {
			env.Dir, env.Create = t.TempDir(), true
			blocktest.Conformance(t, env, spec, 400)
			// No block is left inconsistent: a scrub of the reopened
			// stack finds nothing.
			l := reopen(t, env.Dir)
			defer l.Close()
			rep, err := l.Scrub(context.Background(), nil)
			if err != nil || rep.Bad != 0 || rep.Checked != env.Size {
				t.Fatalf("scrub after conformance: %+v %v", rep, err)
			}
		})
	}
	t.Run("meta param", func(t *testing.T) {
		dir := t.TempDir()
		js := `{"type":"checksum","params":{"meta":"sub/cs.bits"},"children":[{"type":"file","params":{"path":"a.img"}}]}`
		blocktest.Conformance(t, block.Env{Dir: dir, Size: 1 << 20, Create: true}, js, 50)
		if _, err := os.Stat(filepath.Join(dir, "sub/cs.bits")); err != nil {
			t.Fatal(err)
		}
	})
}

func TestParamsAndChildSize(t *testing.T) {
	dir := t.TempDir()
	for _, js := range []string{
		`{"type":"checksum","params":{"meta":"x","colour":1},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"checksum","params":{"meta":""},"children":[{"type":"file","params":{"path":"b.img"}}]}`,
	} {
		if l, err := block.Build(block.Env{Dir: dir, Size: 1 << 20, Create: true}, blocktest.Spec(t, js)); err == nil {
			l.Close()
			t.Errorf("Build(%s) accepted it", js)
		}
	}
	size := int64(9<<20 + 3)
	l := create(t, filepath.Join(dir, "ok"), size)
	defer l.Close()
	st, err := os.Stat(filepath.Join(dir, "ok", "a.img"))
	must(t, err)
	if st.Size() != ChildSize(size) || l.Size() != size {
		t.Fatalf("child %d bytes (want %d), size %d (want %d)", st.Size(), ChildSize(size), l.Size(), size)
	}
	d := l.Describe()
	if d.Type != "checksum" || d.State != block.StateOK || len(d.Children) != 1 || d.Children[0].Type != "file" {
		t.Fatalf("describe: %+v", d)
	}
	var _ block.Parent = l
	var _ block.Resizer = l
	var _ block.Scrubber = l
}

func TestFreshVolumeReadsZeroes(t *testing.T) {
	dir := t.TempDir()
	size := int64(2*GroupData + 7000)
	for i, l := range []*Layer{create(t, dir, size), nil} {
		if i == 1 {
			l = reopen(t, dir)
		}
		got := readAll(t, l)
		if !bytes.Equal(got, make([]byte, size)) {
			t.Fatal("a fresh volume does not read zeroes")
		}
		// Unaligned, crossing groups, ending in the short last block.
		p := make([]byte, size-GroupData+333)
		must(t, l.ReadAt(p, GroupData-333))
		ex, err := l.Extents(0, size)
		must(t, err)
		for _, e := range ex {
			if !e.Zero {
				t.Fatalf("fresh extents: %+v", ex)
			}
		}
		rep, err := l.Scrub(context.Background(), nil)
		if err != nil || rep.Bad != 0 {
			t.Fatalf("scrub: %+v %v", rep, err)
		}
		must(t, l.Close())
	}
}

func TestCorruptDataIsDetected(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	size := int64(GroupData + 64<<10)
	l := create(t, dir, size)
	data := random(2, size)
	must(t, l.WriteAt(data, 0, false))
	must(t, l.Flush())

	// Flip a byte of data block 1030 (group 1, index 6), behind the
	// layer's back; the table is cached, the data is not.
	const bad = 1030
	flip(t, img, dataOff(bad*BlockSize)+17)
	check := func(l *Layer) {
		t.Helper()
		p := make([]byte, BlockSize)
		err := l.ReadAt(p, bad*BlockSize)
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("read of a flipped block: %v", err)
		}
		if !bytes.Equal(p, make([]byte, BlockSize)) {
			t.Fatal("a failed read left data in the buffer")
		}
		// Unaligned and multi-block reads that touch it fail too.
		for _, r := range [][2]int64{{bad*BlockSize + 100, 10}, {bad*BlockSize - 5000, 9000}, {0, size}} {
			p := make([]byte, r[1])
			if err := l.ReadAt(p, r[0]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("read %v: %v", r, err)
			}
			if bytes.Contains(p, data[bad*BlockSize+10:bad*BlockSize+30]) {
				t.Fatal("a failed read handed out bytes of the bad block")
			}
		}
		// Its neighbours are fine.
		p = make([]byte, 2*BlockSize)
		must(t, l.ReadAt(p, (bad+1)*BlockSize))
		if !bytes.Equal(p, data[(bad+1)*BlockSize:(bad+3)*BlockSize]) {
			t.Fatal("neighbour differs")
		}
		// Tried without waiting (table cached, data in the page cache),
		// the bad block is refused, the neighbours are answered.
		for _, r := range [][2]int64{{bad * BlockSize, BlockSize}, {(bad - 2) * BlockSize, 4 * BlockSize}} {
			if l.TryReadAt(make([]byte, r[1]), r[0]) {
				t.Fatalf("TryReadAt %v answered over a corrupt block", r)
			}
		}
		if block.TryReadAt(l.child, make([]byte, 2*BlockSize), dataOff((bad+1)*BlockSize)) {
			q := make([]byte, 2*BlockSize)
			if !l.TryReadAt(q, (bad+1)*BlockSize) || !bytes.Equal(q, p) {
				t.Fatal("TryReadAt of good, cached blocks: not answered, or wrong data")
			}
		}
		if l.Describe().State != block.StateDegraded {
			t.Fatalf("state after corruption: %s", l.Describe().State)
		}
		rep, err := l.Scrub(context.Background(), nil)
		if err != nil || rep.Bad != 1 || rep.Repaired != 0 || rep.Checked != size {
			t.Fatalf("scrub: %+v %v", rep, err)
		}
		// A partial write must not launder the block into a valid one.
		if err := l.WriteAt([]byte("x"), bad*BlockSize+5, false); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("partial write into a corrupt block: %v", err)
		}
		if err := l.WriteZeroes(bad*BlockSize+5, 10, block.ZeroFlags{}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("partial zero of a corrupt block: %v", err)
		}
	}
	check(l)
	must(t, l.Close())
	l = reopen(t, dir) // nothing cached now
	check(l)
	if s := l.Stats(); s.CorruptReads == 0 {
		t.Fatalf("stats: %+v", s)
	}
	// Overwriting the whole block heals it.
	must(t, l.WriteAt(data[bad*BlockSize:(bad+1)*BlockSize], bad*BlockSize, true))
	if got := readAll(t, l); !bytes.Equal(got, data) {
		t.Fatal("data differs after the rewrite")
	}
	if l.Describe().State != block.StateOK {
		t.Fatal("still degraded after the rewrite")
	}
	must(t, l.Close())
}

func TestCorruptTableIsDetected(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	size := int64(GroupData)
	l := create(t, dir, size)
	data := random(3, size)
	must(t, l.WriteAt(data, 0, false))
	must(t, l.Flush())
	const b = 4
	entry := tableOff(0) + 4*b + 2
	orig := rawRead(t, img, 1, entry)

	// With the table cached, reads still verify against what the layer
	// wrote; scrub reads the table from the child, sees the difference
	// and restores the entry from the cache.
	flip(t, img, entry)
	if got := readAll(t, l); !bytes.Equal(got, data) {
		t.Fatal("read differs")
	}
	rep, err := l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 1 || rep.Repaired != 1 {
		t.Fatalf("scrub of a flipped table entry: %+v %v", rep, err)
	}
	if !bytes.Equal(rawRead(t, img, 1, entry), orig) {
		t.Fatal("scrub did not restore the table entry")
	}

	// Without the cache, the flipped entry makes its block unreadable.
	flip(t, img, entry)
	must(t, l.Close())
	l = reopen(t, dir)
	defer l.Close()
	p := make([]byte, 3*BlockSize)
	if err := l.ReadAt(p, (b-1)*BlockSize); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read with a flipped table entry: %v", err)
	}
	must(t, l.ReadAt(p, (b+1)*BlockSize))
	rep, err = l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 1 || rep.Repaired != 0 {
		t.Fatalf("scrub: %+v %v", rep, err)
	}
}

// TestDataWrittenTableNot: a crash between a data write and its table
// write, simulated by writing the child behind the layer's back while the
// group is in flux, must not make the block unreadable; a group that is
// not in flux keeps detecting the same thing as corruption.
func TestDataWrittenTableNot(t *testing.T) {
	for _, ro := range []bool{false, true} {
		t.Run(map[bool]string{false: "read-write", true: "read-only"}[ro], func(t *testing.T) {
			dir := t.TempDir()
			img := filepath.Join(dir, "a.img")
			size := int64(2 * GroupData)
			l := create(t, dir, size)
			data := random(4, size)
			must(t, l.WriteAt(data, 0, false))
			must(t, l.Flush())
			// Group 0 is now in flux (an unflushed write); group 1 is not.
			q := random(5, BlockSize)
			must(t, l.WriteAt(q, 5*BlockSize, false))
			copy(data[5*BlockSize:], q)
			r := random(6, BlockSize)
			rawWrite(t, img, r, dataOff(7*BlockSize)) // landed, entry not
			copy(data[7*BlockSize:], r)
			rawWrite(t, img, r[:1000], dataOff(9*BlockSize)) // torn
			copy(data[9*BlockSize:], r[:1000])
			// The entry landed, the data not.
			rawWrite(t, img, []byte{1, 2, 3, 4}, tableOff(0)+4*11)
			flip(t, img, dataOff(GroupData+3*BlockSize)) // group 1: corruption
			crash(l)

			before := rawRead(t, img, BlockSize, tableOff(0))
			l = build(t, block.Env{Dir: dir, ReadOnly: ro})
			defer l.Close()
			got := make([]byte, GroupData)
			must(t, l.ReadAt(got, 0))
			if !bytes.Equal(got, data[:GroupData]) {
				t.Fatal("group 0 after recovery differs from what landed")
			}
			if s := l.Stats(); s.Reconciled != 1 {
				t.Fatalf("stats: %+v", s)
			}
			if err := l.ReadAt(got[:BlockSize], GroupData+3*BlockSize); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("corruption in a group not in flux: %v", err)
			}
			rep, err := l.Scrub(context.Background(), nil)
			if err != nil || rep.Bad != 1 {
				t.Fatalf("scrub: %+v %v", rep, err)
			}
			if after := rawRead(t, img, BlockSize, tableOff(0)); ro != bytes.Equal(before, after) {
				t.Fatalf("read-only %v, table rewritten %v", ro, !bytes.Equal(before, after))
			}
		})
	}
}

// TestConcurrent: writers own disjoint byte ranges that share blocks
// (and one crosses a group boundary), so their read-modify-writes and
// table updates race on the same blocks and tables; readers scan
// everything meanwhile. No update may be lost and no read may fail.
func TestConcurrent(t *testing.T) {
	dir := t.TempDir()
	size := int64(2 * GroupData)
	l := create(t, dir, size)
	type own struct{ off, n int64 }
	var owns []own
	for w := range int64(6) {
		owns = append(owns, own{w*10000 + 300, 9000})
	}
	owns = append(owns, own{GroupData - 3000, 6000}, own{GroupData + 3000, 20000})
	models := make([][]byte, len(owns))
	var wg sync.WaitGroup
	done := make(chan struct{})
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			p := make([]byte, 16<<10)
			for {
				select {
				case <-done:
					return
				default:
				}
				off := rng.Int64N(size - int64(len(p)))
				if err := l.ReadAt(p, off); err != nil {
					t.Errorf("concurrent read %d: %v", off, err)
					return
				}
			}
		}()
	}
	var writers sync.WaitGroup
	for w, o := range owns {
		models[w] = make([]byte, o.n)
		writers.Add(1)
		go func() {
			defer writers.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			m := models[w]
			for range 60 {
				a := rng.Int64N(o.n)
				n := rng.Int64N(o.n-a) + 1
				var err error
				switch rng.IntN(7) {
				case 0, 1, 2:
					p := make([]byte, n)
					for j := range p {
						p[j] = byte(rng.IntN(255) + 1)
					}
					err = l.WriteAt(p, o.off+a, rng.IntN(5) == 0)
					copy(m[a:], p)
				case 3:
					err = l.WriteZeroes(o.off+a, n, block.ZeroFlags{NoHole: rng.IntN(2) == 0})
					clear(m[a : a+n])
				case 4:
					if err = l.Trim(o.off+a, n, false); err == nil {
						err = l.ReadAt(m[a:a+n], o.off+a)
					}
				case 5:
					err = l.Flush()
				case 6:
					got := make([]byte, o.n)
					if err = l.ReadAt(got, o.off); err == nil && !bytes.Equal(got, m) {
						t.Errorf("writer %d: its bytes were changed by another", w)
						return
					}
				}
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		}()
	}
	writers.Wait()
	close(done)
	wg.Wait()
	check := func(l *Layer) {
		for w, o := range owns {
			got := make([]byte, o.n)
			must(t, l.ReadAt(got, o.off))
			if !bytes.Equal(got, models[w]) {
				t.Fatalf("writer %d's bytes differ", w)
			}
		}
	}
	check(l)
	must(t, l.Flush())
	must(t, l.Close())
	l = reopen(t, dir)
	defer l.Close()
	check(l)
	if s := l.Stats(); s.Reconciled != 0 {
		t.Fatalf("groups in flux after a flush: %+v", s)
	}
}

func TestZeroesAndTrim(t *testing.T) {
	dir := t.TempDir()
	size := int64(GroupData + 10000)
	l := create(t, dir, size)
	defer l.Close()
	model := random(8, size)
	must(t, l.WriteAt(model, 0, false))
	// Unaligned zeroes crossing a group, ending at the short last block.
	for _, r := range [][2]int64{{100, 50}, {GroupData - 5000, 12000}, {size - 3000, 3000}, {8192, 8192}} {
		must(t, l.WriteZeroes(r[0], r[1], block.ZeroFlags{FUA: true}))
		clear(model[r[0] : r[0]+r[1]])
	}
	// Trim zeroes whole blocks only.
	must(t, l.Trim(20000, 3*BlockSize, false))
	for b := int64(20000+BlockSize-1) / BlockSize; (b+1)*BlockSize <= 20000+3*BlockSize; b++ {
		clear(model[b*BlockSize : (b+1)*BlockSize])
	}
	if got := readAll(t, l); !bytes.Equal(got, model) {
		t.Fatal("contents differ after zeroes and trim")
	}
	// Blocks 5 and 6 were trimmed (holes in the child), 4 and 7 hold data.
	ex, err := l.Extents(4*BlockSize, 4*BlockSize)
	must(t, err)
	at, zero := int64(4*BlockSize), false
	for _, e := range ex {
		if e.Zero && !bytes.Equal(model[at:at+e.Length], make([]byte, e.Length)) {
			t.Fatalf("extent at %d claims zeroes", at)
		}
		zero = zero || e.Zero
		at += e.Length
	}
	if ex[0].Zero || !zero {
		t.Fatalf("extents over data then trimmed blocks: %+v", ex)
	}
	if err := l.WriteZeroes(0, BlockSize, block.ZeroFlags{Fast: true}); err != nil {
		t.Fatalf("fast zero over a file: %v", err)
	}
}

func TestResize(t *testing.T) {
	dir := t.TempDir()
	size := int64(5<<20 + 1000) // ends in a short block of a partial group
	l := create(t, dir, size)
	model := random(9, size)
	must(t, l.WriteAt(model, 0, false))
	must(t, l.Flush())
	n := int64(13<<20 + 7)
	must(t, l.Resize(n))
	if l.Size() != n {
		t.Fatalf("size %d after Resize(%d)", l.Size(), n)
	}
	st, err := os.Stat(filepath.Join(dir, "a.img"))
	must(t, err)
	if st.Size() != ChildSize(n) {
		t.Fatalf("child %d bytes, want %d", st.Size(), ChildSize(n))
	}
	model = append(model, make([]byte, n-size)...)
	if got := readAll(t, l); !bytes.Equal(got, model) {
		t.Fatal("contents after resize")
	}
	// Write across the old end (the old short block) and at the new end.
	p := random(10, 20000)
	must(t, l.WriteAt(p, size-9000, false))
	copy(model[size-9000:], p)
	must(t, l.WriteAt(p[:77], n-77, false))
	copy(model[n-77:], p[:77])
	must(t, l.Flush())
	if err := l.Resize(n - 1); err == nil {
		t.Fatal("shrink accepted")
	}
	must(t, l.Close())
	l = reopen(t, dir)
	defer l.Close()
	if l.Size() != n {
		t.Fatalf("size %d after reopen", l.Size())
	}
	if got := readAll(t, l); !bytes.Equal(got, model) {
		t.Fatal("contents after reopen")
	}
	rep, err := l.Scrub(context.Background(), nil)
	if err != nil || rep.Bad != 0 || rep.Checked != n {
		t.Fatalf("scrub: %+v %v", rep, err)
	}
}

func TestScrubProgressAndCancel(t *testing.T) {
	dir := t.TempDir()
	l := create(t, dir, 3*GroupData)
	defer l.Close()
	var last, total int64
	rep, err := l.Scrub(context.Background(), func(done, all int64) { last, total = done, all })
	if err != nil || last != 3*GroupData || total != 3*GroupData || rep.Checked != 3*GroupData {
		t.Fatalf("progress %d/%d, %+v %v", last, total, rep, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rep, err = l.Scrub(ctx, func(done, all int64) { cancel() })
	if !errors.Is(err, context.Canceled) || rep.Checked != GroupData {
		t.Fatalf("cancelled scrub: %+v %v", rep, err)
	}
}

func TestReadOnly(t *testing.T) {
	dir := t.TempDir()
	l := create(t, dir, GroupData)
	must(t, l.WriteAt(random(11, 8192), 0, false))
	must(t, l.Close()) // flushes: nothing left in flux
	l = build(t, block.Env{Dir: dir, ReadOnly: true})
	defer l.Close()
	if !l.Capabilities().ReadOnly {
		t.Fatal("not read-only")
	}
	if s := l.Stats(); s.Reconciled != 0 {
		t.Fatalf("in flux after a clean close: %+v", s)
	}
	for _, err := range []error{l.WriteAt(make([]byte, 10), 0, false), l.WriteZeroes(0, 10, block.ZeroFlags{}),
		l.Trim(0, 8192, false), l.Resize(2 * GroupData)} {
		if !errors.Is(err, block.ErrReadOnly) {
			t.Fatalf("write on read-only: %v", err)
		}
	}
	must(t, l.Flush())
}

// over builds a checksum layer of size bytes in dir over the file a.img
// (created, sparse, when create) wrapped by wrap: a child whose behaviour
// the test controls or observes.
func over[C block.Layer](t *testing.T, dir string, size int64, create bool, wrap func(*block.File) C) (*Layer, C) {
	t.Helper()
	path := filepath.Join(dir, "a.img")
	if create {
		f, err := os.Create(path)
		must(t, err)
		must(t, f.Truncate(ChildSize(size)))
		f.Close()
	}
	bf, err := block.OpenFile(path, false)
	must(t, err)
	c := wrap(bf)
	l, err := New(block.Env{Dir: dir, Size: size, Create: create}, nil, []block.Layer{c})
	must(t, err)
	return l.(*Layer), c
}

// flaky is a child whose writes can be made to fail after landing half
// their bytes: a failed write in a running system.
type flaky struct {
	*block.File
	fail atomic.Bool
}

func (f *flaky) WriteAt(p []byte, off int64, fua bool) error {
	if f.fail.Load() {
		f.File.WriteAt(p[:len(p)/2], off, fua)
		return errors.New("injected write failure")
	}
	return f.File.WriteAt(p, off, fua)
}

func (f *flaky) Describe() block.Node { return block.Node{Type: "flaky", State: block.StateOK} }

// TestFailedWriteIsReconciled: a write that fails after landing part of
// its data leaves the group stale; it is reconciled before its next use,
// so nothing reads as corrupt, and the next Flush leaves nothing in flux.
func TestFailedWriteIsReconciled(t *testing.T) {
	dir := t.TempDir()
	size := int64(GroupData)
	open := func(create bool) (*Layer, *flaky) {
		return over(t, dir, size, create, func(f *block.File) *flaky { return &flaky{File: f} })
	}
	l, c := open(true)
	old := random(12, 64<<10)
	must(t, l.WriteAt(old, 0, false))
	must(t, l.Flush())
	c.fail.Store(true)
	if err := l.WriteAt(random(13, 64<<10), 0, false); err == nil {
		t.Fatal("injected failure not reported")
	}
	c.fail.Store(false)
	got := make([]byte, 64<<10)
	must(t, l.ReadAt(got, 0)) // reconciles: whatever landed, no EIO
	if !bytes.Equal(got[32<<10:], old[32<<10:]) {
		t.Fatal("bytes the failed write never reached changed")
	}
	must(t, l.Flush())
	must(t, l.Close())
	l, _ = open(false)
	defer l.Close()
	if s := l.Stats(); s.Reconciled != 0 {
		t.Fatalf("in flux after flush: %+v", s)
	}
	again := make([]byte, 64<<10)
	must(t, l.ReadAt(again, 0))
	if !bytes.Equal(again, got) {
		t.Fatal("contents changed across reopen")
	}
}

func benchLayer(b *testing.B, raw bool) block.Device {
	dir := b.TempDir()
	size := int64(64 << 20)
	if raw {
		l, err := block.Build(block.Env{Dir: dir, Size: size, Create: true}, blocktest.Spec(b, `{"type":"file","params":{"path":"a.img"}}`))
		must(b, err)
		return l
	}
	return create(b, dir, size)
}

func BenchmarkWrite4K(b *testing.B) {
	for _, raw := range []bool{true, false} {
		b.Run(map[bool]string{true: "file", false: "checksum"}[raw], func(b *testing.B) {
			l := benchLayer(b, raw)
			defer l.Close()
			p := random(1, 4096)
			rng := rand.New(rand.NewPCG(1, 1))
			b.SetBytes(4096)
			for b.Loop() {
				must(b, l.WriteAt(p, rng.Int64N(l.Size()/4096)*4096, false))
			}
		})
	}
}

func BenchmarkRead64K(b *testing.B) {
	for _, raw := range []bool{true, false} {
		b.Run(map[bool]string{true: "file", false: "checksum"}[raw], func(b *testing.B) {
			l := benchLayer(b, raw)
			defer l.Close()
			must(b, l.WriteAt(random(2, l.Size()), 0, false))
			p := make([]byte, 64<<10)
			rng := rand.New(rand.NewPCG(1, 1))
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				must(b, l.ReadAt(p, rng.Int64N(l.Size()/int64(len(p)))*int64(len(p))))
			}
		})
	}
}

// Growing across an extent boundary puts the new extent's table area after
// the old extent's data; what was written on both sides survives, verifies
// and reopens. (Sparse files: 4 GiB costs nothing.)
func TestResizeAcrossExtents(t *testing.T) {
	dir := t.TempDir()
	size := int64(ExtentData - 3*GroupData + 1000) // a partial group, 3 short of the extent
	l := create(t, dir, size)
	head, tail := random(11, 9000), random(12, 5000)
	must(t, l.WriteAt(head, 0, false))
	must(t, l.WriteAt(tail, size-int64(len(tail)), false))
	must(t, l.Flush())
	n := int64(ExtentData + 2*GroupData + 77)
	must(t, l.Resize(n))
	st, err := os.Stat(filepath.Join(dir, "a.img"))
	must(t, err)
	if st.Size() != ChildSize(n) || l.Size() != n {
		t.Fatalf("child %d bytes (want %d), size %d (want %d)", st.Size(), ChildSize(n), l.Size(), n)
	}
	across := random(13, 3*GroupData)
	at := int64(ExtentData - GroupData - 4096)
	must(t, l.WriteAt(across, at, false))
	must(t, l.Flush())
	must(t, l.Close())
	l = reopen(t, dir)
	defer l.Close()
	check := func(off int64, want []byte) {
		t.Helper()
		got := make([]byte, len(want))
		must(t, l.ReadAt(got, off))
		if !bytes.Equal(got, want) {
			t.Fatalf("%d bytes at %d differ after reopen", len(want), off)
		}
	}
	check(0, head)
	check(size-int64(len(tail)), tail)
	check(at, across)
	check(n-4096, make([]byte, 4096))
	// Scrub only the tables' extent boundary, not 4 GiB of holes: reading
	// every group's edge is enough to prove each table verifies its data.
	for g := int64(0); g < groupsFor(n); g += ExtentGroups / 8 {
		p := make([]byte, 4096)
		must(t, l.ReadAt(p, g*GroupData))
	}
}
