package volume

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// roLayer serves its child read-only, as docs/layers.md's walkthrough
// layer does.
type roLayer struct{ block.Layer }

func (l roLayer) Capabilities() block.Capabilities {
	c := l.Layer.Capabilities()
	c.ReadOnly, c.Trim, c.WriteZeroes = true, false, false
	return c
}
func (l roLayer) WriteAt([]byte, int64, bool) error { return block.ErrReadOnly }
func (l roLayer) Children() []block.Layer           { return []block.Layer{l.Layer} }

func init() {
	registerWrapper("testro", "serves its child read-only", func(c block.Layer) block.Layer { return roLayer{c} })
}

// A volume whose type serves it read-only refuses the workflows that
// write it with NotSupportedByType, naming the stack — not StoreReadOnly,
// whose message sends the administrator to check a file system that is
// fine — and its rw attachments are served read-only.
func TestReadOnlyTypeRefusesWrites(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	typ := uniq("ro")
	stack := `{"type":"testro","children":[{"type":"cow","children":[` + fileLeaf + `]}]}`
	if _, err := s.CreateVolumeType(ctx, typ, "read-only", json.RawMessage(stack)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.DeleteVolumeType(context.Background(), typ) })
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "ro", SizeBytes: 1 << 20, Type: typ})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error) {
		t.Helper()
		e, ok := errs.As(err)
		if !ok || e.Code != errs.CodeNotSupportedByType || strings.Contains(e.Message, "file system") {
			t.Fatalf("%s of a read-only type's volume: %v, want NotSupportedByType about its stack", what, err)
		}
	}
	_, err = s.CreateSnapshot(ctx, alice, v.ID, "snap", "")
	check("snapshot", err)
	_, err = s.ExtendVolume(ctx, alice, v.ID, 2<<20)
	check("extend", err)
	// Refused, they leave the volume available and its size unchanged.
	got, err := s.Volume(ctx, alice, v.ID)
	if err != nil || got.Status != meta.StatusAvailable || got.SizeBytes != 1<<20 {
		t.Fatalf("after the refusals: %+v, %v", got, err)
	}
	// An rw attachment of it is served read-only.
	a, err := s.Attach(ctx, alice, v.ID, "hv1", meta.ModeRW)
	if err != nil {
		t.Fatal(err)
	}
	x := runExports(t, s)
	exp, err := x.Open(ctx, a.Export, nil)
	if err != nil {
		t.Fatalf("rw attachment of a read-only type's volume: %v", err)
	}
	if !exp.ReadOnly {
		t.Fatal("rw attachment of a read-only type's volume served read-write")
	}
	exp.Release()
	if err := s.Detach(ctx, alice, a.ID); err != nil {
		t.Fatal(err)
	}
	cleanupAll(t, s, alice)
}
