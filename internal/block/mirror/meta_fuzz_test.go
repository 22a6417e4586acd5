package mirror

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/superblock"
)

// FuzzDecodeState proves that decodeState accepts only states the mirror
// can use — format version 1, a region that is a power of two of at least
// 4096 bytes, a size in (0, 2^62], every leg ok, failed or rebuilding,
// nothing after the JSON object — and
// that what it accepts survives the way the mirror writes it back: the
// JSON encoding of the result decodes to an equal state. The other way
// round, every valid state (a region 2^12..2^62, a size in (0, 2^62], legs
// in any states) encodes to a payload that decodes back to it.
func FuzzDecodeState(f *testing.F) {
	// A real payload: the superblock of a mirror just created.
	dir := f.TempDir()
	l, err := block.Build(block.Env{Dir: dir, Size: 1 << 20, Create: true},
		blocktest.Spec(f, mirrorSpec(`{"region":65536}`, "a.img", "b.img")))
	if err != nil {
		f.Fatal(err)
	}
	if err := l.Close(); err != nil {
		f.Fatal(err)
	}
	mf, err := os.Open(filepath.Join(dir, DefaultMeta))
	if err != nil {
		f.Fatal(err)
	}
	_, payload, err := superblock.OpenFile(sbSection{mf})
	mf.Close()
	if err != nil {
		f.Fatal(err)
	}
	if _, err := decodeState(payload); err != nil {
		f.Fatalf("the payload of a new mirror does not decode: %v", err)
	}
	f.Add(payload, uint8(0), int64(1), []byte{0})
	// Encodings as the mirror writes them (json.Marshal of sbState).
	for _, s := range []sbState{
		{Version: formatV1, Region: DefaultRegion, Size: 64 << 20, Legs: []string{legOK, legOK}},
		{Version: formatV1, Region: 4096, Size: 1, Legs: []string{legOK, legFailed, legRebuilding}},
		{Version: formatV1, Region: 1 << 62, Size: maxSize, Legs: []string{legFailed}},
		{Version: formatV1, Region: 1 << 16, Size: 5000},
	} {
		p, err := json.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p, uint8(s.Region>>12), s.Size, []byte{1, 2, 3})
	}
	// Invalid ones: each rule broken once, unknown fields, bad JSON.
	for _, p := range []string{
		`{"version":2,"region":65536,"size":1,"legs":["ok"]}`,
		`{"version":1,"region":65537,"size":1,"legs":["ok"]}`,
		`{"version":1,"region":2048,"size":1,"legs":["ok"]}`,
		`{"version":1,"region":-9223372036854775808,"size":1,"legs":["ok"]}`,
		`{"version":1,"region":65536,"size":0,"legs":["ok"]}`,
		`{"version":1,"region":65536,"size":4611686018427387905,"legs":["ok"]}`,
		`{"version":1,"region":65536,"size":1,"legs":["ok"]} {}`,
		`{"version":1,"region":65536,"size":1,"legs":["ok","OK"]}`,
		`{"version":1,"region":65536,"size":1,"legs":["ok"],"colour":"red"}`,
		`{"version":1,"region":65536,"size":1,"legs":"ok"}`,
		`{"version":1,"region":65536,"size":1.5,"legs":["ok"]}`,
		`{"version":1,"region":65536,"size":1,"legs":["ok"]`,
		`{"Version":1,"REGION":65536,"size":1,"legs":null} trailing`,
		`null`,
		``,
	} {
		f.Add([]byte(p), uint8(40), int64(-5), []byte{})
	}

	f.Fuzz(func(t *testing.T, p []byte, regionLog uint8, size int64, legs []byte) {
		s, err := decodeState(p)
		if err == nil {
			if err := validState(s); err != nil {
				t.Fatalf("decodeState accepted %q: %v", p, err)
			}
			again, err := json.Marshal(s)
			if err != nil {
				t.Fatalf("encoding %+v: %v", s, err)
			}
			s2, err := decodeState(again)
			if err != nil {
				t.Fatalf("decoding the re-encoding %s of %q: %v", again, p, err)
			}
			if !reflect.DeepEqual(s2, s) {
				t.Fatalf("re-decoded %+v, want %+v", s2, s)
			}
		}

		// The other way: a valid state from the other arguments.
		if size <= 0 || size > maxSize || len(legs) > 64 {
			return
		}
		want := sbState{Version: formatV1, Region: 1 << (12 + regionLog%51), Size: size}
		for _, b := range legs {
			want.Legs = append(want.Legs, []string{legOK, legFailed, legRebuilding}[b%3])
		}
		enc, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeState(enc)
		if err != nil {
			t.Fatalf("decoding %s: %v", enc, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip of %+v gives %+v", want, got)
		}
	})
}

// validState checks the invariants decodeState promises.
func validState(s sbState) error {
	switch {
	case s.Version != formatV1:
		return fmt.Errorf("version %d", s.Version)
	case s.Region < 4096 || bits.OnesCount64(uint64(s.Region)) != 1:
		return fmt.Errorf("region %d is not a power of two of at least 4096", s.Region)
	case s.Size <= 0 || s.Size > maxSize:
		return fmt.Errorf("size %d", s.Size)
	}
	for i, st := range s.Legs {
		if st != legOK && st != legFailed && st != legRebuilding {
			return fmt.Errorf("leg %d state %q", i, st)
		}
	}
	return nil
}
