package nbd

import (
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/metrics"
)

// Stats counts the requests answered on an export, for the node's
// metrics: per command, how many, how many failed, how many bytes they
// covered, and their latency from the request's header read to its reply
// written. One Stats may serve every connection to an export (its
// counters are atomics); the exporter reads them when a scraper asks.
type Stats struct {
	ops [numOps]OpStats
}

// OpStats are one command's counts.
type OpStats struct {
	Requests, Errors atomic.Uint64
	// Bytes is the length the requests covered (read, written, trimmed,
	// zeroed, asked the status of), failed ones included.
	Bytes   atomic.Uint64
	Latency metrics.Latency
}

// numOps: one slot per command of the protocol (cmdRead … cmdBlockStatus)
// and one for any other.
const numOps = cmdBlockStatus + 2

// opNames are the label values of the slots.
var opNames = [numOps]string{
	cmdRead: "read", cmdWrite: "write", cmdDisc: "disc", cmdFlush: "flush", cmdTrim: "trim",
	cmdCache: "cache", cmdWriteZeroes: "write_zeroes", cmdBlockStatus: "block_status", numOps - 1: "other",
}

// Each calls fn with every command's name and counts.
func (s *Stats) Each(fn func(op string, st *OpStats)) {
	for i := range s.ops {
		fn(opNames[i], &s.ops[i])
	}
}

// answered counts r's request.
func (s *Stats) answered(r *reply) {
	i := int(r.req.typ)
	if i >= numOps-1 {
		i = numOps - 1
	}
	op := &s.ops[i]
	op.Bytes.Add(uint64(r.req.length))
	if r.errno != 0 || r.typ == replyTypeError {
		op.Errors.Add(1)
	}
	op.Latency.Observe(time.Duration(since() - r.req.start))
	// Last: a reader that sees a request counted sees the rest of it.
	op.Requests.Add(1)
}
