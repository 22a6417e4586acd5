package cow

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
)

// TestCollapseRefusedThenCollected: a collapse whose cow.sb write the full
// store refused may have landed, naming the parent as the top; the old top
// is then in no chain on disk, and a collection meanwhile (roots: what
// cow.sb names) removes it. Once space is back the layer must not settle
// cow.sb by naming the removed old top again and writing into its removed
// files: acknowledged writes must survive a reopen, which must find a top.
func TestCollapseRefusedThenCollected(t *testing.T) {
	const chunk = 8192
	fm := &fullMeta{names: []string{volFile}}
	env := testEnv(t, 8*chunk)
	env.MetaFS = fm.open
	l := build(t, env, fileSpec)
	defer func() { l.Close() }()
	model := make([]byte, env.Size)
	for i, c := range []int64{0, 3} {
		p := bytes.Repeat([]byte{byte(10 + i)}, chunk)
		if err := l.WriteAt(p, c*chunk, false); err != nil {
			t.Fatal(err)
		}
		copy(model[c*chunk:], p)
		if i == 0 {
			if _, err := l.Snapshot("s"); err != nil {
				t.Fatal(err)
			}
		}
	}
	parent := l.top.meta.Parent
	fm.full.Store(true)
	if err := l.Collapse(t.Context(), parent, nil); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("collapse with cow.sb refused: %v, want ENOSPC", err)
	}
	named, err := TopOf(env.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Collect(env.Images, []string{named}, 0); err != nil {
		t.Fatal(err)
	}
	expect(t, l, model, "after the refused collapse and a collection")
	fm.full.Store(false)
	p := bytes.Repeat([]byte{20}, chunk)
	if err := l.WriteAt(p, 5*chunk, false); err != nil {
		t.Fatalf("write once space is back: %v", err)
	}
	copy(model[5*chunk:], p)
	if err := l.Flush(); err != nil {
		t.Fatalf("flush once space is back: %v", err)
	}
	env.Create = false
	l.Close()
	l = build(t, env, fileSpec)
	expect(t, l, model, "reopened")
}
