package volume

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

func TestCreateExtendDeleteVolume(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	base := e.provisioned()
	std, err := s.VolumeType(ctx, "standard")
	if err != nil {
		t.Fatal(err)
	}

	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "data", SizeBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != meta.StatusAvailable || v.Node != "" || v.Owner != "alice" || v.OwnerID != alice.ID ||
		v.Type != "standard" || v.SizeBytes != 1<<30 || !volumeIDRE.MatchString(v.ID) || v.CreatedAt.IsZero() ||
		v.Job != nil || v.LastJob != nil || v.StatusMessage != "" {
		t.Fatalf("created volume %+v", v)
	}
	if !sameBytes(v.Stack, std.Stack) {
		t.Fatalf("volume stack %s, want the standard type's %s", v.Stack, std.Stack)
	}
	// The stack exists on disk: cow.sb in the volume's directory names one
	// empty image holding a sparse data file of the volume's size.
	imgs := e.images()
	if len(imgs) != 1 || e.top(v.ID) != imgs[0] {
		t.Fatalf("images %v, volume top %s", imgs, e.top(v.ID))
	}
	data := filepath.Join(e.st.ImagesDir(), imgs[0], "data.img")
	if n, err := statSize(data); err != nil || n != 1<<30 {
		t.Fatalf("data file: %d bytes, %v", n, err)
	}
	if a := allocated(t, data); a > 1<<20 {
		t.Fatalf("create wrote %d bytes of data; creation must be O(1)", a)
	}
	if got := e.provisioned() - base; got != 1<<30 {
		t.Fatalf("provisioned grew by %d, want 1 GiB", got)
	}
	// By id and by name; in the list.
	for _, ref := range []string{v.ID, "data"} {
		got, err := s.Volume(ctx, alice, ref)
		if err != nil || got.ID != v.ID {
			t.Fatalf("Volume(%s): %+v, %v", ref, got, err)
		}
	}
	list, err := s.Volumes(ctx, alice)
	if err != nil || len(list) != 1 || list[0].ID != v.ID {
		t.Fatalf("Volumes: %v, %v", list, err)
	}
	// Its layer tree is described.
	node, err := s.Stack(ctx, v)
	if err != nil || node == nil || node.Type != "cow" || len(node.Children) != 1 || node.Children[0].Type != "file" {
		t.Fatalf("Stack: %+v, %v", node, err)
	}

	// Data at both ends.
	head, tail := pattern(1, 8192), pattern(2, 4096)
	e.fill(s, v.ID, nil, 1, [2]int64{0, 8192})
	e.fill(s, v.ID, nil, 2, [2]int64{1<<30 - 4096, 4096})

	// Extend by name: the live stack grows, the old data stays, the new
	// range reads as zeroes and takes writes.
	v2, err := s.ExtendVolume(ctx, alice, "data", 2<<30)
	if err != nil {
		t.Fatal(err)
	}
	if v2.SizeBytes != 2<<30 || v2.Status != meta.StatusAvailable || v2.TargetSize != 0 || v2.Node != "" {
		t.Fatalf("extended volume %+v", v2)
	}
	if got := e.provisioned() - base; got != 2<<30 {
		t.Fatalf("provisioned grew by %d after extend, want 2 GiB", got)
	}
	e.withStack(s, v.ID, func(l block.Layer) {
		if l.Size() != 2<<30 {
			t.Fatalf("device is %d bytes after extend", l.Size())
		}
	})
	if got := e.readAt(s, v.ID, 0, 8192); !sameBytes(got, head) {
		t.Fatal("extend lost the data at the start")
	}
	got := e.readAt(s, v.ID, 1<<30-4096, 1<<20)
	if !sameBytes(got[:4096], tail) || !allZero(got[4096:]) {
		t.Fatal("extend: old end or new range wrong")
	}
	if !allZero(e.readAt(s, v.ID, 2<<30-1<<20, 1<<20)) {
		t.Fatal("the end of the new range is not zero")
	}
	e.fill(s, v.ID, nil, 3, [2]int64{2<<30 - 4096, 4096})
	if got := e.readAt(s, v.ID, 2<<30-4096, 4096); !sameBytes(got, pattern(3, 4096)) {
		t.Fatal("write to the new range did not stick")
	}
	if n, _ := statSize(data); n != 2<<30 {
		t.Fatalf("data file is %d bytes after extend", n)
	}

	// Never shrink, never the same size, whole sectors only, positive.
	_, err = s.ExtendVolume(ctx, alice, v.ID, 1<<30)
	wantCode(t, err, errs.CodeShrinkNotAllowed)
	_, err = s.ExtendVolume(ctx, alice, v.ID, 2<<30)
	wantCode(t, err, errs.CodeShrinkNotAllowed)
	_, err = s.ExtendVolume(ctx, alice, v.ID, 2<<30+100)
	wantCode(t, err, errs.CodeInvalidSize)
	_, err = s.ExtendVolume(ctx, alice, v.ID, -512)
	wantCode(t, err, errs.CodeInvalidSize)
	if cur := e.volume(v.ID); cur.SizeBytes != 2<<30 || cur.Status != meta.StatusAvailable {
		t.Fatalf("refused extends changed the record: %+v", cur)
	}
	e.withStack(s, v.ID, func(l block.Layer) {
		if l.Size() != 2<<30 {
			t.Fatalf("refused extends changed the device to %d bytes", l.Size())
		}
	})

	// Delete: the record, the name, the directory and (no snapshot needs
	// them) the images go.
	if err := s.DeleteVolume(ctx, alice, "data"); err != nil {
		t.Fatal(err)
	}
	if exists(e.st.VolumeDir(v.ID)) {
		t.Fatal("volume directory still exists")
	}
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("images left after delete: %v", imgs)
	}
	if _, err := s.Volume(ctx, alice, v.ID); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("deleted volume: %v", err)
	}
	if _, err := s.Volume(ctx, alice, "data"); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("deleted volume's name still resolves: %v", err)
	}
	wantCode(t, s.DeleteVolume(ctx, alice, v.ID), errs.CodeNotFound)
	if got := e.provisioned(); got != base {
		t.Fatalf("provisioned %d after delete, want %d", got, base)
	}
	// The name is free again, and a new volume of it starts empty.
	v3, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "data", SizeBytes: 64 << 10})
	if err != nil {
		t.Fatalf("reuse of a deleted volume's name: %v", err)
	}
	if !allZero(e.readVolume(s, v3.ID)) {
		t.Fatal("a new volume is not all zeroes")
	}
	if err := s.DeleteVolume(ctx, alice, "data"); err != nil {
		t.Fatal(err)
	}
	checkProvisioned(t)
}

func TestCreateVolumeValidation(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	base := e.provisioned()
	for _, c := range []struct {
		req  CreateVolume
		code string
	}{
		{CreateVolume{SizeBytes: 0}, errs.CodeInvalidSize},
		{CreateVolume{SizeBytes: -4096}, errs.CodeInvalidSize},
		{CreateVolume{SizeBytes: 1000}, errs.CodeInvalidSize},
		{CreateVolume{SizeBytes: 1<<60 + 512}, errs.CodeInvalidSize},
		{CreateVolume{SizeBytes: 4096, Type: "gold"}, errs.CodeUnknownVolumeType},
		{CreateVolume{SizeBytes: 4096, ClientToken: "has space"}, errs.CodeInvalidRequest},
		{CreateVolume{SizeBytes: 4096, ClientToken: strings.Repeat("t", 129)}, errs.CodeInvalidRequest},
		{CreateVolume{SizeBytes: 4096, FromSnapshot: "snap-0123456789abcdef"}, errs.CodeNotFound},
		{CreateVolume{SizeBytes: 4096, FromSnapshot: "no-such-snapshot"}, errs.CodeNotFound},
	} {
		_, err := s.CreateVolume(ctx, alice, c.req)
		if !errs.IsCode(err, c.code) {
			t.Errorf("%+v: %v, want %s", c.req, err, c.code)
		}
	}
	if _, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 4096, ClientToken: strings.Repeat("t", 128)}); err != nil {
		t.Errorf("128-character token: %v", err)
	}
	list, _ := s.Volumes(ctx, alice)
	if len(list) != 1 {
		t.Fatalf("refused creates left records: %d volumes", len(list))
	}
	if err := s.DeleteVolume(ctx, alice, list[0].ID); err != nil {
		t.Fatal(err)
	}
	if got := e.provisioned(); got != base {
		t.Fatalf("provisioned %d, want %d", got, base)
	}
}

func TestNameRules(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice, bob := caller("alice"), caller("bob")

	for _, name := range []string{
		"vol-0123456789abcdef", "snap-0123456789abcdef", // look like ids
		"-x", ".x", "_x", "a/b", "a b", "a\x00", "ä", strings.Repeat("n", 64),
	} {
		_, err := s.CreateVolume(ctx, alice, CreateVolume{Name: name, SizeBytes: 4096})
		if e, ok := errs.As(err); !ok || e.Code != errs.CodeInvalidName || e.Kind != errs.KindInvalid {
			t.Errorf("volume name %q: %v, want InvalidName", name, err)
		}
	}
	// Almost-ids and the longest name are fine.
	for _, name := range []string{"vol-0123456789ABCDEF", "vol-0123456789abcde", "snap-0123456789abcdefa", strings.Repeat("n", 63), "A.b_c-9"} {
		if _, err := s.CreateVolume(ctx, alice, CreateVolume{Name: name, SizeBytes: 4096}); err != nil {
			t.Errorf("volume name %q: %v", name, err)
		}
	}
	// Unique per owner, not globally.
	a1, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "shared", SizeBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateVolume(ctx, alice, CreateVolume{Name: "shared", SizeBytes: 8192})
	if e, ok := errs.As(err); !ok || e.Code != errs.CodeNameConflict || e.Kind != errs.KindConflict {
		t.Fatalf("duplicate name: %v, want NameConflict", err)
	}
	b1, err := s.CreateVolume(ctx, bob, CreateVolume{Name: "shared", SizeBytes: 4096})
	if err != nil {
		t.Fatalf("same name for another owner: %v", err)
	}
	// Each resolves the name to their own volume.
	if v, _ := s.Volume(ctx, alice, "shared"); v == nil || v.ID != a1.ID {
		t.Fatal("alice's name resolves elsewhere")
	}
	if v, _ := s.Volume(ctx, bob, "shared"); v == nil || v.ID != b1.ID {
		t.Fatal("bob's name resolves elsewhere")
	}
	// Snapshot names follow the same rules, separately from volume names.
	_, err = s.CreateSnapshot(ctx, alice, a1.ID, "snap-0123456789abcdef", "")
	wantCode(t, err, errs.CodeInvalidName)
	_, err = s.CreateSnapshot(ctx, alice, a1.ID, "a/b", "")
	wantCode(t, err, errs.CodeInvalidName)
	sn, err := s.CreateSnapshot(ctx, alice, a1.ID, "shared", "") // same as a volume name: fine
	if err != nil {
		t.Fatal(err)
	}
	e.snapAvailable(sn.ID)
	_, err = s.CreateSnapshot(ctx, alice, a1.ID, "shared", "")
	wantCode(t, err, errs.CodeNameConflict)
	if got, err := s.Snapshot(ctx, alice, "shared"); err != nil || got.ID != sn.ID {
		t.Fatalf("snapshot by name: %v", err)
	}
	cleanupAll(t, s, alice, bob)
	checkProvisioned(t)
}

// TestCreateNameRace: ten concurrent creates of one name by one owner;
// exactly one volume exists afterwards and only it is provisioned.
func TestCreateNameRace(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	base := e.provisioned()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var wins, conflicts int
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "one", SizeBytes: 1 << 20})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errs.IsCode(err, errs.CodeNameConflict):
				conflicts++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 || conflicts != 9 {
		t.Fatalf("%d creates won, %d conflicted", wins, conflicts)
	}
	list, _ := s.Volumes(ctx, alice)
	if len(list) != 1 {
		t.Fatalf("%d volumes exist", len(list))
	}
	if got := e.provisioned() - base; got != 1<<20 {
		t.Fatalf("provisioned grew by %d, want 1 MiB", got)
	}
	cleanupAll(t, s, alice)
}

func TestOwnership(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice, bob := caller("alice"), caller("bob")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "mine", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "mysnap", "")
	if err != nil {
		t.Fatal(err)
	}
	e.snapAvailable(sn.ID)

	// Bob gets NotFound for everything of alice's, by id and by name, the
	// same answer as for an id that does not exist.
	notFound := func(what string, err error) {
		t.Helper()
		ee, ok := errs.As(err)
		if !ok || ee.Code != errs.CodeNotFound || ee.Kind != errs.KindNotFound {
			t.Errorf("bob %s: %v, want NotFound", what, err)
		}
	}
	for _, ref := range []string{v.ID, "mine"} {
		_, err := s.Volume(ctx, bob, ref)
		notFound("Volume "+ref, err)
		_, err = s.ExtendVolume(ctx, bob, ref, 2<<20)
		notFound("ExtendVolume "+ref, err)
		notFound("DeleteVolume "+ref, s.DeleteVolume(ctx, bob, ref))
		_, err = s.CreateSnapshot(ctx, bob, ref, "", "")
		notFound("CreateSnapshot "+ref, err)
		_, err = s.Snapshots(ctx, bob, ref)
		notFound("Snapshots of "+ref, err)
		_, err = s.StartJob(ctx, bob, ref, meta.JobFlatten)
		notFound("StartJob "+ref, err)
	}
	for _, ref := range []string{sn.ID, "mysnap"} {
		_, err := s.Snapshot(ctx, bob, ref)
		notFound("Snapshot "+ref, err)
		notFound("DeleteSnapshot "+ref, s.DeleteSnapshot(ctx, bob, ref))
		_, err = s.CreateVolume(ctx, bob, CreateVolume{FromSnapshot: ref})
		notFound("clone "+ref, err)
	}
	_, errMissing := s.Volume(ctx, bob, "vol-00000000deadbeef")
	_, errHidden := s.Volume(ctx, bob, v.ID)
	if strings.Replace(errHidden.Error(), v.ID, "X", 1) != strings.Replace(errMissing.Error(), "vol-00000000deadbeef", "X", 1) {
		t.Errorf("a hidden volume is distinguishable from a missing one: %q vs %q", errHidden, errMissing)
	}
	if list, _ := s.Volumes(ctx, bob); len(list) != 0 {
		t.Fatalf("bob lists %d volumes", len(list))
	}
	if list, _ := s.Snapshots(ctx, bob, ""); len(list) != 0 {
		t.Fatalf("bob lists %d snapshots", len(list))
	}
	// Nothing changed.
	if cur, _ := e.meta.Volume(ctx, v.ID); cur.SizeBytes != 1<<20 || cur.Status != meta.StatusAvailable {
		t.Fatalf("bob's refused calls changed alice's volume: %+v", cur)
	}

	// Admin sees and acts on alice's resources by id.
	if got, err := s.Volume(ctx, adminCaller, v.ID); err != nil || got.Owner != "alice" {
		t.Fatalf("admin Volume: %v", err)
	}
	if got, err := s.Snapshot(ctx, adminCaller, sn.ID); err != nil || got.OwnerID != alice.ID {
		t.Fatalf("admin Snapshot: %v", err)
	}
	if list, _ := s.Volumes(ctx, adminCaller); !containsVolume(list, v.ID) {
		t.Fatal("admin's list misses alice's volume")
	}
	if list, _ := s.Snapshots(ctx, adminCaller, v.ID); len(list) != 1 || list[0].ID != sn.ID {
		t.Fatalf("admin's snapshot list of the volume: %v", list)
	}
	if _, err := s.ExtendVolume(ctx, adminCaller, v.ID, 2<<20); err != nil {
		t.Fatalf("admin extend: %v", err)
	}
	// A snapshot admin takes of alice's volume belongs to alice.
	asn, err := s.CreateSnapshot(ctx, adminCaller, v.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if asn.OwnerID != alice.ID || asn.Owner != "alice" {
		t.Fatalf("admin's snapshot of alice's volume is owned by %s/%s", asn.Owner, asn.OwnerID)
	}
	e.snapAvailable(asn.ID)
	if _, err := s.Snapshot(ctx, alice, asn.ID); err != nil {
		t.Fatalf("alice cannot see the snapshot admin took of her volume: %v", err)
	}
	cleanupAll(t, s, alice, bob)
	checkProvisioned(t)
}

func containsVolume(list []*meta.Volume, id string) bool {
	for _, v := range list {
		if v.ID == id {
			return true
		}
	}
	return false
}

func TestProvisioningLimit(t *testing.T) {
	e := newEnv(t)
	tiny := e.started(Config{Overcommit: 1e-12})
	ctx := ctxT(t)
	alice := caller("alice")
	base := e.provisioned()
	limit, err := tiny.Limit()
	if err != nil {
		t.Fatal(err)
	}
	_, err = tiny.CreateVolume(ctx, alice, CreateVolume{Name: "big", SizeBytes: 1 << 30})
	if ee, ok := errs.As(err); !ok || ee.Code != errs.CodeInsufficientCapacity || ee.Kind != errs.KindInsufficientStorage {
		t.Fatalf("create beyond the limit (%d bytes): %v, want InsufficientCapacity", limit, err)
	}
	// Nothing was written: no record, no name, no file, no bytes.
	if list, _ := tiny.Volumes(ctx, alice); len(list) != 0 {
		t.Fatalf("refused create left %d records", len(list))
	}
	if id, _ := e.meta.LookupName(ctx, meta.NameVolume, alice.ID, "big"); id != "" {
		t.Fatal("refused create claimed the name")
	}
	if entries, _ := os.ReadDir(e.st.Root + "/volumes"); len(entries) != 0 {
		t.Fatalf("refused create left files: %v", entries)
	}
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("refused create left images: %v", imgs)
	}
	if got := e.provisioned(); got != base {
		t.Fatalf("provisioned changed by %d", got-base)
	}

	// A create that fits the limit but not beside what is provisioned:
	// its stack is built, the transaction refuses it, the stack and its
	// image are removed.
	c, err := e.st.Capacity()
	if err != nil {
		t.Fatal(err)
	}
	small := e.started(Config{Overcommit: float64(base+3<<20) / float64(c.TotalBytes)})
	first, err := small.CreateVolume(ctx, alice, CreateVolume{Name: "first", SizeBytes: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	firstImages := e.images()
	_, err = small.CreateVolume(ctx, alice, CreateVolume{Name: "second", SizeBytes: 2 << 20})
	wantCode(t, err, errs.CodeInsufficientCapacity)
	if dirs := e.volumeDirs(); !slices.Equal(dirs, []string{first.ID}) {
		t.Fatalf("volume directories after the refused create: %v, want %s's only", dirs, first.ID)
	}
	if imgs := e.images(); !slices.Equal(imgs, firstImages) {
		t.Fatalf("images after the refused create: %v, want %v", imgs, firstImages)
	}
	if err := small.DeleteVolume(ctx, alice, first.ID); err != nil {
		t.Fatal(err)
	}
	e.settle() // two services, one store, no grace: one collects while the other creates

	// With the default overcommit the same create works; extending or
	// snapshotting it through the tiny-limit service is refused.
	normal := e.service(Config{})
	v, err := normal.CreateVolume(ctx, alice, CreateVolume{Name: "big", SizeBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	_, err = tiny.ExtendVolume(ctx, alice, v.ID, 2<<30)
	wantCode(t, err, errs.CodeInsufficientCapacity)
	if cur, _ := e.meta.Volume(ctx, v.ID); cur.Status != meta.StatusAvailable || cur.SizeBytes != 1<<30 || cur.TargetSize != 0 {
		t.Fatalf("refused extend changed the record: %+v", cur)
	}
	_, err = tiny.CreateSnapshot(ctx, alice, v.ID, "", "")
	wantCode(t, err, errs.CodeInsufficientCapacity)
	if cur, _ := e.meta.Volume(ctx, v.ID); len(cur.Snapshotting) != 0 {
		t.Fatalf("refused snapshot left a mark on the volume: %v", cur.Snapshotting)
	}
	if snaps, _ := tiny.Snapshots(ctx, alice, ""); len(snaps) != 0 {
		t.Fatal("refused snapshot left a record")
	}
	if n := len(e.chain(v.ID)); n != 1 {
		t.Fatalf("refused snapshot froze the volume's image anyway: chain of %d images", n)
	}
	// A volume bigger than the whole default limit is refused too.
	capa, err := normal.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if capa.LimitBytes <= 0 || capa.Overcommit != DefaultOvercommit || capa.ProvisionedBytes < 1<<30 {
		t.Fatalf("capacity %+v", capa)
	}
	over := (capa.LimitBytes - capa.ProvisionedBytes + 1<<20) &^ 511
	_, err = normal.CreateVolume(ctx, alice, CreateVolume{SizeBytes: over})
	wantCode(t, err, errs.CodeInsufficientCapacity)

	// Deleting everything gives every byte back.
	if err := normal.DeleteVolume(ctx, alice, v.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.provisioned(); got != base {
		t.Fatalf("provisioned %d after deleting everything, want %d", got, base)
	}
	checkProvisioned(t)
}

func TestIdempotentCreate(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice, bob := caller("alice"), caller("bob")
	base := e.provisioned()
	req := CreateVolume{Name: "idem", SizeBytes: 1 << 20, ClientToken: "tok-1"}
	v1, err := s.CreateVolume(ctx, alice, req)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := s.CreateVolume(ctx, alice, req)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if v2.ID != v1.ID {
		t.Fatalf("replay made a second volume %s (first %s)", v2.ID, v1.ID)
	}
	if got := e.provisioned() - base; got != 1<<20 {
		t.Fatalf("replay provisioned again: %d", got)
	}
	// Same token, other parameters: refused.
	_, err = s.CreateVolume(ctx, alice, CreateVolume{Name: "idem", SizeBytes: 2 << 20, ClientToken: "tok-1"})
	if ee, ok := errs.As(err); !ok || ee.Kind != errs.KindConflict {
		t.Fatalf("token reused with another size: %v, want a conflict", err)
	}
	// Tokens are per owner.
	vb, err := s.CreateVolume(ctx, bob, req)
	if err != nil || vb.ID == v1.ID {
		t.Fatalf("bob with alice's token: %+v, %v", vb, err)
	}
	// A snapshot create with the same token is independent of the volume's.
	sn, err := s.CreateSnapshot(ctx, alice, v1.ID, "", "tok-1")
	if err != nil {
		t.Fatalf("snapshot with a token used by a volume create: %v", err)
	}
	sn2, err := s.CreateSnapshot(ctx, alice, v1.ID, "", "tok-1")
	if err != nil || sn2.ID != sn.ID || sn2.Image != sn.Image {
		t.Fatalf("snapshot replay: %+v, %v", sn2, err)
	}
	e.snapAvailable(sn.ID)
	if n := len(e.chain(v1.ID)); n != 2 {
		t.Fatalf("snapshot replay froze the volume again: chain of %d images", n)
	}
	// Same token, another volume: refused.
	_, err = s.CreateSnapshot(ctx, alice, smallVolume(t, s, alice), "", "tok-1")
	if ee, ok := errs.As(err); !ok || ee.Code != errs.CodeIdempotentMismatch {
		t.Fatalf("snapshot token reused for another volume: %v", err)
	}
	if v3, err := s.CreateVolume(ctx, alice, req); err != nil || v3.ID != v1.ID {
		t.Fatalf("volume replay after a snapshot used the token: %+v, %v", v3, err)
	}
	// After deleting the volume, the token is free.
	if err := s.DeleteSnapshot(ctx, alice, sn.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, alice, v1.ID); err != nil {
		t.Fatal(err)
	}
	v4, err := s.CreateVolume(ctx, alice, req)
	if err != nil || v4.ID == v1.ID {
		t.Fatalf("create after delete with the old token: %+v, %v", v4, err)
	}
	cleanupAll(t, s, alice, bob)
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("images left after deleting everything: %v", imgs)
	}
	checkProvisioned(t)
}

// TestIdempotentReplayWithoutSource: a create retried with its client
// token returns what the first call made even when the source it named
// is gone since — the snapshot of a clone, the volume type, the volume
// of a snapshot — not NotFound, which would tell a client whose first
// answer was lost that nothing was made (and leave the volume holding
// capacity unknown to it). Other parameters with the token are refused.
func TestIdempotentReplayWithoutSource(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	src, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "src", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sn, err := s.CreateSnapshot(ctx, alice, src.ID, "snap", "snap-1")
	if err != nil {
		t.Fatal(err)
	}
	e.snapAvailable(sn.ID)
	kept, err := s.CreateSnapshot(ctx, alice, src.ID, "kept", "kept-1")
	if err != nil {
		t.Fatal(err)
	}
	e.snapAvailable(kept.ID)
	clone := CreateVolume{Name: "clone", FromSnapshot: "snap", ClientToken: "clone-1"}
	c1, err := s.CreateVolume(ctx, alice, clone)
	if err != nil {
		t.Fatal(err)
	}
	typ := uniq("gone")
	if _, err := s.CreateVolumeType(ctx, typ, "", json.RawMessage(`{"type":"cow","children":[`+fileLeaf+`]}`)); err != nil {
		t.Fatal(err)
	}
	typed := CreateVolume{Name: "typed", SizeBytes: 1 << 20, Type: typ, ClientToken: "typed-1"}
	t1, err := s.CreateVolume(ctx, alice, typed)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSnapshot(ctx, alice, sn.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolumeType(ctx, typ); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, alice, src.ID); err != nil {
		t.Fatal(err)
	}
	base := e.provisioned()

	if v, err := s.CreateVolume(ctx, alice, clone); err != nil || v.ID != c1.ID {
		t.Fatalf("clone replayed after its snapshot's delete: %+v, %v; want %s", v, err, c1.ID)
	}
	withSize := clone
	withSize.SizeBytes = c1.SizeBytes
	if v, err := s.CreateVolume(ctx, alice, withSize); err != nil || v.ID != c1.ID {
		t.Fatalf("clone replayed with its size given: %+v, %v; want %s", v, err, c1.ID)
	}
	if v, err := s.CreateVolume(ctx, alice, typed); err != nil || v.ID != t1.ID {
		t.Fatalf("create replayed after its type's delete: %+v, %v; want %s", v, err, t1.ID)
	}
	if r, err := s.CreateSnapshot(ctx, alice, src.ID, "kept", "kept-1"); err != nil || r.ID != kept.ID {
		t.Fatalf("snapshot replayed after its volume's delete: %+v, %v; want %s", r, err, kept.ID)
	}
	if r, err := s.CreateSnapshot(ctx, alice, "src", "kept", "kept-1"); err != nil || r.ID != kept.ID {
		t.Fatalf("snapshot replayed by its deleted volume's name: %+v, %v; want %s", r, err, kept.ID)
	}
	if got := e.provisioned(); got != base {
		t.Fatalf("replays provisioned %d bytes", got-base)
	}
	for _, c := range []struct {
		name string
		req  CreateVolume
	}{
		{"another name", CreateVolume{Name: "other", FromSnapshot: "snap", ClientToken: "clone-1"}},
		{"another size", CreateVolume{Name: "clone", FromSnapshot: "snap", SizeBytes: 2 << 20, ClientToken: "clone-1"}},
		{"another type", CreateVolume{Name: "typed", SizeBytes: 1 << 20, Type: "standard", ClientToken: "typed-1"}},
		{"no type", CreateVolume{Name: "typed", SizeBytes: 1 << 20, Type: typ + "x", ClientToken: "typed-1"}},
	} {
		if _, err := s.CreateVolume(ctx, alice, c.req); !errs.IsCode(err, errs.CodeIdempotentMismatch) {
			t.Errorf("%s with a used token: %v, want %s", c.name, err, errs.CodeIdempotentMismatch)
		}
	}
	if _, err := s.CreateSnapshot(ctx, alice, src.ID, "other", "kept-1"); !errs.IsCode(err, errs.CodeIdempotentMismatch) {
		t.Errorf("snapshot of another name with a used token: %v, want %s", err, errs.CodeIdempotentMismatch)
	}
	if _, err := s.CreateSnapshot(ctx, alice, "vol-0000000000000000", "kept", "kept-1"); !errs.IsCode(err, errs.CodeIdempotentMismatch) {
		t.Errorf("snapshot of another volume with a used token: %v, want %s", err, errs.CodeIdempotentMismatch)
	}
	// Without a token, or with an unused one, the source is still missing.
	for _, tok := range []string{"", "fresh"} {
		req := clone
		req.ClientToken = tok
		if _, err := s.CreateVolume(ctx, alice, req); !errs.IsCode(err, errs.CodeNotFound) {
			t.Errorf("clone of a deleted snapshot, token %q: %v, want NotFound", tok, err)
		}
	}
	cleanupAll(t, s, alice)
	checkProvisioned(t)
}

// smallVolume makes another small volume of c and returns its id.
func smallVolume(t *testing.T, s *Service, c Caller) string {
	t.Helper()
	v, err := s.CreateVolume(context.Background(), c, CreateVolume{SizeBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	return v.ID
}

// openGate holds up the construction of a testslowopen layer until
// closed. Each run of the test that uses it makes it anew: a run closes
// it, and under -count=N the next would close it again (a panic) and its
// open would not stall.
var openGate chan struct{}

func init() {
	registerWrapper("testslowopen", "its construction waits for openGate", func(c block.Layer) block.Layer {
		<-openGate
		return splitLayer{c}
	})
}

// TestSlowOpenHoldsUpNoOther: opening one volume's stack while another's
// open is stalled (a file system that does not answer) goes ahead.
func TestSlowOpenHoldsUpNoOther(t *testing.T) {
	openGate = make(chan struct{})
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	slow := &meta.Volume{ID: newID("vol-"), SizeBytes: 1 << 20,
		Stack: json.RawMessage(`{"type":"testslowopen","children":[` + fileLeaf + `]}`)}
	dir := e.st.VolumeDir(slow.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data.img"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var letGo sync.Once
	t.Cleanup(func() { letGo.Do(func() { close(openGate) }) }) // even if the test fails below
	stalled := make(chan error, 1)
	go func() {
		_, release, err := s.acquireReader(slow)
		if err == nil {
			release()
		}
		stalled <- err
	}()
	time.Sleep(50 * time.Millisecond) // the slow open is under way
	done := make(chan error, 1)
	go func() {
		_, release, err := s.acquireReader(e.volume(v.ID))
		if err == nil {
			release()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("opening a volume waited for another volume's stalled open")
	}
	letGo.Do(func() { close(openGate) })
	if err := <-stalled; err != nil {
		t.Fatal(err)
	}
	cleanupAll(t, s, alice)
}
