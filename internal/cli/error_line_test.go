package cli

import (
	"strings"
	"testing"
)

// TestErrorOneLine: an error is one line on stderr, its code at the end
// of it. cobra's unknown-command message ends in a newline (after its
// "Did you mean this?" suggestions), which put the code alone on a line
// of its own, after a stray space.
func TestErrorOneLine(t *testing.T) {
	r := run("https://127.0.0.1:1", t.TempDir(), "volumes")
	if r.code != 1 || !strings.Contains(r.stderr, "volume") {
		t.Fatalf("basalt volumes: %+v", r)
	}
	if strings.Contains(r.stderr, "\n (UsageError)") || !strings.HasSuffix(r.stderr, " (UsageError)\n") {
		t.Errorf("basalt volumes: stderr %q; want the code right after the message", r.stderr)
	}
}
