package cli

import (
	"log/slog"
	"os"
	"runtime/debug"
	"syscall"
)

// A server's garbage collector, unless the operator set GOGC or
// GOMEMLIMIT: it collects when the heap has grown by 400 % rather than Go's
// 100 %, under a soft limit of a quarter of the machine's memory.
//
// Why: a node's live heap is small (tens of MiB: etcd's index of basalt's
// metadata, the mirrors, connection state), and every S3 request and API
// call allocates — at Go's default, collection took about a tenth of the
// server's CPU on small GETs. At 400 % it collects a quarter as often, for
// about 25–30 MiB more resident memory (bench/RESULTS.md, 2026-11-26,
// session 15). The soft limit keeps a node whose heap is unusually large
// from growing to five times it: near the limit Go collects as often as
// it must.
const (
	serverGCPercent   = 400
	serverMemoryShare = 4 // the soft limit is RAM / serverMemoryShare
)

func tuneGC(log *slog.Logger) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(serverGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		var si syscall.Sysinfo_t
		if err := syscall.Sysinfo(&si); err == nil && si.Totalram > 0 {
			limit := int64(si.Totalram) * int64(si.Unit) / serverMemoryShare
			debug.SetMemoryLimit(limit)
			log.Debug("garbage collector", "gc_percent", serverGCPercent, "soft_memory_limit", limit)
		}
	}
}
