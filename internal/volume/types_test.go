package volume

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

const fileLeaf = `{"type":"file","params":{"path":"data.img"}}`

// TestVolumeTypesBuiltIn: every cluster has the built-in types; they can be
// looked up by name and are neither re-created nor deleted.
func TestVolumeTypesBuiltIn(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	list, err := s.VolumeTypes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]VolumeType{}
	for i, vt := range list {
		byName[vt.Name] = vt
		if i > 0 && list[i-1].Name >= vt.Name {
			t.Fatalf("types not sorted by name: %q before %q", list[i-1].Name, vt.Name)
		}
	}
	for _, name := range []string{"standard", "striped", "mirrored", "parity", "encrypted", "verified"} {
		vt, ok := byName[name]
		if !ok || !vt.BuiltIn || vt.Description == "" || len(vt.Stack) == 0 {
			t.Errorf("built-in type %q listed as %+v", name, vt)
			continue
		}
		var spec block.Spec
		if err := json.Unmarshal(vt.Stack, &spec); err != nil {
			t.Errorf("type %q: stack %s: %v", name, vt.Stack, err)
		}
		got, err := s.VolumeType(ctx, name)
		if err != nil || !got.BuiltIn || !sameBytes(got.Stack, vt.Stack) {
			t.Errorf("VolumeType(%q): %+v, %v", name, got, err)
		}
		wantCode(t, s.DeleteVolumeType(ctx, name), errs.CodeTypeProtected)
		_, err = s.CreateVolumeType(ctx, name, "", json.RawMessage(`{"type":"cow","children":[`+fileLeaf+`]}`))
		wantCode(t, err, errs.CodeTypeExists)
	}
	if DefaultType != "standard" {
		t.Fatalf("default type %q", DefaultType)
	}
	_, err = s.VolumeType(ctx, "no-such-type")
	if ee, ok := errs.As(err); !ok || ee.Code != errs.CodeUnknownVolumeType || ee.Kind != errs.KindNotFound {
		t.Fatalf("unknown type: %v", err)
	}
	ee, _ := errs.As(s.DeleteVolumeType(ctx, "no-such-type"))
	if ee == nil || ee.Code != errs.CodeUnknownVolumeType {
		t.Fatalf("delete of an unknown type: %v", ee)
	}
}

// TestStripedVolume: a volume of the built-in striped type (cow over a
// stripe of 4 files) keeps data across stripe units, snapshots, clones and
// extends like a standard one, with its data spread over the 4 files.
func TestStripedVolume(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	const size = 4<<20 + 512 // not a whole number of stripe units
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: size, Type: "striped"})
	if err != nil {
		t.Fatal(err)
	}
	vt, _ := s.VolumeType(ctx, "striped")
	if v.Type != "striped" || !sameBytes(v.Stack, vt.Stack) || v.Status != meta.StatusAvailable {
		t.Fatalf("striped volume %+v", v)
	}
	node, err := s.Stack(ctx, v)
	if err != nil || node.Type != "cow" || len(node.Children) != 1 || node.Children[0].Type != "stripe" || len(node.Children[0].Children) != 4 {
		t.Fatalf("striped stack %+v, %v", node, err)
	}
	model := make([]byte, size)
	e.fill(s, v.ID, model, 1, [2]int64{0, 1 << 20}, [2]int64{3<<20 - 100, 200<<10 + 100}, [2]int64{size - 512, 512})
	e.sameVolume(s, v.ID, model, "striped volume")
	top := filepath.Join(e.st.ImagesDir(), e.top(v.ID))
	for i := range 4 {
		f := filepath.Join(top, "stripe"+string(rune('0'+i))+".img")
		if a := allocated(t, f); a < 64<<10 {
			t.Fatalf("stripe leg %d holds %d bytes: the data is not striped", i, a)
		}
	}

	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if sn.Type != "striped" {
		t.Fatalf("snapshot type %q", sn.Type)
	}
	after := slices.Clone(model)
	e.fill(s, v.ID, after, 2, [2]int64{64 << 10, 192 << 10})
	c, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	if c.Type != "striped" {
		t.Fatalf("clone of a striped snapshot has type %q", c.Type)
	}
	e.sameVolume(s, c.ID, model, "clone of a striped snapshot")
	e.sameVolume(s, v.ID, after, "striped volume after its snapshot")

	if _, err := s.ExtendVolume(ctx, alice, v.ID, 8<<20); err != nil {
		t.Fatal(err)
	}
	e.sameVolume(s, v.ID, append(after, make([]byte, 8<<20-size)...), "extended striped volume")
	cleanupAll(t, s, alice)
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("images left: %v", imgs)
	}
	checkProvisioned(t)
}

// TestVerifiedSnapshotOfUnflushedWrites: a snapshot of a `verified`
// volume (checksum over cow) taken right after writes no one flushed
// holds them, checksums included — the checksum layer keeps a write's
// table in memory until a flush, so the freeze must flush the stack above
// cow first — and its clone reads them back without a checksum error.
func TestVerifiedSnapshotOfUnflushedWrites(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	const size = 8 << 20
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: size, Type: "verified"})
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, size)
	// Keep the stack open (as an attachment does): closing it would flush.
	l, release, err := s.acquireWritable(v)
	if err != nil {
		t.Fatal(err)
	}
	for i, at := range []int64{0, 4096, 5 << 20} {
		p := pattern(uint64(40+i), 64<<10)
		if err := l.WriteAt(p, at, false); err != nil {
			t.Fatal(err)
		}
		copy(model[at:], p)
	}
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
	release()
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	e.sameVolume(s, c.ID, model, "clone of a verified volume's snapshot")
	e.sameVolume(s, v.ID, model, "verified volume after its snapshot")
	cleanupAll(t, s, alice)
}

// TestAdminVolumeType: an admin-created type (a throttle over cow over a
// file) is listed, volumes of it work end to end, and deleting the type
// leaves its volumes, snapshots and clones working.
func TestAdminVolumeType(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	name := uniq("qos")
	stack := json.RawMessage(`{"type":"throttle","params":{"iops":100000},"children":[{"type":"cow","params":{"chunk":16384},"children":[` + fileLeaf + `]}]}`)
	vt, err := s.CreateVolumeType(ctx, name, "limited", stack)
	if err != nil {
		t.Fatal(err)
	}
	if vt.Name != name || vt.BuiltIn || vt.Description != "limited" || !sameBytes(vt.Stack, stack) {
		t.Fatalf("created type %+v", vt)
	}
	list, _ := s.VolumeTypes(ctx)
	if i := slices.IndexFunc(list, func(x VolumeType) bool { return x.Name == name }); i < 0 || list[i].BuiltIn || !sameBytes(list[i].Stack, stack) {
		t.Fatalf("type list misses %s: %+v", name, list)
	}
	if got, err := s.VolumeType(ctx, name); err != nil || got.BuiltIn || !sameBytes(got.Stack, stack) {
		t.Fatalf("VolumeType(%s): %+v, %v", name, got, err)
	}
	// The validation build left nothing behind.
	if entries, _ := os.ReadDir(e.st.TempDir()); len(entries) != 0 {
		t.Fatalf("type validation left %v in tmp", entries)
	}
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("type validation left images %v", imgs)
	}
	_, err = s.CreateVolumeType(ctx, name, "", stack)
	wantCode(t, err, errs.CodeTypeExists)

	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20, Type: name})
	if err != nil {
		t.Fatal(err)
	}
	if v.Type != name || !sameBytes(v.Stack, stack) {
		t.Fatalf("volume of %s: %+v", name, v)
	}
	node, err := s.Stack(ctx, v)
	if err != nil || node.Type != "throttle" || node.Children[0].Type != "cow" {
		t.Fatalf("stack %+v, %v", node, err)
	}
	model := make([]byte, 1<<20)
	e.fill(s, v.ID, model, 1, [2]int64{1000, 50000})
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	snapModel := slices.Clone(model)
	c, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	if c.Type != name {
		t.Fatalf("clone type %q", c.Type)
	}
	e.sameVolume(s, c.ID, model, "clone of an admin type's volume")

	// Delete the type: nothing that was made of it changes.
	if err := s.DeleteVolumeType(ctx, name); err != nil {
		t.Fatal(err)
	}
	_, err = s.VolumeType(ctx, name)
	wantCode(t, err, errs.CodeUnknownVolumeType)
	wantCode(t, s.DeleteVolumeType(ctx, name), errs.CodeUnknownVolumeType)
	_, err = s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20, Type: name})
	wantCode(t, err, errs.CodeUnknownVolumeType)
	e.sameVolume(s, v.ID, model, "volume of a deleted type")
	e.fill(s, v.ID, model, 2, [2]int64{0, 4096})
	if _, err := s.ExtendVolume(ctx, alice, v.ID, 2<<20); err != nil {
		t.Fatal(err)
	}
	model = append(model, make([]byte, 1<<20)...)
	e.sameVolume(s, v.ID, model, "volume of a deleted type, extended")
	if _, err := s.CreateSnapshot(ctx, alice, v.ID, "", ""); err != nil {
		t.Fatalf("snapshot of a volume of a deleted type: %v", err)
	}
	c2, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
	if err != nil {
		t.Fatalf("clone of a snapshot of a deleted type: %v", err)
	}
	e.sameVolume(s, c2.ID, snapModel, "clone of a snapshot of a deleted type")
	e.sameVolume(s, c.ID, snapModel, "older clone of a snapshot of a deleted type")
	cleanupAll(t, s, alice)
	checkProvisioned(t)
}

// TestStackWithoutCow: a type without a cow layer makes working volumes
// (create, write, extend, delete) that can neither be snapshotted nor
// flattened: both are refused up front, leaving no trace.
func TestStackWithoutCow(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	name := uniq("raw")
	if _, err := s.CreateVolumeType(ctx, name, "", json.RawMessage(`{"type":"throttle","children":[`+fileLeaf+`]}`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.DeleteVolumeType(context.Background(), name) })
	base := e.provisioned()
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20, Type: name})
	if err != nil {
		t.Fatal(err)
	}
	// The data lives in the volume's own directory; no image exists.
	if n, err := statSize(filepath.Join(e.st.VolumeDir(v.ID), "data.img")); err != nil || n != 1<<20 {
		t.Fatalf("data file: %d bytes, %v", n, err)
	}
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("a stack without cow made images %v", imgs)
	}
	model := make([]byte, 1<<20)
	e.fill(s, v.ID, model, 1, [2]int64{0, 1 << 20})
	e.sameVolume(s, v.ID, model, "volume without cow")

	_, err = s.CreateSnapshot(ctx, alice, v.ID, "nope", "")
	wantCode(t, err, errs.CodeNotSupportedByType)
	if snaps, _ := s.Snapshots(ctx, alice, v.ID); len(snaps) != 0 {
		t.Fatalf("refused snapshot left records: %v", snaps)
	}
	if id, _ := e.meta.LookupName(ctx, meta.NameSnapshot, alice.ID, "nope"); id != "" {
		t.Fatal("refused snapshot claimed its name")
	}
	if cur := e.volume(v.ID); len(cur.Snapshotting) != 0 || cur.Status != meta.StatusAvailable {
		t.Fatalf("refused snapshot marked the volume: %+v", cur)
	}
	if got := e.provisioned() - base; got != 1<<20 {
		t.Fatalf("refused snapshot provisioned %d bytes", got-(1<<20))
	}
	_, err = s.StartJob(ctx, alice, v.ID, meta.JobFlatten)
	wantCode(t, err, errs.CodeNotSupportedByType)
	if cur := e.volume(v.ID); cur.Job != nil || cur.LastJob != nil {
		t.Fatalf("refused flatten left a job: %+v", cur)
	}

	if _, err := s.ExtendVolume(ctx, alice, v.ID, 3<<20); err != nil {
		t.Fatal(err)
	}
	e.sameVolume(s, v.ID, append(model, make([]byte, 2<<20)...), "volume without cow, extended")
	if err := s.DeleteVolume(ctx, alice, v.ID); err != nil {
		t.Fatal(err)
	}
	if exists(e.st.VolumeDir(v.ID)) {
		t.Fatal("volume directory survived its delete")
	}
	if got := e.provisioned(); got != base {
		t.Fatalf("provisioned %d after delete, want %d", got, base)
	}
	checkProvisioned(t)
}

// TestVolumeTypeValidation: CreateVolumeType refuses bad names and every
// stack a build would refuse, or that names files outside its directory,
// with InvalidStack; nothing refused is stored.
func TestVolumeTypeValidation(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	cowOver := func(leaf string) string { return `{"type":"cow","children":[` + leaf + `]}` }
	fileAt := func(path string) string { return `{"type":"file","params":{"path":"` + path + `"}}` }
	for _, c := range []struct{ what, stack string }{
		{"no stack", ``},
		{"null stack", `null`},
		{"empty object", `{}`},
		{"not an object", `"cow"`},
		{"not JSON", `{"type":`},
		{"unknown layer", `{"type":"raid7","children":[` + fileLeaf + `]}`},
		{"unknown leaf", cowOver(`{"type":"tape"}`)},
		{"unknown spec field", `{"type":"cow","kids":[` + fileLeaf + `]}`},
		{"spec field in another case", `{"Type":"cow","children":[` + fileLeaf + `]}`},
		{"spec field twice in two cases", `{"type":"file","Type":"cow","params":{"path":"a.img"}}`},
		{"param in another case", `{"type":"cow","params":{"Chunk":65536},"children":[` + fileLeaf + `]}`},
		{"cow without child", `{"type":"cow"}`},
		{"cow with two children", `{"type":"cow","children":[` + fileLeaf + `,` + fileAt("b.img") + `]}`},
		{"file with a child", `{"type":"file","params":{"path":"a.img"},"children":[` + fileLeaf + `]}`},
		{"stripe of one", cowOver(`{"type":"stripe","children":[` + fileLeaf + `]}`)},
		{"bad cow chunk", `{"type":"cow","params":{"chunk":1000},"children":[` + fileLeaf + `]}`},
		{"misspelt param", `{"type":"cow","params":{"chunck":65536},"children":[` + fileLeaf + `]}`},
		{"bad throttle", `{"type":"throttle","params":{"iops":-1},"children":[` + fileLeaf + `]}`},
		{"file without path", cowOver(`{"type":"file"}`)},
		{"absolute path", cowOver(fileAt("/etc/passwd"))},
		{"parent path", cowOver(fileAt("../escape.img"))},
		{"sneaky parent path", cowOver(fileAt("sub/../../escape.img"))},
		{"unclean path", cowOver(fileAt("./data.img"))},
		{"same file twice", cowOver(`{"type":"stripe","children":[` + fileLeaf + `,` + fileLeaf + `]}`)},
		{"absolute metadata file", `{"type":"checksum","params":{"meta":"/tmp/x.meta"},"children":[` + cowOver(fileLeaf) + `]}`},
		{"metadata file in the parent", cowOver(`{"type":"mirror","params":{"meta":"../m.meta"},"children":[` + fileLeaf + `,` + fileAt("b.img") + `]}`)},
		{"metadata file over the data", cowOver(`{"type":"checksum","params":{"meta":"data.img"},"children":[` + fileLeaf + `]}`)},
		{"two checksums on one metadata file", `{"type":"checksum","children":[{"type":"checksum","children":[` + cowOver(fileLeaf) + `]}]}`},
		{"a file over cow's image metadata", cowOver(fileAt("alloc.map"))},
	} {
		name := uniq("bad")
		_, err := s.CreateVolumeType(ctx, name, "", json.RawMessage(c.stack))
		if ee, ok := errs.As(err); !ok || ee.Code != errs.CodeInvalidStack || ee.Kind != errs.KindInvalid {
			t.Errorf("%s (%s): %v, want InvalidStack", c.what, c.stack, err)
			continue
		}
		if _, err := s.VolumeType(ctx, name); !errs.IsCode(err, errs.CodeUnknownVolumeType) {
			t.Errorf("%s: the refused type was stored (%v)", c.what, err)
		}
	}
	// Names: lower-case, no id look-alikes needed, 1-63 characters.
	for _, name := range []string{"", "Gold", "-x", "a b", "a/b", "ä", strings.Repeat("x", 64)} {
		_, err := s.CreateVolumeType(ctx, name, "", json.RawMessage(cowOver(fileLeaf)))
		wantCode(t, err, errs.CodeInvalidName)
	}
	if entries, _ := os.ReadDir(e.st.TempDir()); len(entries) != 0 {
		t.Fatalf("validation left %v in tmp", entries)
	}
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("validation left images %v", imgs)
	}
	// A subdirectory path is a plain relative name: fine.
	name := uniq("sub")
	if _, err := s.CreateVolumeType(ctx, name, "", json.RawMessage(cowOver(fileAt("sub/data.img")))); err != nil {
		t.Fatalf("file in a subdirectory: %v", err)
	}
	if err := s.DeleteVolumeType(ctx, name); err != nil {
		t.Fatal(err)
	}
}

// TestStackWithTwoCowLayers: a stack with more than one cow layer must be
// refused (InvalidStack) or work: data intact across a collection and a
// reopen.
//
// Service bug (fails today): checkStack (types.go) accepts both stacks
// below. Every cow layer of a stack keeps its cow.sb in the directory it
// is built in: two cows side by side (under a stripe) share the volume's
// cow.sb, so one overwrites the other's and the volume reads wrong data
// after a reopen; a cow under a cow keeps its cow.sb in the outer cow's
// image directory, which collect (stacks.go, roots are only the cow.sb of
// volume directories) never reads, so the inner images are removed at the
// next collection and the volume cannot be opened again.
func TestStackWithTwoCowLayers(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	leaf := func(p string) string { return `{"type":"file","params":{"path":"` + p + `"}}` }
	for what, stack := range map[string]string{
		"cow over cow": `{"type":"cow","children":[{"type":"cow","children":[` + fileLeaf + `]}]}`,
		"two cows":     `{"type":"stripe","children":[{"type":"cow","children":[` + leaf("a.img") + `]},{"type":"cow","children":[` + leaf("b.img") + `]}]}`,
	} {
		name := uniq("twocow")
		_, err := s.CreateVolumeType(ctx, name, "", json.RawMessage(stack))
		if errs.IsCode(err, errs.CodeInvalidStack) {
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20, Type: name})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		model := make([]byte, 1<<20)
		e.fill(s, v.ID, model, 1, [2]int64{0, 1 << 20})
		// Any delete runs a collection.
		if err := s.DeleteVolume(ctx, alice, smallVolume(t, s, alice)); err != nil {
			t.Fatal(err)
		}
		l, release, err := s.acquireReader(e.volume(v.ID))
		if err != nil {
			t.Errorf("%s: the volume cannot be opened after a collection: %v", what, err)
		} else {
			got := make([]byte, 1<<20)
			err := l.ReadAt(got, 0)
			release()
			if err != nil || !sameBytes(got, model) {
				t.Errorf("%s: the volume's data is wrong after a reopen (first difference at %d, err %v)", what, firstDiff(got, model), err)
			}
		}
		s.DeleteVolumeType(ctx, name)
	}
	cleanupAll(t, s, alice)
}

// TestDeviceSizeIsRecordSize: the device a volume exports is exactly the
// size its record says (and provisioning counts), also for a stack whose
// layers round sizes up; or the service refuses such a stack.
//
// Service bug (fails today): without a cow layer on top (cow keeps its own
// exact size), a stripe rounds its size up to whole stripe units times its
// children: a 100 KiB volume of a 4-file stripe (64 KiB units) is a
// 256 KiB device, which the NBD server exports (it serves Device.Size()).
// createStack (stacks.go) does not reconcile the built size with the
// record, and resize (volumes.go, `l.Size() >= v.TargetSize`) then treats
// an extend within the rounding as done.
func TestDeviceSizeIsRecordSize(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	leaf := func(p string) string { return `{"type":"file","params":{"path":"` + p + `"}}` }
	name := uniq("rawstripe")
	_, err := s.CreateVolumeType(ctx, name, "", json.RawMessage(`{"type":"stripe","children":[`+
		leaf("0.img")+`,`+leaf("1.img")+`,`+leaf("2.img")+`,`+leaf("3.img")+`]}`))
	if errs.IsCode(err, errs.CodeInvalidStack) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.DeleteVolumeType(context.Background(), name) })
	defer cleanupAll(t, s, alice)
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 100 << 10, Type: name})
	if err != nil {
		t.Fatal(err)
	}
	e.withStack(s, v.ID, func(l block.Layer) {
		if l.Size() != 100<<10 {
			t.Errorf("a 100 KiB volume exports a %d-byte device", l.Size())
		}
	})
	if _, err := s.ExtendVolume(ctx, alice, v.ID, 300<<10); err != nil {
		t.Fatal(err)
	}
	e.withStack(s, v.ID, func(l block.Layer) {
		if l.Size() != 300<<10 {
			t.Errorf("extended to 300 KiB, the volume exports a %d-byte device", l.Size())
		}
	})
}

// TestSavedStackParamsInAnotherCase: a volume type an older basalt
// accepted and stored with a parameter named in another case (params
// {"Chunk":16384}: its decoder matched keys whatever their case) still
// makes volumes, and a volume recorded with such a stack still opens;
// only new types are held to the exact names (block.CheckNew).
func TestSavedStackParamsInAnotherCase(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")

	// The old decoders accepted this stack (checkStack and cow's params).
	stack := json.RawMessage(`{"type":"cow","params":{"Chunk":16384},"children":[` + fileLeaf + `]}`)
	var old struct {
		Chunk int64 `json:"chunk,omitempty"`
	}
	d := json.NewDecoder(bytes.NewReader([]byte(`{"Chunk":16384}`)))
	d.DisallowUnknownFields()
	if err := d.Decode(&old); err != nil || old.Chunk != 16384 {
		t.Fatalf("old decoder: %v %+v", err, old)
	}

	// Stored as the older version stored it (CreateVolumeType keeps the raw stack).
	name := uniq("oldtype")
	e.update(func(tx *meta.Tx) error {
		tx.PutVolumeType(&meta.VolumeType{Name: name, Stack: stack, CreatedAt: now()})
		return nil
	})
	_, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20, Type: name})
	if err != nil {
		t.Errorf("volume of a type stored before the upgrade: %v", err)
	}

	// A volume made before the upgrade: same stack recorded in its record.
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// Rewrite only the stack's params key case, as the old record would hold
	// (cow's chunk default is 64 KiB; use it so the on-disk data matches).
	e.editVolume(v.ID, func(r *meta.Volume) {
		r.Stack = bytes.Replace(r.Stack, []byte(`"type":"cow"`), []byte(`"type":"cow","params":{"Chunk":65536}`), 1)
	})
	if _, err := s.Stack(ctx, e.volume(v.ID)); err != nil {
		t.Errorf("volume recorded before the upgrade does not open: %v", err)
	}
}
