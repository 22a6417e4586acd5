package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/api"
)

// mainRun runs the CLI with args exactly as given.
func mainRun(args ...string) runResult {
	var o, e bytes.Buffer
	code := Main(args, &o, &e)
	return runResult{code, o.String(), e.String()}
}

// TestVersionJSON: -o json output parses, version's too.
func TestVersionJSON(t *testing.T) {
	r := mainRun("-o", "json", "version")
	var v struct {
		Version string `json:"version"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil || v.Version != version() {
		t.Errorf("-o json version: %+v; want {\"version\": %q}", r, version())
	}
	if r := mainRun("version"); r.code != 0 || r.stdout != "basalt "+version()+"\n" {
		t.Errorf("version: %+v", r)
	}
}

// TestOutputEnvEarlyErrors: BASALT_OUTPUT=json is -o json also for
// the errors raised before the flags are bound from the environment (an
// unknown flag, a missing argument).
func TestOutputEnvEarlyErrors(t *testing.T) {
	t.Setenv("BASALT_OUTPUT", "json")
	for _, args := range [][]string{{"volume", "show"}, {"--colour", "red", "status"}, {"volume", "create", "--size"}} {
		r := mainRun(args...)
		var eb api.ErrorBody
		if r.code != 1 || json.Unmarshal([]byte(r.stdout), &eb) != nil || eb.Error.Code != CodeUsage {
			t.Errorf("BASALT_OUTPUT=json basalt %v: %+v; want the UsageError as JSON on stdout", args, r)
		}
	}
	// A -o on the line wins over the environment.
	if r := mainRun("-o", "table", "volume", "show"); r.code != 1 || r.stdout != "" {
		t.Errorf("BASALT_OUTPUT=json basalt -o table volume show: %+v; want nothing on stdout", r)
	}
	t.Setenv("BASALT_OUTPUT", "yaml")
	if r := mainRun("version"); r.code != 1 || !strings.Contains(r.stderr, "BASALT_OUTPUT") {
		t.Errorf("BASALT_OUTPUT=yaml basalt version: %+v; want an error naming BASALT_OUTPUT", r)
	}
}

// TestEndpointChecked: an --endpoint that is not an https URL is
// the command line's mistake, said as such before anything is sent.
func TestEndpointChecked(t *testing.T) {
	_, id := fakeAPI(t, http.NotFoundHandler())
	for _, ep := range []string{"http://127.0.0.1:1", "127.0.0.1:8443", "", "ftp://x", "https://", "https://h:1/?x=1"} {
		r := run(ep, id, "status")
		if r.code != 1 || !strings.Contains(r.stderr, "(UsageError)") || !strings.Contains(r.stderr, "--endpoint") {
			t.Errorf("--endpoint %q: %+v; want a UsageError about --endpoint", ep, r)
		}
	}
}

// TestArgumentErrors: a missing or extra argument is reported with
// what the command takes, and an extra argument is not called a command.
func TestArgumentErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"volume", "show"}, []string{"basalt volume show", "ID_OR_NAME"}},
		{[]string{"snapshot", "create"}, []string{"basalt snapshot create", "VOLUME"}},
		{[]string{"volume", "show", "a", "b"}, []string{"basalt volume show", "ID_OR_NAME", `"b"`}},
		{[]string{"volume", "create", "--size", "1GiB", "data"}, []string{"basalt volume create", "no arguments", `"data"`}},
		{[]string{"object", "export"}, []string{"basalt object export", "PATH"}},
	} {
		r := mainRun(c.args...)
		if r.code != 1 || !strings.Contains(r.stderr, "(UsageError)") || strings.Contains(r.stderr, "unknown command") {
			t.Errorf("basalt %v: %+v", c.args, r)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("basalt %v: stderr %q does not say %q", c.args, r.stderr, w)
			}
		}
	}
}

// TestGlobalFlagsNameTheirEnv: every global flag's help names the
// variable it is read from.
func TestGlobalFlagsNameTheirEnv(t *testing.T) {
	r := mainRun("--help")
	for _, env := range []string{"BASALT_ENDPOINT", "BASALT_IDENTITY", "BASALT_OUTPUT"} {
		if !strings.Contains(r.stdout, env) {
			t.Errorf("basalt --help does not mention %s:\n%s", env, r.stdout)
		}
	}
}

// TestUseNamesTakeNames: commands that take a volume or snapshot by
// id or name say so (the API resolves names wherever it takes an id), as
// `volume show ID_OR_NAME` does; "ID" told users names do not work.
func TestUseNamesTakeNames(t *testing.T) {
	for _, c := range [][]string{
		{"volume", "delete"}, {"volume", "extend"}, {"volume", "flatten"}, {"volume", "repair"}, {"volume", "scrub"},
		{"snapshot", "show"}, {"snapshot", "delete"},
	} {
		r := mainRun(append(c, "--help")...)
		if !strings.Contains(r.stdout, strings.Join(c, " ")+" ID_OR_NAME") {
			t.Errorf("basalt %s --help: usage does not say ID_OR_NAME:\n%s", strings.Join(c, " "), r.stdout)
		}
	}
	if r := mainRun("volume", "create", "--help"); strings.Contains(r.stdout, "--from-snapshot ID ") {
		t.Errorf("volume create --help: --from-snapshot takes a name too:\n%s", r.stdout)
	}
}

// TestEmptyFlagValue: a flag given with an empty value (an unset
// shell variable: --volume "$V") is an error, not the flag left out: the
// filter of a list would be dropped (every attachment, with its export
// secret, listed) and a clone --from-snapshot "" an empty volume.
func TestEmptyFlagValue(t *testing.T) {
	var requests atomic.Int32
	ep, id := fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if r.Method == "POST" {
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(api.Volume{ID: "vol-0000000000000001", Status: "available"})
			return
		}
		w.Write([]byte("[]"))
	}))
	for _, args := range [][]string{
		{"attachment", "list", "--volume", ""},
		{"snapshot", "list", "--volume="},
		{"volume", "create", "--size", "1GiB", "--from-snapshot", ""},
		{"volume", "create", "--size", "1GiB", "--name", ""},
	} {
		r := run(ep, id, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "(UsageError)") {
			t.Errorf("basalt %q: %+v; want a UsageError", args, r)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("%d requests sent for command lines with an empty flag value", n)
	}
	if r := run(ep, id, "attachment", "list"); r.code != 0 {
		t.Errorf("attachment list: %+v", r)
	}
}

// TestEmptyFlagOwnCodes: flags whose commands refuse an empty value
// with a code of their own keep it (tests/e2e TestBadInputCLI).
func TestEmptyFlagOwnCodes(t *testing.T) {
	_, id := fakeAPI(t, http.NotFoundHandler())
	for code, args := range map[string][]string{
		"InvalidSize":    {"volume", "create", "--size", ""},
		"InvalidRequest": {"snapshot", "export", "s", "--to", ""},
		"InvalidStack":   {"type", "create", "t", "--stack", ""},
	} {
		if r := run("https://127.0.0.1:1", id, args...); r.code != 1 || !strings.Contains(r.stderr, "("+code+")") {
			t.Errorf("basalt %q: %+v; want %s", args, r, code)
		}
	}
}

// TestEmptyIdentityFlag: --identity "" (an unset variable) is an
// error, not the fallback to ./basalt-data/identities/admin: a command
// meant for a user's identity would run as the administrator.
func TestEmptyIdentityFlag(t *testing.T) {
	var requests atomic.Int32
	ep, id := fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte("[]"))
	}))
	cwd := t.TempDir()
	if err := os.MkdirAll(filepath.Join(cwd, "basalt-data", "identities"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(id, filepath.Join(cwd, "basalt-data", "identities", "admin")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(cwd)
	if r := run(ep, "", "volume", "list"); r.code != 1 || !strings.Contains(r.stderr, "(UsageError)") || !strings.Contains(r.stderr, "--identity") {
		t.Errorf("--identity \"\" volume list: %+v; want a UsageError about --identity", r)
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("--identity \"\": %d requests sent with the default identity", n)
	}
	// Left out, the default applies.
	if r := mainRun("--endpoint", ep, "volume", "list"); r.code != 0 {
		t.Errorf("volume list with the default identity: %+v", r)
	}
}
