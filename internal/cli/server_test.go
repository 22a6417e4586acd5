package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigFileValues: a setting in the --config file means what
// the same value means as a flag or in BASALT_<FLAG>: a size in bytes
// stays that number (YAML reads it as a float, which printed becomes
// "1.073741824e+09", no size), and a key left empty leaves the setting
// at its default rather than setting it to "<nil>".
func TestConfigFileValues(t *testing.T) {
	file := filepath.Join(t.TempDir(), "basalt.yaml")
	yaml := "meta-quota: 1073741824\nadvertise:\nvoters: 5\napi: \"\"\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := serverCmd(&globals{}).Flags()
	if err := applyConfigFile(fs, file); err != nil {
		t.Fatalf("config file %q: %v", yaml, err)
	}
	for flag, want := range map[string]string{"meta-quota": "1073741824", "advertise": "", "voters": "5", "api": fs.Lookup("api").DefValue} {
		if got := fs.Lookup(flag).Value.String(); got != want {
			t.Errorf("--%s from the config file: %q, want %q", flag, got, want)
		}
	}
}

// TestEmptyServerSettings: an empty value of a server setting in the
// environment or the config file means its default (BASALT_API= once
// listened on every interface, at a random port); a mapping is no value.
func TestEmptyServerSettings(t *testing.T) {
	cmd := serverCmd(&globals{})
	t.Setenv("BASALT_API", "")
	t.Setenv("BASALT_NBD", "")
	t.Setenv("BASALT_S3", "127.0.0.1:1234") // a value still sets it
	if err := bindEnv(cmd); err != nil {
		t.Fatal(err)
	}
	if got := cmd.Flags().Lookup("s3").Value.String(); got != "127.0.0.1:1234" {
		t.Fatalf("--s3 from BASALT_S3: %q", got)
	}
	for _, name := range []string{"api", "nbd"} {
		if f := cmd.Flags().Lookup(name); f.Changed || f.Value.String() != f.DefValue || f.DefValue == "" {
			t.Errorf("--%s after an empty BASALT_%s: %q (changed %v), want its default %q", name, strings.ToUpper(name), f.Value, f.Changed, f.DefValue)
		}
	}
	file := filepath.Join(t.TempDir(), "basalt.yaml")
	if err := os.WriteFile(file, []byte("data: {a: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := applyConfigFile(serverCmd(&globals{}).Flags(), file); err == nil {
		t.Error("a mapping as the data directory accepted")
	}
}

// TestConfigFileRefusesRepeatedKeys: a setting given twice is an error,
// not whichever value YAML happened to keep.
func TestConfigFileRefusesRepeatedKeys(t *testing.T) {
	file := filepath.Join(t.TempDir(), "basalt.yaml")
	if err := os.WriteFile(file, []byte("voters: 3\nvoters: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := applyConfigFile(serverCmd(&globals{}).Flags(), file)
	if err == nil || !strings.Contains(err.Error(), "voters") {
		t.Fatalf("voters given twice: %v; want an error naming it", err)
	}
}

// TestConfigFileRefusesClientGlobals: the server's flag set holds the
// CLI's global flags too (inherited), but endpoint and output mean nothing
// to a server; set in its file, output escaped the -o check.
func TestConfigFileRefusesClientGlobals(t *testing.T) {
	for _, yaml := range []string{"output: yaml\n", "endpoint: https://elsewhere:8443\n", "config: other.yaml\n", "help: true\n"} {
		file := filepath.Join(t.TempDir(), "basalt.yaml")
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		fs := serverCmd(&globals{}).Flags()
		fs.String("endpoint", "", "")
		fs.String("output", "table", "")
		fs.Bool("help", false, "") // cobra adds it before the command runs
		if err := applyConfigFile(fs, file); err == nil {
			t.Errorf("config file %q accepted", yaml)
		}
	}
}

// TestServerRefusesBadLimits: server flags out of range are usage errors,
// before anything starts.
func TestServerRefusesBadLimits(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--nbd-max-inflight", "0"},
		{"--nbd-max-handshakes", "0"},
		{"--nbd-max-inflight", "lots"},
		{"--overcommit", "0"},
		{"--overcommit", "NaN"}, // once a limit of -8 EiB: no volume could be made
		{"--overcommit", "+Inf"},
		{"--overcommit", "1e300"},
		{"--overcommit", "1001"},
		{"--voters", "2"},
		{"--join", "http://peer:8443", "--join-token", "t"},
		{"--join", "https://", "--join-token", "t"},
		{"--join", "https://peer:99999", "--join-token", "t"},
		{"--join", "https://peer:8443/v1", "--join-token", "t"},
		{"--join", "peer:8443", "--join-token", "t"},
	} {
		r := run("", "", append([]string{"server", "--data", dir}, args...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "(UsageError)") || !strings.Contains(r.stderr, strings.TrimPrefix(args[0], "--")) {
			t.Errorf("basalt server %q: %+v; want a UsageError naming the flag", args, r)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused starts wrote %d entries into --data", len(entries))
	}
}
