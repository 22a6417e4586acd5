package e2e

import (
	"os"
	"testing"
)

// strictEnv names the variable that turns this package's skips into
// failures. .ci/run sets it: CI runs as root on a machine that deps.sh has
// provisioned, so a test that would skip there (no root, a missing tool)
// means the partition, fencing or reflink proofs silently did not run.
const strictEnv = "BASALT_E2E_STRICT"

// skipf skips the test for a missing prerequisite, or fails it when
// BASALT_E2E_STRICT is set.
func skipf(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv(strictEnv) != "" {
		t.Fatalf("prerequisite missing with "+strictEnv+" set: "+format, args...)
	}
	t.Skipf(format, args...)
}
