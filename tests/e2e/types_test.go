package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// sameJSON reports whether two JSON texts hold the same value.
func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// typeNames runs `type list` and returns the names, checking that the
// built-ins (and only they) say built_in.
func typeNames(t *testing.T, c *Client) []string {
	t.Helper()
	var ts []VolumeType
	c.OK(&ts, "type", "list")
	var names []string
	for _, ty := range ts {
		names = append(names, ty.Name)
		builtIn := slices.Contains(builtInTypes, ty.Name)
		if ty.BuiltIn != builtIn {
			t.Errorf("type %s: built_in %v, want %v", ty.Name, ty.BuiltIn, builtIn)
		}
		var spec struct{ Type string }
		if err := json.Unmarshal(ty.Stack, &spec); err != nil || spec.Type == "" {
			t.Errorf("type %s: stack %s is not a layer spec", ty.Name, ty.Stack)
		}
	}
	return names
}

var builtInTypes = []string{"encrypted", "mirrored", "parity", "standard", "striped", "verified"}

// TestVolumeTypes: `basalt type`. Everyone lists the six built-ins; only
// an admin creates a type (403 AdminRequired otherwise), from a JSON stack
// that is validated (exit 1, InvalidStack); a volume of the new type works
// through NBD and `volume show` shows its live tree with the file layer's
// path in its image; deleting the type leaves its volumes (and their
// snapshots) usable, even across a restart; built-ins cannot be deleted.
func TestVolumeTypes(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	alice := admin.CreateUser("alice")

	for who, c := range map[string]*Client{"admin": admin, "alice": alice} {
		if got := typeNames(t, c); !slices.Equal(got, builtInTypes) {
			t.Errorf("type list as %s: %v, want %v", who, got, builtInTypes)
		}
	}
	var std VolumeType
	alice.OK(&std, "type", "show", "standard")
	if !std.BuiltIn || !sameJSON(std.Stack, []byte(`{"type":"cow","children":[{"type":"file","params":{"path":"data.img"}}]}`)) {
		t.Errorf("type show standard: %+v %s, want built in, cow over one file", std, std.Stack)
	}

	// Only an admin creates types.
	spec := `{"type":"throttle","params":{"iops":50000},"children":[
		{"type":"cow","children":[{"type":"file","params":{"path":"data.img"}}]}]}`
	file := stackFile(t, spec)
	alice.Fail("AdminRequired", "type", "create", "capped", "--stack", file)
	ac := identityHTTP(t, alice.Identity)
	if status, code, body := call(t, ac, "POST", n.Endpoint()+"/v1/types", `{"name":"capped","stack":`+spec+`}`); status != http.StatusForbidden || code != "AdminRequired" {
		t.Errorf("POST /v1/types as a user: HTTP %d %s, want 403 AdminRequired", status, body)
	}
	var created VolumeType
	admin.OK(&created, "type", "create", "capped", "--stack", file, "--description", "standard, at most 50000 IOPS")
	if created.Name != "capped" || created.BuiltIn || created.Description != "standard, at most 50000 IOPS" || !sameJSON(created.Stack, []byte(spec)) {
		t.Errorf("type create printed %+v %s", created, created.Stack)
	}
	admin.Fail("VolumeTypeExists", "type", "create", "capped", "--stack", file)
	if got := typeNames(t, alice); !slices.Equal(got, append([]string{"capped"}, builtInTypes...)) {
		t.Errorf("type list after create: %v", got)
	}
	var shown VolumeType
	alice.OK(&shown, "type", "show", "capped")
	if !sameJSON(shown.Stack, []byte(spec)) {
		t.Errorf("type show capped: %s, want %s", shown.Stack, spec)
	}

	// Invalid stacks: exit 1, InvalidStack, nothing created, no file made.
	fileLeaf := `{"type":"file","params":{"path":"data.img"}}`
	for _, c := range []struct{ name, spec string }{
		{"unknown layer type", `{"type":"raid7","children":[` + fileLeaf + `]}`},
		{"misspelt param", `{"type":"throttle","params":{"ipos":100},"children":[{"type":"cow","children":[` + fileLeaf + `]}]}`},
		{"misspelt path param", `{"type":"cow","children":[{"type":"file","params":{"paht":"data.img"}}]}`},
		{"misspelt field", `{"type":"cow","chldren":[` + fileLeaf + `]}`},
		{"path leaving the layer's directory", `{"type":"cow","children":[{"type":"file","params":{"path":"../x"}}]}`},
		{"absolute path", `{"type":"cow","children":[{"type":"file","params":{"path":"/tmp/basalt-e2e-x"}}]}`},
		{"cow without its child", `{"type":"cow"}`},
		{"bad param value", `{"type":"cow","params":{"chunk":1000},"children":[` + fileLeaf + `]}`},
		{"not JSON", `{"type":"cow",`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := n.Admin()
			cl.t = t
			cl.Fail("InvalidStack", "type", "create", "bad", "--stack", stackFile(t, c.spec))
		})
	}
	admin.Fail("UnknownVolumeType", "type", "show", "bad")
	if got := typeNames(t, admin); len(got) != 7 {
		t.Errorf("type list after refused creates: %v", got)
	}
	for _, p := range []string{filepath.Join(n.StoreDir(), "x"), filepath.Join(n.StoreDir(), "tmp", "x"), "/tmp/basalt-e2e-x"} {
		if exists(p) {
			t.Errorf("a refused stack made the file %s", p)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(n.StoreDir(), "tmp")); len(ents) != 0 {
		t.Errorf("type validation left scratch files in STORE/tmp: %v", ents)
	}

	// A volume of the new type works through NBD.
	vol := alice.CreateVolume("--size", "64MiB", "--type", "capped", "--name", "c")
	if vol.Status != "available" || vol.Type != "capped" {
		t.Fatalf("volume of type capped: %+v", vol)
	}
	a := alice.Attach("c", "hv1", "rw")
	if r := qemuIO(t, a.NBDURI, "write -P 0x3c 1M 4M", "flush"); qemuIOFailed(r) {
		t.Fatalf("qemu-io write on a capped volume: %s", r)
	}
	if r := qemuIO(t, a.NBDURI, "read -P 0x3c 1M 4M", "read -P 0 8M 1M"); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Fatalf("qemu-io read back on a capped volume: %s", r)
	}

	// volume show: the live tree, throttle → cow → file, the file in the
	// volume's image under STORE/images.
	r := alice.OK(nil, "volume", "show", "c")
	requireKeys(t, "volume show", []byte(r.Stdout), "stack")
	checkCapped := func(what string, v Volume) {
		t.Helper()
		s := v.Stack
		if s == nil || s.Type != "throttle" || s.State != "ok" || !sameJSON(s.Params, []byte(`{"iops":50000}`)) || len(s.Children) != 1 {
			t.Fatalf("%s: stack %+v, want throttle (iops 50000) at the top", what, s)
		}
		// cow lists its chain's images, the top's stack first.
		cow := s.Children[0]
		if cow.Type != "cow" || cow.State != "ok" || len(cow.Children) < 1 {
			t.Fatalf("%s: below throttle %+v, want cow", what, cow)
		}
		f := cow.Children[0]
		img := n.TopImage(alice, v.ID)
		if f.Image != img {
			t.Errorf("%s: cow's first child is image %q's stack, want the top %s", what, f.Image, img)
		}
		if f.Type != "file" || f.State != "ok" || f.Path != filepath.Join(n.ImageDir(img), "data.img") {
			t.Errorf("%s: file layer %+v, want the path %s", what, f, filepath.Join(n.ImageDir(img), "data.img"))
		}
		if got := fileSize(t, f.Path); got != v.SizeBytes {
			t.Errorf("%s: %s is %d bytes, want %d", what, f.Path, got, v.SizeBytes)
		}
	}
	var shownVol Volume
	json.Unmarshal([]byte(r.Stdout), &shownVol)
	checkCapped("volume show of a capped volume", shownVol)
	var listed []map[string]json.RawMessage
	alice.OK(&listed, "volume", "list")
	if _, ok := listed[0]["stack"]; ok {
		t.Errorf("volume list shows stacks (only volume show should): %s", listed[0]["stack"])
	}
	// Snapshots and clones keep the type and its stack.
	snap := alice.CreateSnapshot("c", "--name", "s")
	clone := alice.CreateVolume("--from-snapshot", "s", "--name", "cc")
	if clone.Type != "capped" {
		t.Errorf("clone of a capped volume has type %q", clone.Type)
	}
	checkCapped("clone of a capped volume", alice.Volume("cc"))

	// Deleting the type (admin only) leaves its volumes as they are.
	alice.Fail("AdminRequired", "type", "delete", "capped")
	admin.OK(nil, "type", "delete", "capped")
	admin.Fail("UnknownVolumeType", "type", "show", "capped")
	admin.Fail("UnknownVolumeType", "type", "delete", "capped")
	alice.Fail("UnknownVolumeType", "volume", "create", "--size", "64MiB", "--type", "capped")
	if got := typeNames(t, admin); !slices.Equal(got, builtInTypes) {
		t.Errorf("type list after delete: %v", got)
	}
	// The name can be reused for another stack; existing volumes keep theirs.
	admin.OK(nil, "type", "create", "capped", "--stack", stackFile(t, `{"type":"cow","children":[`+fileLeaf+`]}`))
	if r := qemuIO(t, a.NBDURI, "read -P 0x3c 1M 4M", "write -P 0x3d 20M 1M", "flush"); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Fatalf("the capped volume after its type was deleted: %s", r)
	}
	checkCapped("volume after its type was deleted", alice.Volume("c"))
	alice.Detach(a.ID)
	n.StopOK()
	n.Restart()
	checkCapped("volume after its type was deleted and a restart", alice.Volume("c"))
	a = alice.Attach("c", "hv1", "ro")
	if r := qemuIORO(t, a.NBDURI, "read -P 0x3c 1M 4M", "read -P 0x3d 20M 1M"); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Errorf("the capped volume after a restart: %s", r)
	}
	alice.Detach(a.ID)
	clone2 := alice.CreateVolume("--from-snapshot", snap.ID)
	checkCapped("clone made after its type was deleted", alice.Volume(clone2.ID))
	a = alice.Attach(clone2.ID, "hv1", "ro")
	if r := qemuIORO(t, a.NBDURI, "read -P 0x3c 1M 4M", "read -P 0 20M 1M"); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Errorf("clone of the capped volume's snapshot: %s", r)
	}
	alice.Detach(a.ID)
	alice.OK(nil, "volume", "delete", "c")

	// Built-in types cannot be deleted, by anyone.
	for _, name := range builtInTypes {
		admin.Fail("VolumeTypeProtected", "type", "delete", name)
	}
	alice.Fail("AdminRequired", "type", "delete", "standard")
	c := identityHTTP(t, n.AdminDir())
	if status, code, body := call(t, c, "DELETE", n.Endpoint()+"/v1/types/standard", ""); status != http.StatusConflict || code != "VolumeTypeProtected" {
		t.Errorf("DELETE /v1/types/standard: HTTP %d %s, want 409 VolumeTypeProtected", status, body)
	}
	if got := typeNames(t, admin); len(got) != 7 {
		t.Errorf("type list at the end: %v", got)
	}
}
