package meta

import "context"

// Read consistency. Every read is linearizable unless the quorum is lost
// (then it is served from the local copy: see Store.read) or the caller
// asked for a stale read, which the node that receives it answers from its
// own copy with no round trip to the leader. ReadInfo tells the caller
// (the API, which says so in a response header) whether any read of a
// request was served from the local copy.

type ctxKey int

const (
	staleKey ctxKey = iota
	infoKey
	linearKey
)

// Stale marks ctx's reads as tolerating staleness.
func Stale(ctx context.Context) context.Context { return context.WithValue(ctx, staleKey, true) }

func wantsStale(ctx context.Context) bool { b, _ := ctx.Value(staleKey).(bool); return b }

// Linear marks ctx's reads as needing a quorum's answer: linearizable or
// failed (503 MetadataUnavailable), never served from the local copy,
// however long the quorum takes (up to requestTimeout) or whether it is
// thought lost. For decisions a lagging copy would make wrong and that a
// write follows: a membership change counts the voters it reads.
func Linear(ctx context.Context) context.Context { return context.WithValue(ctx, linearKey, true) }

func wantsLinear(ctx context.Context) bool { b, _ := ctx.Value(linearKey).(bool); return b }

// ReadInfo collects how a request's reads were served.
type ReadInfo struct {
	// Local: at least one read came from the local copy, which may
	// miss the latest writes.
	Local bool
}

// WithReadInfo returns a context whose reads report into the ReadInfo.
func WithReadInfo(ctx context.Context) (context.Context, *ReadInfo) {
	ri := &ReadInfo{}
	return context.WithValue(ctx, infoKey, ri), ri
}

func markLocal(ctx context.Context) {
	if ri, ok := ctx.Value(infoKey).(*ReadInfo); ok {
		ri.Local = true
	}
}
