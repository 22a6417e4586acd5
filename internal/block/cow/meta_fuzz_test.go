package cow

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/block/superblock"
)

const fuzzSpec = `{"type":"cow","children":[{"type":"file","params":{"path":"d.img"}}]}`

// FuzzDecodeImageMeta proves that decodeImageMeta accepts only payloads the
// layer can size and name things from — version 1, the image's own id and
// a valid parent id or none (ids name directories), a size in (0, 2^62], a
// chunk that is a power of two of at least 4096 — and that what it accepts
// survives being written back. decodeVolMeta likewise for cow.sb.
func FuzzDecodeImageMeta(f *testing.F) {
	env := block.Env{Dir: filepath.Join(f.TempDir(), "vol"), Images: filepath.Join(f.TempDir(), "images"), Size: 1 << 20, Create: true}
	l, err := block.Build(env, blocktest.Spec(f, fuzzSpec))
	if err != nil {
		f.Fatal(err)
	}
	top := l.(*Layer).top.meta.ID
	if err := l.Close(); err != nil {
		f.Fatal(err)
	}
	b, payload, err := superblock.Open(filepath.Join(env.Images, top, imgFile))
	if err != nil {
		f.Fatal(err)
	}
	b.Close()
	if _, err := decodeImageMeta(payload, top); err != nil {
		f.Fatalf("the image.sb of a new cow layer does not decode: %v", err)
	}
	f.Add(payload, top)
	const id = "img-0123456789abcdef"
	for _, p := range []string{
		`{"version":1,"id":"img-0123456789abcdef","size":1,"chunk":4096,"spec":{"type":"file"}}`,
		`{"version":1,"id":"img-0123456789abcdef","parent":"img-fedcba9876543210","size":4611686018427387904,"chunk":65536}`,
		`{"version":1,"id":"img-0123456789abcdef","size":1,"chunk":0}`,
		`{"version":1,"id":"img-0123456789abcdef","size":1152921504606846976,"chunk":4096}`,
		`{"version":1,"id":"img-0123456789abcdef","parent":"../../etc","size":1,"chunk":4096}`,
		`{"version":1,"id":"img-0123456789ABCDEF","size":1,"chunk":4096}`,
		`{"version":2,"id":"img-0123456789abcdef","size":1,"chunk":4096}`,
		`{"version":1,"id":"img-0123456789abcdef","size":-1,"chunk":6144}`,
		`{"version":1,"top":"img-0123456789abcdef"}`,
		`{"version":1,"top":"../x"}`,
		`{"version":1,"id":"img-0123456789abcdef","size":1,"chunk":4096,"spec":{"type":"file","params":{"path":"d>img"}}}`,
		`null`,
	} {
		f.Add([]byte(p), id)
	}
	f.Fuzz(func(t *testing.T, payload []byte, id string) {
		if m, err := decodeImageMeta(payload, id); err == nil {
			switch {
			case m.Version != version || m.ID != id || !validID(id) || m.Parent != "" && !validID(m.Parent):
				t.Fatalf("accepted version %d, id %q (for %q), parent %q", m.Version, m.ID, id, m.Parent)
			case m.Size <= 0 || m.Size > maxSize || m.Chunk < 4096 || m.Chunk&(m.Chunk-1) != 0:
				t.Fatalf("accepted size %d, chunk %d", m.Size, m.Chunk)
			}
			again, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			m2, err := decodeImageMeta(again, id)
			if err != nil {
				t.Fatalf("re-decoding %s: %v", again, err)
			}
			// The child spec's params are raw JSON, kept as the payload
			// spelled them; encoding normalises the spelling (escapes,
			// spaces), so the spec must survive as JSON, not as bytes.
			twice, err := json.Marshal(m2)
			if err != nil || !bytes.Equal(twice, again) {
				t.Fatalf("re-encoding is not stable: %s, then %s (%v)", again, twice, err)
			}
			m.Spec, m2.Spec = block.Spec{}, block.Spec{}
			if !reflect.DeepEqual(m2, m) {
				t.Fatalf("re-decoding %s: %+v; want %+v", again, m2, m)
			}
		}
		if vm, err := decodeVolMeta(payload); err == nil && (vm.Version != version || !validID(vm.Top)) {
			t.Fatalf("cow.sb payload accepted with version %d, top %q", vm.Version, vm.Top)
		}
	})
}

// TestOpenRefusesForgedImage: an image.sb (forged, or written by a bug)
// that records more than its device holds, a chunk of 0 or a parent
// outside the images directory is refused with an error — before an owner
// table of terabytes is allocated, a division by zero, or a path is built.
func TestOpenRefusesForgedImage(t *testing.T) {
	for name, c := range map[string]struct {
		edit func(m *imageMeta)
		want string
	}{
		"size beyond the device": {func(m *imageMeta) { m.Size = 1 << 60 }, "its device holds"},
		"chunk 0":                {func(m *imageMeta) { m.Chunk = 0 }, "implausible size"},
		"parent outside":         {func(m *imageMeta) { m.Parent = "../../elsewhere" }, "parent"},
	} {
		t.Run(name, func(t *testing.T) {
			env := testEnv(t, 1<<20)
			l := build(t, env, fuzzSpec)
			top := l.top
			path := filepath.Join(env.Images, top.meta.ID, imgFile)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			sb, payload, err := superblock.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			m, err := decodeImageMeta(payload, top.meta.ID)
			if err != nil {
				t.Fatal(err)
			}
			c.edit(&m)
			forged, _ := json.Marshal(m)
			if err := sb.Write(forged); err != nil {
				t.Fatal(err)
			}
			sb.Close()
			env.Create = false
			_, err = block.Build(env, blocktest.Spec(t, fuzzSpec))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("open with a forged image.sb: %v (want %q)", err, c.want)
			}
		})
	}
}
