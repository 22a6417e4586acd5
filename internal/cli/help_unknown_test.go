package cli

import (
	"strings"
	"testing"
)

// TestHelpUnknownTopic: `basalt help` of a command that does not exist
// exits 1 with a UsageError; it used to print the usage and exit 0. Help
// of a real command, or of none, still exits 0 with that help.
func TestHelpUnknownTopic(t *testing.T) {
	if r := run("https://127.0.0.1:1", t.TempDir(), "help", "volum"); r.code != 1 || !strings.Contains(r.stderr, "(UsageError)") {
		t.Errorf("help of an unknown topic: %+v; want exit 1 with UsageError", r)
	}
	for _, args := range [][]string{{"help", "volume", "create"}, {"help"}} {
		if r := run("https://127.0.0.1:1", t.TempDir(), args...); r.code != 0 || !strings.Contains(r.stdout, "Usage:") {
			t.Errorf("%s: %+v; want exit 0 with the help", strings.Join(args, " "), r)
		}
	}
}
