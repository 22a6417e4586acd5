package e2e

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"io"
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
	admin.CreateSnapshot("data", "--name", "snap")

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
		{"clone with another type", "InvalidRequest", []string{"volume", "create", "--from-snapshot", "snap", "--type", "striped"}},
		{"flatten unknown volume", "NotFound", []string{"volume", "flatten", "nosuch"}},
		{"scrub of a standard volume (no checksum layer)", "NotSupportedByVolumeType", []string{"volume", "scrub", "data"}},
		{"repair of a standard volume (no mirror or parity layer)", "NotSupportedByVolumeType", []string{"volume", "repair", "data", "--wait"}},
		{"show unknown type", "UnknownVolumeType", []string{"type", "show", "golden"}},
		{"delete unknown type", "UnknownVolumeType", []string{"type", "delete", "golden"}},
		{"delete a built-in type", "VolumeTypeProtected", []string{"type", "delete", "standard"}},
		{"type create without --stack", "InvalidStack", []string{"type", "create", "golden"}},
		{"type create named like a built-in", "VolumeTypeExists", []string{"type", "create", "standard", "--stack", stackFile(t, `{"type":"cow","children":[{"type":"file","params":{"path":"data.img"}}]}`)}},
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
	if got := fileSize(t, n.DataFile(admin, vol.ID)); got != GiB {
		t.Errorf("volume's data file is %d bytes after refused extends", got)
	}
	if got := admin.Volume(vol.ID); got.LastJob != nil || got.Progress != nil {
		t.Errorf("refused jobs left a trace on the volume: progress %+v, last_job %+v", got.Progress, got.LastJob)
	}
	var types []VolumeType
	admin.OK(&types, "type", "list")
	if len(types) != 6 {
		t.Errorf("refused type requests changed the type list: %d types", len(types))
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
	// Dot names are names, not path steps: sent as they are, they would
	// reach another route ("GET /v1 not found").
	for _, args := range [][]string{{"volume", "show", ".."}, {"volume", "delete", "."}, {"snapshot", "show", ".."}, {"user", "show", ".."}} {
		r := admin.Run(append(args, "-o", "json")...)
		var eb ErrorBody
		json.Unmarshal([]byte(r.Stdout), &eb)
		if r.Code != 1 || eb.Error.Code != "NotFound" || !strings.Contains(eb.Error.Message, `"`+args[2]+`" not found`) {
			t.Errorf("%v: want NotFound naming %q: %s", args, args[2], r)
		}
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
		{"unknown type", "POST", "/v1/volumes", `{"size":"1GiB","type":"golden"}`, 404, "UnknownVolumeType"},
		{"invalid name", "POST", "/v1/volumes", `{"size":"1GiB","name":"bad/name"}`, 400, "InvalidName"},
		{"duplicate name", "POST", "/v1/volumes", `{"size":"1GiB","name":"data"}`, 409, "NameConflict"},
		{"extend malformed", "POST", "/v1/volumes/" + vol.ID + "/extend", `{"size":`, 400, "MalformedJSON"},
		{"extend negative", "POST", "/v1/volumes/" + vol.ID + "/extend", `{"size":-5}`, 400, "InvalidSize"},
		{"extend smaller", "POST", "/v1/volumes/" + vol.ID + "/extend", `{"size":"1MiB"}`, 400, "ShrinkNotAllowed"},
		{"snapshot without volume", "POST", "/v1/snapshots", `{}`, 400, "InvalidRequest"},
		{"snapshot unknown field", "POST", "/v1/snapshots", `{"volume":"data","x":1}`, 400, "MalformedJSON"},
		{"user malformed", "POST", "/v1/users", `{"name":`, 400, "MalformedJSON"},
		{"scrub without a checksum layer", "POST", "/v1/volumes/" + vol.ID + "/scrub", ``, 400, "NotSupportedByVolumeType"},
		{"repair without a mirror or parity layer", "POST", "/v1/volumes/" + vol.ID + "/repair", ``, 400, "NotSupportedByVolumeType"},
		{"job on an unknown volume", "POST", "/v1/volumes/vol-0123456789abcdef/flatten", ``, 404, "NotFound"},
		{"type malformed", "POST", "/v1/types", `{"name":`, 400, "MalformedJSON"},
		{"type unknown field", "POST", "/v1/types", `{"name":"t","stack":{"type":"file","params":{"path":"x"}},"colour":1}`, 400, "MalformedJSON"},
		{"type without stack", "POST", "/v1/types", `{"name":"t"}`, 400, "InvalidStack"},
		{"type with a stack that is not an object", "POST", "/v1/types", `{"name":"t","stack":"cow"}`, 400, "InvalidStack"},
		{"type: cow without its child", "POST", "/v1/types", `{"name":"t","stack":{"type":"cow"}}`, 400, "InvalidStack"},
		{"type: absolute file path", "POST", "/v1/types", `{"name":"t","stack":{"type":"file","params":{"path":"/etc/passwd"}}}`, 400, "InvalidStack"},
		{"type invalid name", "POST", "/v1/types", `{"name":"Bad Name","stack":{"type":"file","params":{"path":"x"}}}`, 400, "InvalidName"},
		{"show unknown type", "GET", "/v1/types/golden", ``, 404, "UnknownVolumeType"},
		{"delete built-in type", "DELETE", "/v1/types/standard", ``, 409, "VolumeTypeProtected"},
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
	// A body over the 1 MiB limit is refused, not read forever. The
	// server answers and closes without reading the rest, so a client still
	// sending may meet a reset before it reads the answer (http.Client then
	// reports only the reset): read the answer while the body is sent.
	huge := `{"name":"` + strings.Repeat("x", 2<<20) + `"}`
	if status, body := callWhileSending(t, c, "POST", n.Endpoint()+"/v1/volumes", huge); status != http.StatusBadRequest {
		t.Errorf("2 MiB body: HTTP %d %.200s, want 400", status, body)
	}
	if after := admin.OK(nil, "volume", "list").Stdout; after != before {
		t.Errorf("refused requests changed the volume list:\nbefore: %s\nafter:  %s", before, after)
	}
}

// TestBusyDuringJob: while a flatten job runs, its volume cannot be
// deleted and no second job can start (409 VolumeBusy, over the CLI and raw
// HTTP), and the refusals change nothing; once the job has ended, both
// work. The clone's images are throttled (an admin type, slowImagesStack),
// so the flatten takes seconds on any machine.
func TestBusyDuringJob(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	admin.OK(nil, "type", "create", "slow", "--stack", stackFile(t, slowImagesStack))
	admin.CreateVolume("--size", "64MiB", "--type", "slow", "--name", "src")
	data := []region{{0, randomBytes(t, int(16*MiB))}}
	admin.WriteRegions("src", data)
	snap := admin.CreateSnapshot("src", "--name", "s")
	clone := admin.CreateVolume("--from-snapshot", "s", "--name", "busy")

	// The flatten copies 256 chunks at 40 operations a second.
	var started Volume
	admin.OK(&started, "volume", "flatten", "busy")
	if started.Progress == nil || started.Progress.Job != "flatten" {
		t.Fatalf("volume flatten without --wait printed progress %+v, want a running flatten", started.Progress)
	}
	admin.Fail("VolumeBusy", "volume", "delete", "busy")
	admin.Fail("VolumeBusy", "volume", "flatten", "busy")
	admin.Fail("VolumeBusy", "volume", "flatten", clone.ID, "--wait")
	c := identityHTTP(t, n.AdminDir())
	for _, req := range []struct{ method, path string }{
		{"DELETE", "/v1/volumes/" + clone.ID},
		{"POST", "/v1/volumes/" + clone.ID + "/flatten"},
	} {
		if status, code, body := call(t, c, req.method, n.Endpoint()+req.path, ""); status != http.StatusConflict || code != "VolumeBusy" {
			t.Errorf("%s %s during a flatten: HTTP %d %s, want 409 VolumeBusy", req.method, req.path, status, body)
		}
	}
	// A job the stack cannot run is refused for that reason, busy or not.
	admin.Fail("NotSupportedByVolumeType", "volume", "scrub", "busy")
	got := admin.Volume("busy")
	if got.Progress == nil {
		t.Fatalf("the flatten ended (%+v) before the refused requests were checked: the test means nothing", got.LastJob)
	}
	if got.Status != "available" || got.LastJob != nil || got.Progress.Job != "flatten" {
		t.Errorf("the volume after refused requests: status %s, progress %+v, last_job %+v", got.Status, got.Progress, got.LastJob)
	}
	if !exists(n.VolumeDir(clone.ID)) {
		t.Fatalf("the volume's directory is gone")
	}

	// When the job ends, the same requests succeed.
	got = admin.WaitJob("busy", 60*time.Second)
	if got.LastJob == nil || got.LastJob.Job != "flatten" || got.LastJob.Error != "" {
		t.Fatalf("flatten ended with last_job %+v, want a flatten without error", got.LastJob)
	}
	var again Volume
	admin.OK(&again, "volume", "flatten", "busy", "--wait")
	if again.Progress != nil || again.LastJob == nil || again.LastJob.Error != "" {
		t.Errorf("a second flatten with --wait: progress %+v, last_job %+v", again.Progress, again.LastJob)
	}
	admin.OK(nil, "volume", "delete", "busy")
	if exists(n.VolumeDir(clone.ID)) {
		t.Errorf("volume directory still there after delete")
	}
	admin.OK(nil, "snapshot", "delete", snap.ID)
}

// TestNotSupportedByVolumeType: what a volume's stack has no layer for is
// refused with 400 NotSupportedByVolumeType and changes nothing: a snapshot
// or flatten without a cow layer, a scrub without a checksum layer, a
// repair without a mirror or parity layer.
func TestNotSupportedByVolumeType(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	admin.OK(nil, "type", "create", "plain", "--stack", stackFile(t,
		`{"type":"throttle","params":{"iops":100000},"children":[{"type":"file","params":{"path":"data.img"}}]}`))
	plain := admin.CreateVolume("--size", "64MiB", "--type", "plain", "--name", "plain")
	if plain.Status != "available" || plain.Type != "plain" {
		t.Fatalf("volume of a type without cow: %+v", plain)
	}
	std := admin.CreateVolume("--size", "64MiB", "--name", "std")
	before, stBefore := admin.OK(nil, "volume", "list").Stdout, admin.Status()

	admin.Fail("NotSupportedByVolumeType", "snapshot", "create", "plain")
	admin.Fail("NotSupportedByVolumeType", "snapshot", "create", "plain", "--name", "s", "--client-token", "tok")
	admin.Fail("NotSupportedByVolumeType", "volume", "flatten", "plain")
	for _, job := range []string{"scrub", "repair"} {
		admin.Fail("NotSupportedByVolumeType", "volume", job, "plain")
		admin.Fail("NotSupportedByVolumeType", "volume", job, "std", "--wait")
	}
	c := identityHTTP(t, n.AdminDir())
	for _, req := range []struct{ path, body string }{
		{"/v1/snapshots", `{"volume":"` + plain.ID + `"}`},
		{"/v1/volumes/" + plain.ID + "/flatten", ``},
		{"/v1/volumes/" + std.ID + "/scrub", ``},
		{"/v1/volumes/" + std.ID + "/repair", ``},
	} {
		if status, code, body := call(t, c, "POST", n.Endpoint()+req.path, req.body); status != http.StatusBadRequest || code != "NotSupportedByVolumeType" {
			t.Errorf("POST %s %s: HTTP %d %s, want 400 NotSupportedByVolumeType", req.path, req.body, status, body)
		}
	}

	if ss := admin.Snapshots(); len(ss) != 0 {
		t.Errorf("refused snapshots left records: %+v", ss)
	}
	if after := admin.OK(nil, "volume", "list").Stdout; after != before {
		t.Errorf("refused requests changed the volume list:\nbefore: %s\nafter:  %s", before, after)
	}
	if st := admin.Status(); st.Store.ProvisionedBytes != stBefore.Store.ProvisionedBytes {
		t.Errorf("refused requests changed provisioned_bytes: %d -> %d", stBefore.Store.ProvisionedBytes, st.Store.ProvisionedBytes)
	}
	// The refused snapshot claimed neither its name nor its client token.
	if s := admin.CreateSnapshot("std", "--name", "s", "--client-token", "tok"); s.Status != "available" || s.VolumeID != std.ID {
		t.Errorf("snapshot of the standard volume: %+v", s)
	}
}

// callWhileSending sends one request over a connection of its own and
// reads the response while the body is still being written, ignoring
// write errors: it sees what a server that refuses a body early answers.
func callWhileSending(t testing.TB, c *http.Client, method, url, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	conn, err := tls.Dial("tcp", req.URL.Host, c.Transport.(*http.Transport).TLSClientConfig)
	if err != nil {
		t.Fatalf("dial %s: %v", req.URL.Host, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	go req.Write(conn) // fails once the server closes: that is expected
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatalf("%s %s: no response: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}
