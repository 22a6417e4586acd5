package parity

import (
	"fmt"
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
