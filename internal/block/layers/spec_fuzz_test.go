package layers_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/checksum"
	"github.com/basalt-storage/basalt/internal/block/file"
	"github.com/basalt-storage/basalt/internal/block/mirror"
	"github.com/basalt-storage/basalt/internal/block/parity"
	"github.com/basalt-storage/basalt/internal/block/throttle"
	"github.com/basalt-storage/basalt/internal/keys"
)

// builtInStacks are the stacks of the built-in volume types
// (internal/volume/types.go), as the volume service builds them.
var builtInStacks = []string{
	`{"type":"cow","children":[{"type":"file","params":{"path":"data.img"}}]}`,
	`{"type":"cow","children":[{"type":"stripe","children":[{"type":"file","params":{"path":"stripe0.img"}},{"type":"file","params":{"path":"stripe1.img"}},{"type":"file","params":{"path":"stripe2.img"}},{"type":"file","params":{"path":"stripe3.img"}}]}]}`,
	`{"type":"cow","children":[{"type":"mirror","children":[{"type":"file","params":{"path":"leg0.img"}},{"type":"file","params":{"path":"leg1.img"}}]}]}`,
	`{"type":"cow","children":[{"type":"parity","children":[{"type":"file","params":{"path":"leg0.img"}},{"type":"file","params":{"path":"leg1.img"}},{"type":"file","params":{"path":"leg2.img"}},{"type":"file","params":{"path":"leg3.img"}}]}]}`,
	`{"type":"crypt","children":[{"type":"cow","children":[{"type":"file","params":{"path":"data.img"}}]}]}`,
	`{"type":"checksum","children":[{"type":"cow","children":[{"type":"file","params":{"path":"data.img"}}]}]}`,
}

// Fuzzed specs are kept small so each build takes milliseconds.
const (
	maxSpecJSON  = 4 << 10
	maxSpecNodes = 16
)

// checkShape is Check's rule, restated: every node's type is registered
// and has an allowed number of children.
func checkShape(s block.Spec, types map[string]block.Type) error {
	t, ok := types[s.Type]
	if !ok {
		return fmt.Errorf("unknown type %q", s.Type)
	}
	if n := len(s.Children); n < t.MinChildren || (t.MaxChildren >= 0 && n > t.MaxChildren) {
		return fmt.Errorf("%s with %d children", s.Type, n)
	}
	for _, c := range s.Children {
		if err := checkShape(c, types); err != nil {
			return err
		}
	}
	return nil
}

func countNodes(s block.Spec) int {
	n := 1
	for _, c := range s.Children {
		n += countNodes(c)
	}
	return n
}

// confined reports whether a spec can be built in the fuzz test's
// directories without touching anything else or waiting for long: every
// string in every node's params (file paths, metadata names) is empty or
// a local path (filepath.IsLocal), and no throttle is slow enough to make
// a build wait.
func confined(s block.Spec) bool {
	if len(s.Params) > 0 {
		var v any
		if err := json.Unmarshal(s.Params, &v); err != nil || !localStrings(v) {
			return false
		}
	}
	if s.Type == "throttle" {
		var p throttle.Params
		if block.DecodeParams(s.Params, &p) == nil && (p.IOPS > 0 && p.IOPS < 1000 || p.BPS > 0 && p.BPS < 1<<30) {
			return false
		}
	}
	for _, c := range s.Children {
		if !confined(c) {
			return false
		}
	}
	return true
}

// usesAFileTwice is Check's file rule, restated: whether two layers of s
// would open one file in one directory — a file layer's data, a
// checksum, mirror or parity metadata file (named by params.meta, else
// the default), cow's cow.sb; cow's children each get a directory of
// their own, where cow keeps image.sb and alloc.map.
func usesAFileTwice(s block.Spec) bool {
	var walk func(s block.Spec, dir map[string]bool) bool
	walk = func(s block.Spec, dir map[string]bool) bool {
		use := func(name string) bool {
			name = filepath.Clean(name)
			if dir[name] {
				return true
			}
			dir[name] = true
			return false
		}
		twice := false
		// named: the file a layer's params name (strictly decoded, as
		// the layer does), if they decode and name one.
		named := func(p any, name *string) {
			if block.DecodeParams(s.Params, p) == nil && *name != "" {
				twice = use(*name)
			}
		}
		switch s.Type {
		case "file":
			var p file.Params
			named(&p, &p.Path)
		case "checksum":
			p := checksum.Params{Meta: checksum.DefaultMeta}
			named(&p, &p.Meta)
		case "mirror":
			p := mirror.Params{Meta: mirror.DefaultMeta}
			named(&p, &p.Meta)
		case "parity":
			p := parity.Params{Meta: parity.DefaultMeta}
			named(&p, &p.Meta)
		case "cow":
			twice = use("cow.sb")
		}
		if twice {
			return true
		}
		for _, c := range s.Children {
			kids := dir
			if s.Type == "cow" {
				kids = map[string]bool{"image.sb": true, "alloc.map": true}
			}
			if walk(c, kids) {
				return true
			}
		}
		return false
	}
	return walk(s, map[string]bool{})
}

func localStrings(v any) bool {
	switch v := v.(type) {
	case string:
		return v == "" || filepath.IsLocal(v)
	case []any:
		for _, e := range v {
			if !localStrings(e) {
				return false
			}
		}
	case map[string]any:
		for _, e := range v {
			if !localStrings(e) {
				return false
			}
		}
	}
	return true
}

// sameShape compares a built stack's description with its spec: the same
// types with the same numbers of children, all the way down.
func sameShape(n block.Node, s block.Spec) error {
	if n.Type != s.Type || len(n.Children) != len(s.Children) {
		return fmt.Errorf("described as %s with %d children, spec says %s with %d", n.Type, len(n.Children), s.Type, len(s.Children))
	}
	for i := range s.Children {
		if err := sameShape(n.Children[i], s.Children[i]); err != nil {
			return fmt.Errorf("%s child %d: %w", s.Type, i, err)
		}
	}
	return nil
}

// FuzzCheckSpec proves that Check accepts exactly the specs whose every
// node is a registered type with an allowed number of children and in
// which no two layers open one file in one directory (and never panics,
// whatever the JSON); and that a small spec Check accepts
// either fails to build with an error or builds, in a fresh directory, a
// stack that describes itself with the spec's shape and as healthy,
// stores a block written at each end, and reopens (Create false) from
// what its creation wrote with both blocks intact — without panicking or
// hanging. Specs are not built when their params name paths outside the
// directory (confined) or throttle slowly.
func FuzzCheckSpec(f *testing.F) {
	for _, s := range builtInStacks {
		f.Add([]byte(s))
	}
	for _, s := range benchStacks {
		f.Add([]byte(s.spec))
	}
	for _, name := range slices.Sorted(maps.Keys(stacks)) {
		f.Add([]byte(stacks[name]))
	}
	for _, s := range []string{
		// Deeper stacks, and stacks of one type twice.
		`{"type":"cow","params":{"chunk":4096},"children":[{"type":"mirror","params":{"region":4096,"meta":"m/x.meta"},"children":[{"type":"checksum","params":{"meta":"c.meta"},"children":[{"type":"file","params":{"path":"a.img"}}]},{"type":"file","params":{"path":"sub/b.img"}}]}]}`,
		`{"type":"checksum","children":[{"type":"checksum","children":[{"type":"file","params":{"path":"a.img"}}]}]}`,
		`{"type":"stripe","children":[{"type":"mirror","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]},{"type":"mirror","children":[{"type":"file","params":{"path":"c.img"}},{"type":"file","params":{"path":"d.img"}}]}]}`,
		`{"type":"mirror","children":[{"type":"parity","children":[{"type":"file","params":{"path":"a"}},{"type":"file","params":{"path":"b"}},{"type":"file","params":{"path":"c"}}]},{"type":"parity","params":{"meta":"p2.meta"},"children":[{"type":"file","params":{"path":"d"}},{"type":"file","params":{"path":"e"}},{"type":"file","params":{"path":"f"}}]}]}`,
		`{"type":"cow","children":[{"type":"cow","children":[{"type":"file","params":{"path":"a.img"}}]}]}`,
		`{"type":"crypt","children":[{"type":"crypt","children":[{"type":"file","params":{"path":"a.img"}}]}]}`,
		`{"type":"mirror","children":[{"type":"file","params":{"path":"a.img"}},{"type":"checksum","children":[{"type":"file","params":{"path":"b.img"}}]}]}`,
		`{"type":"linear","children":[{"type":"crypt","children":[{"type":"file","params":{"path":"a.img"}}]},{"type":"file","params":{"path":"b.img"}}]}`,
		`{"type":"checksum","children":[{"type":"crypt","children":[{"type":"mirror","params":{"region":4096},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}]}]}`,
		// Files used twice: refused by Check.
		`{"type":"parity","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"mirror","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"mirror","params":{"meta":"a.img"},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}`,
		`{"type":"checksum","params":{"meta":"a.img"},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"cow","children":[{"type":"file","params":{"path":"image.sb"}}]}`,
		`{"type":"cow","children":[{"type":"file","params":{"path":"alloc.map"}}]}`,
		`{"type":"cow","children":[{"type":"checksum","params":{"meta":"alloc.map"},"children":[{"type":"file","params":{"path":"a.img"}}]}]}`,
		// Edge parameters.
		`{"type":"linear","params":{"offset":1048575,"length":1},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"stripe","params":{"chunk":4611686018427387904},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}`,
		`{"type":"cow","params":{"chunk":4611686018427387904},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"mirror","params":{"region":4611686018427387904},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}`,
		`{"type":"throttle","params":{"iops":9223372036854775807,"bps":9223372036854775807},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"parity","params":{"chunk":16777216},"children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}},{"type":"file","params":{"path":"c.img"}}]}`,
		`{"type":"linear","params":{"offset":4096,"length":4096},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"file","params":{"path":"images"}}`,
		// Not built: outside the directory.
		`{"type":"cow","children":[{"type":"file","params":{"path":"../cow.sb"}}]}`,
		`{"type":"file","params":{"path":"/etc/passwd"}}`,
		// Rejected by Check, by a layer, or by json.
		`{"type":"mirror","children":[{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"stripe","params":{"chunk":4096},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"stripe","children":[{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"parity","children":[{"type":"file","params":{"path":"a.img"}},{"type":"file","params":{"path":"b.img"}}]}`,
		`{"type":"crypt","params":{"x":1},"children":[{"type":"file","params":{"path":"a.img"}}]}`,
		`{"type":"nope"}`,
		`{"type":"file","params":{"path":"a.img"},"children":[{"type":"file"}]}`,
		`{"type":"file","params":"a.img"}`,
		`{"children":[]}`,
		`[]`,
		`null`,
	} {
		f.Add([]byte(s))
	}

	k, err := keys.New(keys.Generate())
	if err != nil {
		f.Fatal(err)
	}
	types := map[string]block.Type{}
	for _, t := range block.Types() {
		types[t.Name] = t
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxSpecJSON {
			return
		}
		var s block.Spec
		if err := json.Unmarshal(data, &s); err != nil {
			return
		}
		err := block.Check(s)
		rule := checkShape(s, types)
		if rule == nil && usesAFileTwice(s) {
			rule = errors.New("two layers open one file in one directory")
		}
		if (err == nil) != (rule == nil) {
			t.Fatalf("Check says %v, the rule says %v", err, rule)
		}
		if err != nil || countNodes(s) > maxSpecNodes || !confined(s) {
			return
		}
		dir := t.TempDir()
		done := make(chan struct{})
		go func() {
			defer close(done)
			buildAndReopen(t, dir, k, s)
		}()
		select {
		case <-done:
		case <-time.After(time.Minute):
			buf := make([]byte, 1<<20)
			t.Fatalf("building %s: not done after a minute\n%s", data, buf[:runtime.Stack(buf, true)])
		}
	})
}

// buildAndReopen builds s (Create) in the empty dir; if it builds, it
// checks the stack, writes a block, closes, reopens and reads it back.
// It runs on its own goroutine, so it reports with Errorf.
func buildAndReopen(t *testing.T, dir string, k block.Keys, s block.Spec) {
	env := block.Env{Dir: dir, Images: filepath.Join(dir, "images"), Size: 1 << 20, Create: true, Keys: k}
	l, err := block.Build(env, s)
	if err != nil {
		return
	}
	defer func() {
		if l != nil {
			l.Close()
		}
	}()
	d := l.Describe()
	if err := sameShape(d, s); err != nil {
		t.Errorf("built stack: %v", err)
		return
	}
	if d.State != block.StateOK {
		t.Errorf("a stack just created is %s", d.State)
		return
	}
	data := bytes.Repeat([]byte("basalt fuzz spec"), 4096/16)
	if l.Size() < int64(len(data)) {
		return // nothing to write to (a partition of a few bytes)
	}
	// A block at the start and one at the end (4 KiB-aligned).
	offs := []int64{0}
	if end := (l.Size() - int64(len(data))) &^ 4095; end > 0 {
		offs = append(offs, end)
	}
	for i, off := range offs {
		data[0] = byte(i)
		if err := l.WriteAt(data, off, false); err != nil {
			t.Errorf("write at %d to a new %d-byte stack: %v", off, l.Size(), err)
			return
		}
	}
	if err := l.Flush(); err != nil {
		t.Errorf("flush: %v", err)
		return
	}
	check := func(when string) bool {
		got := make([]byte, len(data))
		for i, off := range offs {
			data[0] = byte(i)
			if err := l.ReadAt(got, off); err != nil || !bytes.Equal(got, data) {
				t.Errorf("read at %d %s: %v (equal: %v)", off, when, err, bytes.Equal(got, data))
				return false
			}
		}
		return true
	}
	if !check("after writing") {
		return
	}
	size := l.Size()
	err = l.Close()
	l = nil
	if err != nil {
		t.Errorf("close: %v", err)
		return
	}
	env.Create = false
	if l, err = block.Build(env, s); err != nil {
		t.Errorf("reopening the stack just created: %v", err)
		return
	}
	if l.Size() != size {
		t.Errorf("reopened with %d bytes, created with %d", l.Size(), size)
	}
	check("after reopening")
	if d := l.Describe(); d.State != block.StateOK {
		t.Errorf("reopened stack is %s", d.State)
	}
}
