package server

import (
	"context"
	"iter"
	"time"
)

// ticks yields every d, the first time d from now, until ctx ends: the
// loop of the node's background checks (certificates, the local admin
// identity, stepping up to voter).
func ticks(ctx context.Context, d time.Duration) iter.Seq[time.Time] {
	return func(yield func(time.Time) bool) {
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				if !yield(now) {
					return
				}
			}
		}
	}
}
