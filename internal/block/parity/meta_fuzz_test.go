package parity

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/superblock"
)

// superOf opens the superblock of the parity layer whose metadata file is
// in dir (read-write, for tests that forge one) and its payload.
func superOf(t testing.TB, dir string) (*superblock.Block, []byte, func()) {
	t.Helper()
	mf, err := os.OpenFile(filepath.Join(dir, DefaultMeta), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	sb, payload, err := superblock.OpenFile(&section{f: mf, limit: 2 * sbSlot})
	if err != nil {
		mf.Close()
		t.Fatal(err)
	}
	return sb, payload, func() { mf.Close() }
}

// FuzzDecodeSuper proves that decodeSuper accepts only payloads the layer
// can size itself from — version 1, at least 3 legs each ok, failed or
// rebuilding, a chunk that is a power of two of at least 4096, a size in
// (0, 2^62], 1 to 2^16 journal pairs, nothing unknown or after the
// object — and that what it accepts survives the way the layer writes it
// back (marshal). The other way round, every valid payload built from the
// fuzzer's numbers decodes to itself.
func FuzzDecodeSuper(f *testing.F) {
	dir := f.TempDir()
	l, err := block.Build(block.Env{Dir: dir, Size: 1 << 20, Create: true}, blocktest.Spec(f, specFor(3, 4096)))
	if err != nil {
		f.Fatal(err)
	}
	if err := l.Close(); err != nil {
		f.Fatal(err)
	}
	_, payload, done := superOf(f, dir)
	done()
	if _, err := decodeSuper(payload); err != nil {
		f.Fatalf("the payload of a new parity layer does not decode: %v", err)
	}
	f.Add(payload, uint8(0), int64(1), 1, []byte{0, 1, 2})
	for _, p := range []superPayload{
		{Version: 1, Legs: 4, Chunk: 65536, Size: 64 << 20, State: "oooo", Pairs: 64},
		{Version: 1, Legs: 3, Chunk: 4096, Size: maxSize, State: "ofr", Pairs: maxPairs},
	} {
		f.Add(p.marshal(), uint8(4), p.Size, p.Pairs, []byte(p.State))
	}
	for _, p := range []string{
		`{"version":2,"legs":3,"chunk":4096,"size":1,"epoch":0,"state":"ooo","journal_pairs":1}`,
		`{"version":1,"legs":2,"chunk":4096,"size":1,"epoch":0,"state":"oo","journal_pairs":1}`,
		`{"version":1,"legs":3,"chunk":4096,"size":1,"epoch":0,"state":"oo","journal_pairs":1}`,
		`{"version":1,"legs":3,"chunk":6144,"size":1,"epoch":0,"state":"ooo","journal_pairs":1}`,
		`{"version":1,"legs":3,"chunk":2048,"size":1,"epoch":0,"state":"ooo","journal_pairs":1}`,
		`{"version":1,"legs":3,"chunk":4096,"size":0,"epoch":0,"state":"ooo","journal_pairs":1}`,
		`{"version":1,"legs":3,"chunk":4096,"size":9223372036854775807,"epoch":0,"state":"ooo","journal_pairs":1}`,
		`{"version":1,"legs":3,"chunk":4096,"size":1,"epoch":0,"state":"ooo","journal_pairs":0}`,
		`{"version":1,"legs":3,"chunk":4096,"size":1,"epoch":0,"state":"ooo","journal_pairs":65537}`,
		`{"version":1,"legs":3,"chunk":4096,"size":1,"epoch":0,"state":"oox","journal_pairs":1}`,
		`{"version":1,"legs":3,"chunk":4096,"size":1,"epoch":0,"state":"ooo","journal_pairs":1,"colour":"red"}`,
		`{"version":1,"legs":3,"chunk":4096,"size":1,"epoch":0,"state":"ooo","journal_pairs":1} {}`,
		`{"version":1,"legs":3,"chunk":4096,"size":1,"epoch":0,"state":"ooo"`,
		`null`,
		``,
	} {
		f.Add([]byte(p), uint8(40), int64(-5), 0, []byte{})
	}

	f.Fuzz(func(t *testing.T, raw []byte, chunkLog uint8, size int64, pairs int, legs []byte) {
		p, err := decodeSuper(raw)
		if err == nil {
			if err := validSuper(p); err != nil {
				t.Fatalf("decodeSuper accepted %q: %v", raw, err)
			}
			again, err := decodeSuper(p.marshal())
			if err != nil {
				t.Fatalf("decoding the re-encoding %s of %q: %v", p.marshal(), raw, err)
			}
			if !reflect.DeepEqual(again, p) {
				t.Fatalf("re-decoded %+v, want %+v", again, p)
			}
		}

		// The other way: a valid payload from the other arguments.
		if size <= 0 || size > maxSize || pairs < 1 || pairs > maxPairs || len(legs) < 3 || len(legs) > 64 {
			return
		}
		want := superPayload{Version: 1, Legs: len(legs), Chunk: 1 << (12 + chunkLog%40), Size: size, Epoch: uint64(size) * 7, Pairs: pairs}
		for _, b := range legs {
			want.State += string([]byte{legOK, legFailed, legRebuilding}[b%3])
		}
		got, err := decodeSuper(want.marshal())
		if err != nil {
			t.Fatalf("decoding %s: %v", want.marshal(), err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip of %+v gives %+v", want, got)
		}
	})
}

// validSuper checks the invariants decodeSuper promises.
func validSuper(p superPayload) error {
	switch {
	case p.Version != 1:
		return fmt.Errorf("version %d", p.Version)
	case p.Legs < 3 || len(p.State) != p.Legs:
		return fmt.Errorf("%d legs, states %q", p.Legs, p.State)
	case p.Chunk < 4096 || p.Chunk&(p.Chunk-1) != 0:
		return fmt.Errorf("chunk %d", p.Chunk)
	case p.Size <= 0 || p.Size > maxSize:
		return fmt.Errorf("size %d", p.Size)
	case p.Pairs < 1 || p.Pairs > maxPairs:
		return fmt.Errorf("pairs %d", p.Pairs)
	}
	for _, c := range []byte(p.State) {
		if c != legOK && c != legFailed && c != legRebuilding {
			return fmt.Errorf("state %q", p.State)
		}
	}
	return nil
}

// TestOpenRefusesSizeNoLegHolds: a superblock (forged, or written by a
// bug) whose size no leg holds is refused before the layer sizes its
// bitmap from it — 2^60 bytes would be terabytes of bitmap.
func TestOpenRefusesSizeNoLegHolds(t *testing.T) {
	env := block.Env{Dir: t.TempDir(), Size: 1 << 20, Create: true}
	spec := specFor(3, 4096)
	if err := build(t, env, spec).Close(); err != nil {
		t.Fatal(err)
	}
	sb, payload, done := superOf(t, env.Dir)
	p, err := decodeSuper(payload)
	if err != nil {
		t.Fatal(err)
	}
	p.Size = 1 << 60
	if err := sb.Write(p.marshal()); err != nil {
		t.Fatal(err)
	}
	done()
	env.Create = false
	_, err = block.Build(env, blocktest.Spec(t, spec))
	if err == nil || !strings.Contains(err.Error(), "needs legs of") {
		t.Fatalf("open with a size no leg holds: %v", err)
	}
	// The size it was made with still opens.
	p.Size = 1 << 20
	sb, _, done = superOf(t, env.Dir)
	if err := sb.Write(p.marshal()); err != nil {
		t.Fatal(err)
	}
	done()
	if err := build(t, env, spec).Close(); err != nil {
		t.Fatal(err)
	}
}

// FuzzJournal: whatever the journal region holds, scan and lookup neither
// fail nor return anything but a whole chunk or a zero chunk, and an
// entry written afterwards (as a degraded write journals one) is what
// the next open finds for its stripe and leg.
func FuzzJournal(f *testing.F) {
	const chunk, pairs = 4096, 2
	region := int64(2*pairs) * (jHeader + chunk)
	// A valid entry to mutate, with a generation to beat.
	valid := func(gen uint64, zero bool) []byte {
		mf, err := os.CreateTemp(f.TempDir(), "j")
		if err != nil {
			f.Fatal(err)
		}
		defer mf.Close()
		j := newJournal(&section{f: mf, limit: region}, chunk, pairs)
		data := make([]byte, chunk)
		if !zero {
			data[7] = 1
		}
		if err := j.put(&pairUse{pair: 1, last: 0}, gen, 3, 42, 1, data); err != nil {
			f.Fatal(err)
		}
		raw := make([]byte, region)
		mf.ReadAt(raw, 0)
		return raw
	}
	// The same entry with its generation replaced (and its CRC redone):
	// entries no journal writes, which must not outrank the next one.
	forged := func(gen uint64) []byte {
		raw := valid(5, false)
		h := raw[3*(jHeader+chunk):]
		binary.BigEndian.PutUint64(h[16:], gen)
		c := crc32.Update(0, castagnoli, h[8:44])
		binary.BigEndian.PutUint32(h[44:], crc32.Update(c, castagnoli, h[jHeader:jHeader+chunk]))
		return raw
	}
	f.Add(valid(5, false), uint64(3), int64(42), uint8(1), false)
	f.Add(valid(maxGen, true), uint64(3), int64(42), uint8(1), true)
	f.Add(forged(maxGen+1), uint64(3), int64(42), uint8(1), false)
	f.Add(forged(^uint64(0)), uint64(3), int64(42), uint8(1), false)
	f.Add([]byte(jMagic), uint64(0), int64(0), uint8(0), true)

	f.Fuzz(func(t *testing.T, raw []byte, epoch uint64, stripe int64, leg uint8, zero bool) {
		mf, err := os.CreateTemp(t.TempDir(), "j")
		if err != nil {
			t.Fatal(err)
		}
		defer mf.Close()
		if _, err := mf.WriteAt(raw[:min(int64(len(raw)), region)], 0); err != nil {
			t.Fatal(err)
		}
		open := func() *journal {
			j := newJournal(&section{f: mf, limit: region}, chunk, pairs)
			if err := j.scan(epoch); err != nil {
				t.Fatalf("scan: %v", err)
			}
			return j
		}
		j := open()
		for s, es := range j.found {
			for _, e := range es {
				data, ok, err := j.lookup(s, e.leg)
				if err != nil {
					t.Fatalf("lookup stripe %d leg %d: %v", s, e.leg, err)
				}
				if ok && data != nil && len(data) != chunk {
					t.Fatalf("lookup stripe %d leg %d returned %d bytes", s, e.leg, len(data))
				}
			}
		}
		// A degraded write now journals into pair 0 (the layer takes a
		// free pair, and alternates slots from the last one it used).
		want := make([]byte, chunk)
		if !zero {
			for i := range want {
				want[i] = byte(i*31) | 1
			}
		}
		j.gen++
		err = j.put(&pairUse{pair: 0, last: -1}, j.gen, epoch, stripe, int(leg), want)
		if j.gen > maxGen {
			// Only a forged entry of generation maxGen gets here.
			if err == nil {
				t.Fatalf("put wrote generation %d, beyond %d", j.gen, uint64(maxGen))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		got, ok, err := open().lookup(stripe, int(leg))
		switch {
		case err != nil:
			t.Fatalf("lookup after put: %v", err)
		case !ok:
			t.Fatalf("the entry just written for stripe %d leg %d is not found", stripe, leg)
		case zero && got != nil, !zero && !bytes.Equal(got, want):
			t.Fatalf("stripe %d leg %d: lookup returned other content than was journaled", stripe, leg)
		}
	})
}
