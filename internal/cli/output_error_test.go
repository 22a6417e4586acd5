package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// TestOutputWriteError: failing to write the answer (stdout on a full
// disk, a closed pipe) is not a mistake on the command line. It was
// reported as a UsageError, which tells a script that nothing was done
// while a create, say, had been carried out.
func TestOutputWriteError(t *testing.T) {
	for _, o := range []string{"table", "json"} {
		var e bytes.Buffer
		code := Main([]string{"-o", o, "version"}, failingWriter{}, &e)
		if code != 1 || strings.Contains(e.String(), "(UsageError)") || !strings.Contains(e.String(), "(OutputError)") ||
			!strings.Contains(e.String(), "no space left on device") {
			t.Errorf("-o %s version, stdout failing: exit %d, stderr %q; want exit 1 and an OutputError", o, code, e.String())
		}
	}
}
