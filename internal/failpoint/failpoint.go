// Package failpoint lets tests crash a basalt process at a named point of
// a multi-step change, to prove that the change resumes after a crash
// there: `BASALT_FAILPOINT=NAME basalt server ...` makes the process kill
// itself with SIGKILL — no deferred function, no flush, as a power cut —
// the first time it reaches Crash(NAME).
//
// The variable is for tests only (tests/e2e sets it); unset, Crash costs
// one comparison. Points are named where they are placed; a test that
// names a point no code reaches fails by its own checks, not here.
package failpoint

import (
	"log/slog"
	"os"
	"syscall"
)

// Env is the environment variable naming the point to crash at.
const Env = "BASALT_FAILPOINT"

var armed = os.Getenv(Env)

// Crash kills the process if name is the armed point.
func Crash(name string) {
	if armed == "" || armed != name {
		return
	}
	slog.Warn("failpoint reached: killing this process", "failpoint", name)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
