package superblock

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// memFile is an in-memory File whose next write can be torn: only the
// bytes selected by tear are applied, then every later call fails (the
// machine "crashed").
type memFile struct {
	data    []byte
	tear    func(i int) bool // which bytes of the torn write land
	tearing bool
	crashed bool
}

func (m *memFile) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(m.data)) {
		clear(p)
		return 0, nil
	}
	n := copy(p, m.data[off:])
	clear(p[n:])
	return len(p), nil
}

func (m *memFile) WriteAt(p []byte, off int64) (int, error) {
	if m.crashed {
		return 0, errors.New("crashed")
	}
	if need := int(off) + len(p); need > len(m.data) {
		m.data = append(m.data, make([]byte, need-len(m.data))...)
	}
	for i := range p {
		if !m.tearing || m.tear(i) {
			m.data[int(off)+i] = p[i]
		}
	}
	if m.tearing {
		m.crashed = true
		return 0, errors.New("crashed mid-write")
	}
	return len(p), nil
}

func (m *memFile) Sync() error {
	if m.crashed {
		return errors.New("crashed")
	}
	return nil
}
func (m *memFile) Close() error { return nil }

func TestRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sb")
	b, err := Create(p, 8192, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := b.Write([]byte(fmt.Sprintf("v%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	b, got, err := Open(p)
	if err != nil || string(got) != "v4" || b.Generation() != 6 || b.Capacity() != 8192-headerSize {
		t.Fatalf("got %q gen %d cap %d err %v", got, b.Generation(), b.Capacity(), err)
	}
	if err := b.Write(make([]byte, b.Capacity()+1)); err == nil {
		t.Fatal("oversized payload accepted")
	}
	if _, err := Create(p, 4096, nil); err == nil {
		t.Fatal("Create over an existing file succeeded")
	}
}

// TestTornWrites crashes an update at every byte of its write, and with
// random sector subsets landing, and checks that Open always yields the old
// or the new payload, never anything else.
func TestTornWrites(t *testing.T) {
	oldP := bytes.Repeat([]byte("old-payload "), 50)
	newP := bytes.Repeat([]byte("NEW PAYLOAD!"), 60)
	base := &memFile{}
	b := &Block{f: base, slotSize: 4096}
	for i := 0; i < 3; i++ { // a few generations so both slots hold data
		if err := b.Write(oldP); err != nil {
			t.Fatal(err)
		}
	}
	writeLen := headerSize + len(newP)
	check := func(name string, tear func(int) bool) {
		m := &memFile{data: bytes.Clone(base.data), tear: tear, tearing: true}
		bb := &Block{f: m, slotSize: 4096, gen: b.gen, cur: b.cur}
		bb.Write(newP) // crashes
		_, got, err := OpenFile(&memFile{data: m.data})
		if err != nil {
			t.Fatalf("%s: open after crash: %v", name, err)
		}
		if !bytes.Equal(got, oldP) && !bytes.Equal(got, newP) {
			t.Fatalf("%s: read neither old nor new payload (%d bytes)", name, len(got))
		}
	}
	for k := 0; k <= writeLen; k++ {
		check(fmt.Sprintf("prefix %d", k), func(i int) bool { return i < k })
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for trial := 0; trial < 500; trial++ {
		sectors := map[int]bool{}
		for s := 0; s <= writeLen/512; s++ {
			sectors[s] = rng.IntN(2) == 0
		}
		check(fmt.Sprintf("sectors trial %d", trial), func(i int) bool { return sectors[i/512] })
	}
	// A complete write with the crash only at Sync is the new payload.
	m := &memFile{data: bytes.Clone(base.data)}
	bb := &Block{f: m, slotSize: 4096, gen: b.gen, cur: b.cur}
	if err := bb.Write(newP); err != nil {
		t.Fatal(err)
	}
	if _, got, _ := OpenFile(&memFile{data: m.data}); !bytes.Equal(got, newP) {
		t.Fatal("completed write not read back")
	}
}

func TestCorruptBothCopies(t *testing.T) {
	m := &memFile{}
	b := &Block{f: m, slotSize: 4096}
	b.Write([]byte("a"))
	b.Write([]byte("b"))
	m.data[headerSize] ^= 0xff // slot 0 payload
	m.data[4096+9] ^= 1        // slot 1 generation
	if _, _, err := OpenFile(m); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("want ErrCorrupt, got %v", err)
	}
}

func FuzzOpen(f *testing.F) {
	m := &memFile{}
	b := &Block{f: m, slotSize: 4096}
	b.Write([]byte("seed"))
	b.Write([]byte("seed2"))
	f.Add(m.data)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		blk, p, err := OpenFile(&memFile{data: data})
		if err != nil {
			return
		}
		if len(p) > blk.Capacity() {
			t.Fatalf("payload %d beyond capacity %d", len(p), blk.Capacity())
		}
	})
}
