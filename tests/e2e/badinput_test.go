package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestBadInputCLI: every refused request exits 1 with its error code and
// changes nothing.
func TestBadInputCLI(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	vol := admin.CreateVolume("--size", "1GiB", "--name", "data")
	admin.CreateSnapshot("data", "--name", "snap", "--wait")

	currentState := func() (string, string, Status) {
		return admin.OK(nil, "volume", "list").Stdout, admin.OK(nil, "snapshot", "list").Stdout, admin.Status()
	}
	volsBefore, snapsBefore, stBefore := currentState()

	cases := []struct {
		name string
		code string
		args []string
	}{
		{"size 0", "InvalidSize", []string{"volume", "create", "--size", "0"}},
		{"size -1", "InvalidSize", []string{"volume", "create", "--size=-1"}},
		{"size abc", "InvalidSize", []string{"volume", "create", "--size", "abc"}},
		{"size 10XB", "InvalidSize", []string{"volume", "create", "--size", "10XB"}},
		{"size empty", "InvalidSize", []string{"volume", "create", "--size", ""}},
		{"size missing", "InvalidSize", []string{"volume", "create", "--name", "nosize"}},
		{"size not a multiple of 512", "InvalidSize", []string{"volume", "create", "--size", "1000"}},
		{"size fractional byte", "InvalidSize", []string{"volume", "create", "--size", "0.3B"}},
		{"size beyond 1 EiB", "InvalidSize", []string{"volume", "create", "--size", "2000PiB"}},
		{"size beyond the provisioning limit", "InsufficientCapacity", []string{"volume", "create", "--size", "1PiB"}},
		{"show unknown id", "NotFound", []string{"volume", "show", "vol-0123456789abcdef"}},
		{"show unknown name", "NotFound", []string{"volume", "show", "nosuch"}},
		{"delete unknown", "NotFound", []string{"volume", "delete", "vol-0123456789abcdef"}},
		{"extend unknown", "NotFound", []string{"volume", "extend", "nosuch", "--size", "2GiB"}},
		{"duplicate name", "NameConflict", []string{"volume", "create", "--size", "1GiB", "--name", "data"}},
		{"extend to smaller", "ShrinkNotAllowed", []string{"volume", "extend", "data", "--size", "512MiB"}},
		{"extend to same size", "ShrinkNotAllowed", []string{"volume", "extend", "data", "--size", "1GiB"}},
		{"extend bad size", "InvalidSize", []string{"volume", "extend", "data", "--size", "lots"}},
		{"extend beyond the provisioning limit", "InsufficientCapacity", []string{"volume", "extend", "data", "--size", "1PiB"}},
		{"unknown type", "UnknownVolumeType", []string{"volume", "create", "--size", "1GiB", "--type", "golden"}},
		{"invalid name with slash", "InvalidName", []string{"volume", "create", "--size", "1GiB", "--name", "bad/name"}},
		{"invalid name with space", "InvalidName", []string{"volume", "create", "--size", "1GiB", "--name", "bad name"}},
		{"name that looks like an id", "InvalidName", []string{"volume", "create", "--size", "1GiB", "--name", "vol-0123456789abcdef"}},
		{"name too long", "InvalidName", []string{"volume", "create", "--size", "1GiB", "--name", strings.Repeat("x", 64)}},
		{"clone of unknown snapshot", "NotFound", []string{"volume", "create", "--from-snapshot", "nosuch"}},
		{"snapshot of unknown volume", "NotFound", []string{"snapshot", "create", "nosuch"}},
		{"snapshot invalid name", "InvalidName", []string{"snapshot", "create", "data", "--name", "a/b"}},
		{"snapshot duplicate name", "NameConflict", []string{"snapshot", "create", "data", "--name", "snap"}},
		{"show unknown snapshot", "NotFound", []string{"snapshot", "show", "snap-0123456789abcdef"}},
		{"delete unknown snapshot", "NotFound", []string{"snapshot", "delete", "nosuch"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl := n.Admin()
			cl.t = t
			cl.Fail(c.code, c.args...)
		})
	}

	volsAfter, snapsAfter, stAfter := currentState()
	if volsAfter != volsBefore {
		t.Errorf("refused requests changed the volume list:\nbefore: %s\nafter:  %s", volsBefore, volsAfter)
	}
	if snapsAfter != snapsBefore {
		t.Errorf("refused requests changed the snapshot list:\nbefore: %s\nafter:  %s", snapsBefore, snapsAfter)
	}
	if stAfter.Store.ProvisionedBytes != stBefore.Store.ProvisionedBytes {
		t.Errorf("refused requests changed provisioned_bytes: %d -> %d", stBefore.Store.ProvisionedBytes, stAfter.Store.ProvisionedBytes)
	}
	if got := fileSize(t, n.VolumeFile(vol.ID)); got != GiB {
		t.Errorf("volume file is %d bytes after refused extends", got)
	}
}

// TestCLIUsageErrors: mistakes on the command line itself follow the same
// contract as server errors (brief §3): exit 1, message on stderr, and with
// -o json the error as JSON on stdout — wherever -o json sits on the line.
func TestCLIUsageErrors(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	before := admin.OK(nil, "volume", "list").Stdout
	cases := []struct {
		name string
		args []string
	}{
		{"missing argument", []string{"volume", "show"}},
		{"too many arguments", []string{"volume", "show", "a", "b"}},
		{"bad output format", []string{"volume", "list", "-o", "yaml"}},
		{"unknown command", []string{"frobnicate"}},
		{"unknown subcommand", []string{"volume", "frobnicate"}},
		{"unknown flag", []string{"volume", "create", "--size", "1GiB", "--colour", "red"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl := n.Admin()
			cl.t = t
			if c.name == "bad output format" {
				// -o is itself the mistake: exit 1 and a message, no JSON.
				r := cl.runRaw(c.args...)
				if r.Code != 1 || !strings.Contains(r.Stderr, "UsageError") {
					t.Errorf("expected exit 1 and a UsageError on stderr: %s", r)
				}
				return
			}
			cl.Fail("UsageError", c.args...)
		})
	}
	if after := admin.OK(nil, "volume", "list").Stdout; after != before {
		t.Errorf("usage errors changed the volume list")
	}
}

// TestBadInputHTTP: the API's own validation, below the CLI.
func TestBadInputHTTP(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	vol := admin.CreateVolume("--size", "1GiB", "--name", "data")
	c := identityHTTP(t, n.AdminDir())
	before := admin.OK(nil, "volume", "list").Stdout

	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"malformed JSON", "POST", "/v1/volumes", `{"size": "1GiB"`, 400, "MalformedJSON"},
		{"not JSON", "POST", "/v1/volumes", `size=1GiB`, 400, "MalformedJSON"},
		{"unknown field", "POST", "/v1/volumes", `{"size":"1GiB","colour":"red"}`, 400, "MalformedJSON"},
		{"trailing data", "POST", "/v1/volumes", `{"size":"1GiB"} {"size":"1GiB"}`, 400, "MalformedJSON"},
		{"empty body", "POST", "/v1/volumes", ``, 400, "MalformedJSON"},
		{"wrong field type", "POST", "/v1/volumes", `{"size":"1GiB","name":7}`, 400, "MalformedJSON"},
		{"negative size", "POST", "/v1/volumes", `{"size":-1073741824}`, 400, "InvalidSize"},
		{"zero size", "POST", "/v1/volumes", `{"size":0}`, 400, "InvalidSize"},
		{"fractional size", "POST", "/v1/volumes", `{"size":1.5}`, 400, "InvalidSize"},
		{"size string garbage", "POST", "/v1/volumes", `{"size":"abc"}`, 400, "InvalidSize"},
		{"size beyond limit", "POST", "/v1/volumes", `{"size":"1PiB"}`, 507, "InsufficientCapacity"},
		{"unknown type", "POST", "/v1/volumes", `{"size":"1GiB","type":"golden"}`, 400, "UnknownVolumeType"},
		{"invalid name", "POST", "/v1/volumes", `{"size":"1GiB","name":"bad/name"}`, 400, "InvalidName"},
		{"duplicate name", "POST", "/v1/volumes", `{"size":"1GiB","name":"data"}`, 409, "NameConflict"},
		{"extend malformed", "POST", "/v1/volumes/" + vol.ID + "/extend", `{"size":`, 400, "MalformedJSON"},
		{"extend negative", "POST", "/v1/volumes/" + vol.ID + "/extend", `{"size":-5}`, 400, "InvalidSize"},
		{"extend smaller", "POST", "/v1/volumes/" + vol.ID + "/extend", `{"size":"1MiB"}`, 400, "ShrinkNotAllowed"},
		{"snapshot without volume", "POST", "/v1/snapshots", `{}`, 400, "InvalidRequest"},
		{"snapshot unknown field", "POST", "/v1/snapshots", `{"volume":"data","x":1}`, 400, "MalformedJSON"},
		{"user malformed", "POST", "/v1/users", `{"name":`, 400, "MalformedJSON"},
		{"unknown volume", "GET", "/v1/volumes/vol-0123456789abcdef", ``, 404, "NotFound"},
		{"unknown route", "GET", "/v1/nothing", ``, 404, "NotFound"},
		{"wrong method", "PUT", "/v1/volumes", `{}`, 405, "MethodNotAllowed"},
	}
	for _, tc := range cases {
		status, code, body := call(t, c, tc.method, n.Endpoint()+tc.path, tc.body)
		if status != tc.status || code != tc.code {
			t.Errorf("%s: %s %s %q: HTTP %d %s, want %d %s", tc.name, tc.method, tc.path, tc.body, status, strings.TrimSpace(string(body)), tc.status, tc.code)
		}
	}
	// A body over the 1 MiB limit is refused, not read forever.
	huge := `{"name":"` + strings.Repeat("x", 2<<20) + `"}`
	if status, _, body := call(t, c, "POST", n.Endpoint()+"/v1/volumes", huge); status != http.StatusBadRequest {
		t.Errorf("2 MiB body: HTTP %d %.200s, want 400", status, body)
	}
	if after := admin.OK(nil, "volume", "list").Stdout; after != before {
		t.Errorf("refused requests changed the volume list:\nbefore: %s\nafter:  %s", before, after)
	}
}

// TestDeleteWhileSnapshotting: a volume whose snapshot is still being copied
// cannot be deleted or extended (409 VolumeBusy), and the snapshot cannot be
// deleted yet (409 SnapshotNotReady); once the copy is done, both can.
func TestDeleteWhileSnapshotting(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{Args: []string{"--job-bandwidth", "1MiB"}})
	admin := n.Admin()
	vol := admin.CreateVolume("--size", "64MiB", "--name", "busy")
	data := []region{{0, randomBytes(t, int(16*MiB))}}
	writeRegions(t, n.VolumeFile(vol.ID), data)

	snap := admin.CreateSnapshot("busy")
	if snap.Status != "creating" {
		t.Fatalf("snapshot of 16 MiB at 1 MiB/s is %q right after create, want creating", snap.Status)
	}
	before := admin.OK(nil, "volume", "list").Stdout

	admin.Fail("VolumeBusy", "volume", "delete", vol.ID)
	admin.Fail("VolumeBusy", "volume", "extend", vol.ID, "--size", "128MiB")
	admin.Fail("SnapshotNotReady", "snapshot", "delete", snap.ID)
	c := identityHTTP(t, n.AdminDir())
	if status, code, body := call(t, c, "DELETE", n.Endpoint()+"/v1/volumes/"+vol.ID, ""); status != http.StatusConflict || code != "VolumeBusy" {
		t.Errorf("DELETE of a volume being snapshotted: HTTP %d %s, want 409 VolumeBusy", status, body)
	}
	if got := admin.Snapshot(snap.ID); got.Status != "creating" {
		t.Fatalf("the snapshot finished too early (%s) for the test to mean anything", got.Status)
	}
	if after := admin.OK(nil, "volume", "list").Stdout; after != before {
		t.Errorf("refused requests changed the volume list:\nbefore: %s\nafter:  %s", before, after)
	}
	if !exists(n.VolumeFile(vol.ID)) {
		t.Fatalf("the volume file is gone")
	}

	got := admin.WaitSnapshot(snap.ID, 60*time.Second)
	if got.Status != "available" {
		t.Fatalf("snapshot ended %s: %s", got.Status, got.StatusMessage)
	}
	checkRegions(t, "snapshot file", n.SnapshotFile(snap.ID), data)
	admin.OK(nil, "volume", "delete", vol.ID)
	if exists(n.VolumeFile(vol.ID)) {
		t.Errorf("volume file still there after delete")
	}
	admin.OK(nil, "snapshot", "delete", snap.ID)
}
