package crypt

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/cow"
	"github.com/basalt-storage/basalt/internal/block/fault"
	_ "github.com/basalt-storage/basalt/internal/block/file"
	_ "github.com/basalt-storage/basalt/internal/block/stripe"
	"github.com/basalt-storage/basalt/internal/block/superblock"
	"golang.org/x/crypto/xts"
)

// gcmKeys is a block.Keys like the cluster's: AES-256-GCM under a random
// cluster key. It remembers the keys it wrapped so tests can look for them
// on disk.
type gcmKeys struct {
	aead cipher.AEAD
	mu   sync.Mutex
	seen [][]byte
}

func newKeys(t testing.TB) *gcmKeys {
	k := make([]byte, 32)
	rand.Read(k)
	b, err := aes.NewCipher(k)
	if err != nil {
		t.Fatal(err)
	}
	a, err := cipher.NewGCM(b)
	if err != nil {
		t.Fatal(err)
	}
	return &gcmKeys{aead: a}
}

func (k *gcmKeys) Wrap(key []byte) ([]byte, error) {
	k.mu.Lock()
	k.seen = append(k.seen, append([]byte(nil), key...))
	k.mu.Unlock()
	nonce := make([]byte, k.aead.NonceSize())
	rand.Read(nonce)
	return k.aead.Seal(nonce, nonce, key, []byte("basalt data key")), nil
}

func (k *gcmKeys) Unwrap(w []byte) ([]byte, error) {
	ns := k.aead.NonceSize()
	if len(w) < ns {
		return nil, errors.New("wrapped key too short")
	}
	return k.aead.Open(nil, w[:ns], w[ns:], []byte("basalt data key"))
}

// xorKeys is a wrapper that does not authenticate: Unwrap with the wrong
// pad returns a wrong key without an error. The header MAC must catch it.
type xorKeys struct{ pad byte }

func (k xorKeys) Wrap(key []byte) ([]byte, error) { return k.Unwrap(key) }
func (k xorKeys) Unwrap(w []byte) ([]byte, error) {
	out := make([]byte, len(w))
	for i := range w {
		out[i] = w[i] ^ k.pad
	}
	return out, nil
}

// clearKeys "wraps" by returning the key itself: must be refused.
type clearKeys struct{}

func (clearKeys) Wrap(key []byte) ([]byte, error) { return append([]byte("hdr"), key...), nil }
func (clearKeys) Unwrap(w []byte) ([]byte, error) { return w[3:], nil }

const spec = `{"type":"crypt","children":[{"type":"file","params":{"path":"a.img"}}]}`

func build(t testing.TB, env block.Env) block.Layer {
	t.Helper()
	l, err := block.Build(env, blocktest.Spec(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func pattern(n int, seed uint64) []byte {
	r := mrand.New(mrand.NewPCG(seed, 7))
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.IntN(256))
	}
	return p
}

func mustRead(t testing.TB, l block.Device, off, n int64) []byte {
	t.Helper()
	p := make([]byte, n)
	if err := l.ReadAt(p, off); err != nil {
		t.Fatalf("read %d+%d: %v", off, n, err)
	}
	return p
}

func TestConformance(t *testing.T) {
	for name, c := range map[string]struct {
		size int64
		spec string
		ops  int
	}{
		"file": {8 << 20, spec, 400},
		// An unaligned size (partial last sector) over a striped child;
		// fewer operations, as the race detector makes each costly.
		"stripe-unaligned": {8<<20 + 1000, `{"type":"crypt","children":[{"type":"stripe","params":{"chunk":8192},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}]}`, 150},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := block.Env{Dir: t.TempDir(), Size: c.size, Create: true, Keys: newKeys(t)}
			blocktest.Conformance(t, env, c.spec, c.ops)
			env.Create = false
			l, err := block.Build(env, blocktest.Spec(t, c.spec))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if l.Size() != c.size {
				t.Fatalf("size %d after reopen, want %d", l.Size(), c.size)
			}
		})
	}
}

// TestNoPlaintextOnDisk writes a recognisable pattern everywhere, aligned
// and not, and checks the backing file holds neither it nor the data key,
// and that its data area is exactly the documented format (AES-256-XTS,
// tweak = sector number, data at DataOffset).
func TestNoPlaintextOnDisk(t *testing.T) {
	keys := newKeys(t)
	env := block.Env{Dir: t.TempDir(), Size: 2 << 20, Create: true, Keys: keys}
	l := build(t, env)
	marker := []byte("BASALT-PLAINTEXT-PATTERN-0123456789abcdef!")
	full := bytes.Repeat(marker, int(env.Size)/len(marker)+1)[:env.Size]
	for off := int64(0); off < env.Size; off += 64 << 10 {
		if err := l.WriteAt(full[off:off+64<<10], off, false); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range [][2]int64{{100, 5000}, {4095, 2}, {123457, 77777}, {env.Size - 33, 33}} {
		if err := l.WriteAt(full[w[0]:w[0]+w[1]], w[0], w[1]%2 == 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := mustRead(t, l, 0, env.Size); !bytes.Equal(got, full) {
		t.Fatal("read back differs")
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	img, err := os.ReadFile(filepath.Join(env.Dir, "a.img"))
	if err != nil {
		t.Fatal(err)
	}
	for _, frag := range [][]byte{marker, marker[:12], marker[20:32]} {
		if bytes.Contains(img, frag) {
			t.Fatalf("backing file contains plaintext %q", frag)
		}
	}
	if len(keys.seen) != 1 || len(keys.seen[0]) != KeySize {
		t.Fatalf("wrapped %d keys", len(keys.seen))
	}
	key := keys.seen[0]
	for i := 0; i+8 <= len(key); i += 4 {
		if bytes.Contains(img, key[i:i+8]) {
			t.Fatalf("backing file contains 8 bytes of the data key at key offset %d", i)
		}
	}
	if !bytes.Equal(img[headerArea:DataOffset], make([]byte, DataOffset-headerArea)) {
		t.Fatal("reserved area [8 KiB, DataOffset) is not zero")
	}
	c, err := xts.NewCipher(aes.NewCipher, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range []int64{0, 1, 37, env.Size/SectorSize - 1} {
		pt := make([]byte, SectorSize)
		c.Decrypt(pt, img[DataOffset+sec*SectorSize:][:SectorSize], uint64(sec))
		if !bytes.Equal(pt, full[sec*SectorSize:][:SectorSize]) {
			t.Fatalf("sector %d on disk is not AES-256-XTS(sector number) of the plaintext", sec)
		}
	}
}

func TestFreshVolumeReadsZeroes(t *testing.T) {
	env := block.Env{Dir: t.TempDir(), Size: 4<<20 + 512, Create: true, Keys: newKeys(t)}
	l := build(t, env)
	defer l.Close()
	if l.Size() != env.Size {
		t.Fatalf("size %d, want %d", l.Size(), env.Size)
	}
	if got := mustRead(t, l, 0, env.Size); !bytes.Equal(got, make([]byte, env.Size)) {
		t.Fatal("fresh volume does not read as zeroes")
	}
	ex, err := l.Extents(0, env.Size)
	if err != nil || len(ex) != 1 || !ex[0].Zero || !ex[0].Hole || ex[0].Length != env.Size {
		t.Fatalf("extents of a fresh volume: %+v %v", ex, err)
	}
	// Plaintext zeroes written are encrypted like anything else.
	if err := l.WriteAt(make([]byte, 3*SectorSize), SectorSize, false); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, l, 0, 5*SectorSize); !bytes.Equal(got, make([]byte, 5*SectorSize)) {
		t.Fatal("written zeroes do not read back as zeroes")
	}
	ex, err = l.Extents(0, 5*SectorSize)
	if err != nil || len(ex) != 3 || ex[1].Zero || ex[1].Length != 3*SectorSize {
		t.Fatalf("extents after a write: %+v %v", ex, err)
	}
	// An unaligned query starting and ending mid-sector is clipped.
	ex, err = l.Extents(100, 2*SectorSize)
	if err != nil || ex[0].Length != SectorSize-100 || !ex[0].Zero || ex[1].Zero {
		t.Fatalf("unaligned extents: %+v %v", ex, err)
	}
}

// TestExtentsPartialZero: a child reporting a zero range that covers only
// part of a sector must not make crypt call that sector zero (its
// plaintext is not).
func TestExtentsPartialZero(t *testing.T) {
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true, Keys: newKeys(t)}
	l := build(t, env)
	defer l.Close()
	if err := l.WriteAt(pattern(2*SectorSize, 1), 0, false); err != nil {
		t.Fatal(err)
	}
	cl := l.(*Layer)
	cl.child = &fakeExtents{Layer: cl.child, ex: []block.Extent{{Length: 1000}, {Length: 2*SectorSize - 2000, Zero: true}, {Length: 50}}}
	ex, err := l.Extents(0, 3*SectorSize)
	if err != nil {
		t.Fatal(err)
	}
	// The zero range covers no sector entirely: all data; the answer ends
	// mid-sector 1, which is reported as data up to its end.
	if len(ex) != 1 || ex[0].Zero || ex[0].Hole || ex[0].Length != 2*SectorSize {
		t.Fatalf("got %+v", ex)
	}
	cl.child = &fakeExtents{Layer: cl.child.(*fakeExtents).Layer, ex: []block.Extent{{Length: 10}, {Length: 2*SectorSize + 10, Zero: true, Hole: true}}}
	ex, err = l.Extents(0, 3*SectorSize)
	if err != nil || len(ex) != 3 || ex[0].Zero || ex[0].Length != SectorSize ||
		!ex[1].Zero || !ex[1].Hole || ex[1].Length != SectorSize || ex[2].Zero || ex[2].Length != SectorSize {
		t.Fatalf("got %+v %v", ex, err)
	}
}

type fakeExtents struct {
	block.Layer
	ex []block.Extent
}

func (f *fakeExtents) Extents(off, n int64) ([]block.Extent, error) { return f.ex, nil }

func TestUnalignedZeroesAndTrim(t *testing.T) {
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true, Keys: newKeys(t)}
	l := build(t, env)
	defer l.Close()
	model := pattern(int(env.Size), 2)
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	for _, z := range [][2]int64{{100, 50}, {SectorSize - 10, 20}, {3*SectorSize + 1, 5 * SectorSize}, {8 * SectorSize, 2 * SectorSize}, {env.Size - 7, 7}} {
		for _, noHole := range []bool{false, true} {
			if err := l.WriteZeroes(z[0], z[1], block.ZeroFlags{NoHole: noHole}); err != nil {
				t.Fatal(err)
			}
		}
		clear(model[z[0] : z[0]+z[1]])
	}
	if got := mustRead(t, l, 0, env.Size); !bytes.Equal(got, model) {
		t.Fatal("unaligned write-zeroes damaged neighbouring bytes or left data")
	}
	// Trim of [20 KiB+5, 40 KiB+5): whole sectors 6..9 become holes (zero),
	// the partial edge sectors keep their data.
	model = pattern(int(env.Size), 3)
	if err := l.WriteAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Trim(5*SectorSize+5, 5*SectorSize, false); err != nil {
		t.Fatal(err)
	}
	clear(model[6*SectorSize : 10*SectorSize])
	if got := mustRead(t, l, 0, env.Size); !bytes.Equal(got, model) {
		t.Fatal("trim touched partial sectors or did not zero whole ones")
	}
	if err := l.Trim(100, 200, true); err != nil { // no whole sector: nothing
		t.Fatal(err)
	}
	if got := mustRead(t, l, 0, SectorSize); !bytes.Equal(got, model[:SectorSize]) {
		t.Fatal("trim inside one sector changed it")
	}
}

func TestClusterKeys(t *testing.T) {
	dir := t.TempDir()
	keys := newKeys(t)
	l := build(t, block.Env{Dir: dir, Size: 1 << 20, Create: true, Keys: keys})
	data := pattern(10000, 4)
	if err := l.WriteAt(data, 777, true); err != nil {
		t.Fatal(err)
	}
	l.Close()

	_, err := block.Build(block.Env{Dir: dir}, blocktest.Spec(t, spec))
	if !errors.Is(err, ErrNoKeys) {
		t.Fatalf("open without Keys: %v", err)
	}
	_, err = block.Build(block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}, blocktest.Spec(t, spec))
	if !errors.Is(err, ErrNoKeys) {
		t.Fatalf("create without Keys: %v", err)
	}
	_, err = block.Build(block.Env{Dir: dir, Keys: newKeys(t)}, blocktest.Spec(t, spec))
	if err == nil || !strings.Contains(err.Error(), "wrong cluster key") {
		t.Fatalf("open with another cluster key: %v", err)
	}
	_, err = block.Build(block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true, Keys: clearKeys{}}, blocktest.Spec(t, spec))
	if err == nil || !strings.Contains(err.Error(), "in the clear") {
		t.Fatalf("a wrapper returning the key in the clear was accepted: %v", err)
	}

	// A wrapper that does not authenticate returns a wrong key silently:
	// the header MAC catches it.
	dir2 := t.TempDir()
	l = build(t, block.Env{Dir: dir2, Size: 1 << 20, Create: true, Keys: xorKeys{pad: 0x5a}})
	l.Close()
	_, err = block.Build(block.Env{Dir: dir2, Keys: xorKeys{pad: 0x3c}}, blocktest.Spec(t, spec))
	if !errors.Is(err, ErrKeyCheck) {
		t.Fatalf("wrong key from a non-authenticating wrapper: %v", err)
	}
	l = build(t, block.Env{Dir: dir2, Keys: xorKeys{pad: 0x5a}})
	l.Close()

	l = build(t, block.Env{Dir: dir, Keys: keys})
	defer l.Close()
	if got := mustRead(t, l, 777, 10000); !bytes.Equal(got, data) {
		t.Fatal("data lost")
	}
}

// rewriteHeader edits the current header payload and writes it back as a
// new, validly checksummed superblock generation — what an attacker with
// access to the disk could do.
func rewriteHeader(t *testing.T, path string, edit func(p []byte) []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sb, p, err := superblock.OpenFile(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Write(edit(append([]byte(nil), p...))); err != nil {
		t.Fatal(err)
	}
}

func TestTamperedHeader(t *testing.T) {
	sizeAt := 8 + 4 + 4 + 8
	for name, c := range map[string]struct {
		edit func(p []byte) []byte
		want string
	}{
		"size": {func(p []byte) []byte {
			binary.BigEndian.PutUint64(p[sizeAt:], 1<<20+SectorSize)
			return p
		}, "key check failed"},
		"mac":     {func(p []byte) []byte { p[len(p)-1] ^= 1; return p }, "key check failed"},
		"wrapped": {func(p []byte) []byte { p[len(p)-macSize-5] ^= 1; return p }, "unwrap data key"},
		"cipher":  {func(p []byte) []byte { return bytes.Replace(p, []byte("aes-256"), []byte("aes-128"), 1) }, "cipher"},
		"version": {func(p []byte) []byte { p[11] = 9; return p }, "format version 9"},
		"kind":    {func(p []byte) []byte { p[0] = 'X'; return p }, "kind"},
	} {
		t.Run(name, func(t *testing.T) {
			keys := newKeys(t)
			dir := t.TempDir()
			l := build(t, block.Env{Dir: dir, Size: 1 << 20, Create: true, Keys: keys})
			l.Close()
			rewriteHeader(t, filepath.Join(dir, "a.img"), c.edit)
			_, err := block.Build(block.Env{Dir: dir, Keys: keys}, blocktest.Spec(t, spec))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("tampered header (%s): got %v, want an error about %q", name, err, c.want)
			}
		})
	}
	// Damage (no valid checksum in either slot) is reported as such.
	keys := newKeys(t)
	dir := t.TempDir()
	l := build(t, block.Env{Dir: dir, Size: 1 << 20, Create: true, Keys: keys})
	l.Close()
	corrupt(t, filepath.Join(dir, "a.img"), HeaderSlot+40)
	if _, err := block.Build(block.Env{Dir: dir, Keys: keys}, blocktest.Spec(t, spec)); !errors.Is(err, ErrNoHeader) {
		t.Fatalf("damaged header: %v", err)
	}
	// A child that was never a crypt volume.
	dir = t.TempDir()
	b, err := block.Build(block.Env{Dir: dir, Size: 1 << 20, Create: true}, blocktest.Spec(t, `{"type":"file","params":{"path":"a.img"}}`))
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := block.Build(block.Env{Dir: dir, Keys: keys}, blocktest.Spec(t, spec)); !errors.Is(err, ErrNoHeader) {
		t.Fatalf("plain zero child: %v", err)
	}
}

func corrupt(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	f.ReadAt(b, off)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestHeaderSlotFallback: after create (generation 1, slot 1) and a resize
// (generation 2, slot 0), damaging either slot leaves the other opening,
// with the size it recorded and the data intact.
func TestHeaderSlotFallback(t *testing.T) {
	keys := newKeys(t)
	base := t.TempDir()
	l := build(t, block.Env{Dir: base, Size: 1 << 20, Create: true, Keys: keys})
	data := pattern(1<<20, 5)
	if err := l.WriteAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.(block.Resizer).Resize(2<<20 + 3); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	img, err := os.ReadFile(filepath.Join(base, "a.img"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		slot int64
		want int64
	}{{0, 1 << 20}, {1, 2<<20 + 3}} {
		dir := t.TempDir()
		path := filepath.Join(dir, "a.img")
		if err := os.WriteFile(path, img, 0o600); err != nil {
			t.Fatal(err)
		}
		corrupt(t, path, c.slot*HeaderSlot+60)
		l := build(t, block.Env{Dir: dir, Keys: keys})
		if l.Size() != c.want {
			t.Fatalf("slot %d damaged: size %d, want %d", c.slot, l.Size(), c.want)
		}
		if got := mustRead(t, l, 0, 1<<20); !bytes.Equal(got, data) {
			t.Fatalf("slot %d damaged: data differs", c.slot)
		}
		// The surviving copy can be updated again (the next generation
		// goes to the damaged slot).
		if err := l.(block.Resizer).Resize(3 << 20); err != nil {
			t.Fatal(err)
		}
		l.Close()
		l = build(t, block.Env{Dir: dir, Keys: keys})
		if l.Size() != 3<<20 {
			t.Fatalf("size %d after a resize over a damaged slot", l.Size())
		}
		l.Close()
	}
}

// crashDev is a child that "crashes" at its WriteAt number crashAt: only
// the bytes tear selects land (the data file keeps what landed, as a real
// disk would), and every later mutation or flush fails.
type crashDev struct {
	block.Layer
	mu      sync.Mutex
	crashAt int
	tear    func(n int) func(int) bool
	writes  int
	crashed bool
}

var errCrash = errors.New("crashDev: crashed")

func (d *crashDev) WriteAt(p []byte, off int64, fua bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.crashed {
		return errCrash
	}
	k := d.writes
	d.writes++
	if k != d.crashAt {
		return d.Layer.WriteAt(p, off, fua)
	}
	d.crashed = true
	if d.tear != nil {
		cur := make([]byte, len(p))
		if err := d.Layer.ReadAt(cur, off); err != nil {
			panic(err)
		}
		sel := d.tear(len(p))
		for i := range p {
			if sel(i) {
				cur[i] = p[i]
			}
		}
		if err := d.Layer.WriteAt(cur, off, false); err != nil {
			panic(err)
		}
	}
	return errCrash
}

func (d *crashDev) fail() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.crashed {
		return errCrash
	}
	return nil
}

func (d *crashDev) Flush() error {
	if err := d.fail(); err != nil {
		return err
	}
	return d.Layer.Flush()
}

func (d *crashDev) Resize(n int64) error {
	if err := d.fail(); err != nil {
		return err
	}
	return d.Layer.(block.Resizer).Resize(n)
}

func (d *crashDev) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if err := d.fail(); err != nil {
		return err
	}
	return d.Layer.WriteZeroes(off, n, f)
}

func (d *crashDev) Trim(off, n int64, fua bool) error {
	if err := d.fail(); err != nil {
		return err
	}
	return d.Layer.Trim(off, n, fua)
}

// tears: nothing lands, the first half, all but the last byte, and every
// other 512-byte sector.
var tears = map[string]func(n int) func(int) bool{
	"none":       nil,
	"half":       fault.Half,
	"allButLast": func(n int) func(int) bool { return func(i int) bool { return i < n-1 } },
	"oddSectors": func(int) func(int) bool { return func(i int) bool { return i/512%2 == 1 } },
}

// fileChild opens (or creates) the file layer at dir/a.img.
func fileChild(t *testing.T, dir string, create bool, size int64) block.Layer {
	t.Helper()
	c, err := block.Build(block.Env{Dir: dir, Size: size, Create: create}, blocktest.Spec(t, `{"type":"file","params":{"path":"a.img"}}`))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCrashDuringCreate: a crash at any header write of a create, torn in
// any way, leaves a child that either fails to open with ErrNoHeader (the
// create never completed; nothing was acknowledged) or opens as the fresh
// volume — never garbage.
func TestCrashDuringCreate(t *testing.T) {
	const size = 1 << 20
	csize, _ := childSize(nil, size, 1)
	count := &crashDev{Layer: fileChild(t, t.TempDir(), true, csize), crashAt: -1}
	l, err := New(block.Env{Size: size, Create: true, Keys: newKeys(t)}, nil, []block.Layer{count})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	n := count.writes
	if n < 2 {
		t.Fatalf("create made %d writes", n)
	}
	for k := 0; k < n; k++ {
		for name, tear := range tears {
			keys := newKeys(t)
			dir := t.TempDir()
			d := &crashDev{Layer: fileChild(t, dir, true, csize), crashAt: k, tear: tear}
			if l, err := New(block.Env{Size: size, Create: true, Keys: keys}, nil, []block.Layer{d}); err == nil {
				l.Close()
				t.Fatalf("write %d %s: create succeeded through a crash", k, name)
			}
			d.Close()
			l, err := New(block.Env{Keys: keys}, nil, []block.Layer{fileChild(t, dir, false, 0)})
			if err != nil {
				if !errors.Is(err, ErrNoHeader) {
					t.Fatalf("write %d %s: reopen: %v", k, name, err)
				}
				continue
			}
			if l.Size() != size || !bytes.Equal(mustRead(t, l, 0, size), make([]byte, size)) {
				t.Fatalf("write %d %s: reopened volume is not the fresh one", k, name)
			}
			l.Close()
		}
	}
}

// TestCrashDuringResize: a crash at any write of a resize, torn any way,
// leaves a volume that opens with the old or the new size, with every
// flushed byte intact, and that can be resized again.
func TestCrashDuringResize(t *testing.T) {
	const size, grown = 1 << 20, 3<<20 + 100
	keys := newKeys(t)
	base := t.TempDir()
	l := build(t, block.Env{Dir: base, Size: size, Create: true, Keys: keys})
	data := pattern(size, 6)
	if err := l.WriteAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	img, err := os.ReadFile(filepath.Join(base, "a.img"))
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "a.img"), img, 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	count := &crashDev{Layer: fileChild(t, fresh(), false, 0), crashAt: -1}
	l, err = New(block.Env{Keys: keys}, nil, []block.Layer{count})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.(block.Resizer).Resize(grown); err != nil {
		t.Fatal(err)
	}
	l.Close()
	n := count.writes
	if n < 1 {
		t.Fatal("resize wrote nothing")
	}
	for k := 0; k < n; k++ {
		for name, tear := range tears {
			dir := fresh()
			d := &crashDev{Layer: fileChild(t, dir, false, 0), crashAt: k, tear: tear}
			l, err := New(block.Env{Keys: keys}, nil, []block.Layer{d})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.(block.Resizer).Resize(grown); err == nil {
				t.Fatalf("write %d %s: resize succeeded through a crash", k, name)
			}
			if l.Size() != size {
				t.Fatalf("write %d %s: failed resize changed the size to %d", k, name, l.Size())
			}
			l.Close()
			l = build(t, block.Env{Dir: dir, Keys: keys})
			if s := l.Size(); s != size && s != grown {
				t.Fatalf("write %d %s: size %d after the crash", k, name, s)
			}
			if !bytes.Equal(mustRead(t, l, 0, size), data) {
				t.Fatalf("write %d %s: flushed data lost", k, name)
			}
			if err := l.(block.Resizer).Resize(grown); err != nil {
				t.Fatalf("write %d %s: resize after the crash: %v", k, name, err)
			}
			if got := mustRead(t, l, size, grown-size); !bytes.Equal(got, make([]byte, grown-size)) {
				t.Fatalf("write %d %s: grown area is not zero", k, name)
			}
			l.Close()
			l = build(t, block.Env{Dir: dir, Keys: keys})
			if l.Size() != grown {
				t.Fatalf("write %d %s: size %d after resizing again", k, name, l.Size())
			}
			l.Close()
		}
	}
}

// TestCrashDuringData: writes acknowledged with FUA, or before a
// successful Flush, survive a crash that tears a later data write.
func TestCrashDuringData(t *testing.T) {
	keys := newKeys(t)
	dir := t.TempDir()
	l := build(t, block.Env{Dir: dir, Size: 1 << 20, Create: true, Keys: keys})
	l.Close()
	for name, tear := range tears {
		d := &crashDev{Layer: fileChild(t, dir, false, 0), crashAt: -1, tear: tear}
		l, err := New(block.Env{Keys: keys}, nil, []block.Layer{d})
		if err != nil {
			t.Fatal(err)
		}
		a, b := pattern(50000, 7), pattern(30000, 8)
		if err := l.WriteAt(a, 1001, true); err != nil {
			t.Fatal(err)
		}
		if err := l.WriteAt(b, 200000, false); err != nil {
			t.Fatal(err)
		}
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
		d.mu.Lock()
		d.crashAt = d.writes
		d.mu.Unlock()
		if err := l.WriteAt(pattern(70000, 9), 500003, false); err == nil {
			t.Fatalf("%s: write through a crash succeeded", name)
		}
		l.Close()
		l = build(t, block.Env{Dir: dir, Keys: keys})
		if !bytes.Equal(mustRead(t, l, 1001, 50000), a) || !bytes.Equal(mustRead(t, l, 200000, 30000), b) {
			t.Fatalf("%s: acknowledged data lost", name)
		}
		l.Close()
	}
}

// TestConcurrentPartialWrites: goroutines write disjoint byte ranges that
// share sectors (every write is a read-modify-write of sectors another
// goroutine is changing), alongside whole-sector writes, zeroes and reads.
// Without the sector lock, writes are lost.
func TestConcurrentPartialWrites(t *testing.T) {
	const sectorsN, writers, rounds = 16, 8, 6
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true, Keys: newKeys(t)}
	l := build(t, env)
	defer l.Close()
	slice := int64(SectorSize / writers)
	var wg sync.WaitGroup
	errs := make(chan error, writers+2)
	for g := 0; g < writers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				for s := int64(0); s < sectorsN; s++ {
					// bytes [g*slice+1, (g+1)*slice-1) of sector s
					p := bytes.Repeat([]byte{byte(g*rounds + r + 1)}, int(slice-2))
					if err := l.WriteAt(p, s*SectorSize+int64(g)*slice+1, false); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Add(2)
	go func() { // whole-sector writes and unaligned zeroes elsewhere
		defer wg.Done()
		for r := 0; r < rounds*4; r++ {
			if err := l.WriteAt(pattern(2*SectorSize, uint64(r)), 64*SectorSize, false); err != nil {
				errs <- err
				return
			}
			if err := l.WriteZeroes(64*SectorSize+10, 100, block.ZeroFlags{}); err != nil {
				errs <- err
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		p := make([]byte, sectorsN*SectorSize)
		for r := 0; r < rounds*4; r++ {
			if err := l.ReadAt(p, 0); err != nil {
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := mustRead(t, l, 0, sectorsN*SectorSize)
	for s := 0; s < sectorsN; s++ {
		for g := 0; g < writers; g++ {
			want := byte(g*rounds + rounds)
			at := s*SectorSize + g*int(slice)
			for i := 1; i < int(slice)-1; i++ {
				if got[at+i] != want {
					t.Fatalf("sector %d writer %d: byte %d is %d, want %d (a concurrent read-modify-write lost it)", s, g, i, got[at+i], want)
				}
			}
			if got[at] != 0 || got[at+int(slice)-1] != 0 {
				t.Fatalf("sector %d writer %d: bytes outside the writes changed", s, g)
			}
		}
	}
}

func TestRangeLockOrdering(t *testing.T) {
	var rl rangeLock
	a := rl.lock(0, 10)
	got := make(chan string, 3)
	go func() { r := rl.lock(5, 5); got <- "overlap"; rl.unlock(r) }()
	for { // wait until the overlapping request is queued
		rl.mu.Lock()
		n := len(rl.reqs)
		rl.mu.Unlock()
		if n == 2 {
			break
		}
	}
	b := rl.lock(11, 20) // disjoint: granted at once
	got <- "disjoint"
	rl.unlock(b)
	rl.unlock(a)
	if first, second := <-got, <-got; first != "disjoint" || second != "overlap" {
		t.Fatalf("order %s, %s", first, second)
	}
}

func TestResize(t *testing.T) {
	keys := newKeys(t)
	dir := t.TempDir()
	const size = 1<<20 + 100
	l := build(t, block.Env{Dir: dir, Size: size, Create: true, Keys: keys})
	tail := pattern(300, 10)
	if err := l.WriteAt(tail, size-300, false); err != nil {
		t.Fatal(err)
	}
	if err := l.WriteZeroes(size-50, 50, block.ZeroFlags{}); err != nil {
		t.Fatal(err)
	}
	clear(tail[250:])
	r := l.(block.Resizer)
	if err := r.Resize(size - 1); err == nil {
		t.Fatal("shrink accepted")
	}
	if err := r.Resize(4<<20 + 7); err != nil {
		t.Fatal(err)
	}
	if l.Size() != 4<<20+7 {
		t.Fatalf("size %d", l.Size())
	}
	if !bytes.Equal(mustRead(t, l, size-300, 300), tail) {
		t.Fatal("data before the old end changed")
	}
	if got := mustRead(t, l, size, 4<<20+7-size); !bytes.Equal(got, make([]byte, len(got))) {
		t.Fatal("grown area (including the old partial sector's tail) is not zero")
	}
	if err := l.WriteAt(tail, 4<<20+7-300, true); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l = build(t, block.Env{Dir: dir, Keys: keys})
	defer l.Close()
	if l.Size() != 4<<20+7 || !bytes.Equal(mustRead(t, l, 4<<20+7-300, 300), tail) {
		t.Fatal("resize not persistent")
	}
	if want := int64(DataOffset + 4<<20 + SectorSize); l.(block.Parent).Children()[0].Size() != want {
		t.Fatalf("child size %d, want %d", l.(block.Parent).Children()[0].Size(), want)
	}
}

func TestParamsDescribeReadOnly(t *testing.T) {
	keys := newKeys(t)
	bad := `{"type":"crypt","params":{"cipher":"des"},"children":[{"type":"file","params":{"path":"a.img"}}]}`
	if l, err := block.Build(block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true, Keys: keys}, blocktest.Spec(t, bad)); err == nil {
		l.Close()
		t.Fatal("unknown parameter accepted")
	}
	dir := t.TempDir()
	js := `{"type":"crypt","params":{},"children":[{"type":"file","params":{"path":"a.img"}}]}`
	l, err := block.Build(block.Env{Dir: dir, Size: 1 << 20, Create: true, Keys: keys}, blocktest.Spec(t, js))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteAt([]byte("hello"), 10, false); err != nil {
		t.Fatal(err)
	}
	d := l.Describe()
	if d.Type != "crypt" || string(d.Params) != "{}" || d.State != block.StateOK || len(d.Children) != 1 || d.Children[0].Type != "file" {
		t.Fatalf("describe: %+v", d)
	}
	l.Close()
	if err := l.ReadAt(make([]byte, 1), 0); !errors.Is(err, block.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	l, err = block.Build(block.Env{Dir: dir, Keys: keys, ReadOnly: true}, blocktest.Spec(t, js))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.Capabilities().ReadOnly {
		t.Fatal("not read-only")
	}
	if err := l.WriteAt([]byte("x"), 0, false); !errors.Is(err, block.ErrReadOnly) {
		t.Fatalf("write on read-only: %v", err)
	}
	if err := l.(block.Resizer).Resize(2 << 20); !errors.Is(err, block.ErrReadOnly) {
		t.Fatalf("resize on read-only: %v", err)
	}
	if got := mustRead(t, l, 10, 5); string(got) != "hello" {
		t.Fatalf("read-only read %q", got)
	}
}

func benchStack(b *testing.B, encrypted bool) block.Layer {
	js := `{"type":"file","params":{"path":"a.img"}}`
	if encrypted {
		js = spec
	}
	l, err := block.Build(block.Env{Dir: b.TempDir(), Size: 64 << 20, Create: true, Keys: newKeys(b)}, blocktest.Spec(b, js))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkWrite compares writes through crypt with writes to a plain
// file (page cache, no sync: the cost crypt adds is the encryption).
func BenchmarkWrite(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		for _, enc := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/%dKiB", map[bool]string{false: "file", true: "crypt"}[enc], size>>10), func(b *testing.B) {
				l := benchStack(b, enc)
				p := pattern(size, 11)
				b.SetBytes(int64(size))
				off := int64(0)
				for b.Loop() {
					if err := l.WriteAt(p, off, false); err != nil {
						b.Fatal(err)
					}
					off = (off + int64(size)) % l.Size()
				}
			})
		}
	}
}

func BenchmarkRead(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		for _, enc := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/%dKiB", map[bool]string{false: "file", true: "crypt"}[enc], size>>10), func(b *testing.B) {
				l := benchStack(b, enc)
				if err := l.WriteAt(pattern(int(l.Size()), 12), 0, false); err != nil {
					b.Fatal(err)
				}
				p := make([]byte, size)
				b.SetBytes(int64(size))
				off := int64(0)
				for b.Loop() {
					if err := l.ReadAt(p, off); err != nil {
						b.Fatal(err)
					}
					off = (off + int64(size)) % l.Size()
				}
			})
		}
	}
}

// TestCloneKeepsKey: crypt over cow, as the `encrypted` volume type has it.
// A clone (Env.Create with Env.Base, the snapshot's image) is built over a
// child that already holds the origin's header and ciphertext: it must
// keep that key — a fresh one decrypts the origin's data to garbage — and
// a clone larger than its snapshot grows the header's size. Clone and
// origin stay independent afterwards, and both reopen.
func TestCloneKeepsKey(t *testing.T) {
	const cowSpec = `{"type":"crypt","children":[{"type":"cow","children":[{"type":"file","params":{"path":"d.img"}}]}]}`
	root := t.TempDir()
	keys := newKeys(t)
	env := block.Env{Dir: filepath.Join(root, "vol"), Images: filepath.Join(root, "images"), Size: 1 << 20, Create: true, Keys: keys}
	l, err := block.Build(env, blocktest.Spec(t, cowSpec))
	if err != nil {
		t.Fatal(err)
	}
	data := pattern(300000, 9)
	if err := l.WriteAt(data, 5000, false); err != nil {
		t.Fatal(err)
	}
	img, err := l.(*Layer).child.(*cow.Layer).Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	other := pattern(300000, 10)
	if err := l.WriteAt(other, 5000, false); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if len(keys.seen) != 1 {
		t.Fatalf("%d data keys made for one volume", len(keys.seen))
	}

	for _, size := range []int64{1 << 20, 3 << 20} {
		cenv := env
		cenv.Dir, cenv.Base, cenv.Size = filepath.Join(root, fmt.Sprint("clone", size)), img, size
		c, err := block.Build(cenv, blocktest.Spec(t, cowSpec))
		if err != nil {
			t.Fatalf("clone of %d bytes: %v", size, err)
		}
		if c.Size() != size {
			t.Errorf("clone of %d bytes has size %d", size, c.Size())
		}
		if got := mustRead(t, c, 5000, int64(len(data))); !bytes.Equal(got, data) {
			t.Fatalf("clone of %d bytes does not read the snapshot's data", size)
		}
		if got := mustRead(t, c, 1<<20-4096, 4096); !bytes.Equal(got, make([]byte, 4096)) {
			t.Errorf("clone of %d bytes: zeroes beyond the data read as something else", size)
		}
		if err := c.WriteAt(other[:8192], size-8192, true); err != nil {
			t.Fatal(err)
		}
		c.Close()
		cenv.Create = false
		c, err = block.Build(cenv, blocktest.Spec(t, cowSpec))
		if err != nil {
			t.Fatalf("reopen clone of %d bytes: %v", size, err)
		}
		if c.Size() != size || !bytes.Equal(mustRead(t, c, 5000, int64(len(data))), data) || !bytes.Equal(mustRead(t, c, size-8192, 8192), other[:8192]) {
			t.Errorf("reopened clone of %d bytes: size %d or data wrong", size, c.Size())
		}
		c.Close()
	}
	if len(keys.seen) != 1 {
		t.Errorf("clones made %d new data keys", len(keys.seen)-1)
	}
	env.Create = false
	l, err = block.Build(env, blocktest.Spec(t, cowSpec))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := mustRead(t, l, 5000, int64(len(other))); !bytes.Equal(got, other) {
		t.Error("the origin changed through its clones")
	}
}

// TestTryReadAt: whole-sector reads answered without waiting decrypt like
// ReadAt, at any size with an assembly kernel and up to genericTryMax
// without one; partial sectors are left to ReadAt.
func TestTryReadAt(t *testing.T) {
	l := build(t, block.Env{Dir: t.TempDir(), Size: 4 << 20, Create: true, Keys: newKeys(t)}).(*Layer)
	defer l.Close()
	data := pattern(4<<20, 5)
	if err := l.WriteAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	// Whether the child answers without waiting depends on its page cache
	// and file system; what crypt must do is answer whenever it may.
	childCan := func(off, n int64) bool {
		return block.TryReadAt(l.child, make([]byte, n), DataOffset+off)
	}
	try := func(off, n int64) bool {
		t.Helper()
		p := make([]byte, n)
		if !l.TryReadAt(p, off) {
			return false
		}
		if !bytes.Equal(p, data[off:off+n]) {
			t.Fatalf("TryReadAt %d+%d returned other bytes than were written", off, n)
		}
		return true
	}
	for _, r := range [][2]int64{{0, SectorSize}, {SectorSize, 4 * SectorSize}, {1 << 20, 1 << 20}, {0, 4 << 20}} {
		if childCan(r[0], r[1]) && !try(r[0], r[1]) {
			t.Errorf("TryReadAt %d+%d refused though the child answers", r[0], r[1])
		}
	}
	for _, r := range [][2]int64{{1, SectorSize}, {0, SectorSize + 1}, {100, 200}} {
		if try(r[0], r[1]) {
			t.Errorf("TryReadAt %d+%d (not whole sectors) answered", r[0], r[1])
		}
	}
	l.cipher.kernel = nil
	if childCan(0, genericTryMax) && !try(0, genericTryMax) {
		t.Errorf("generic TryReadAt of %d bytes refused", genericTryMax)
	}
	if try(0, genericTryMax+SectorSize) {
		t.Errorf("generic TryReadAt of more than %d bytes answered", genericTryMax)
	}
}
