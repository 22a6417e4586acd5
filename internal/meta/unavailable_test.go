package meta

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// TestUnavailable: the errors etcd gives when no quorum answers or a leader
// changes under a request become 503 MetadataUnavailable; others do not.
func TestUnavailable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{rpctypes.ErrLeaderChanged, true},
		{rpctypes.ErrGRPCLeaderChanged, true},
		{rpctypes.ErrNoLeader, true},
		{rpctypes.ErrTimeout, true},
		{rpctypes.ErrTimeoutDueToLeaderFail, true},
		{rpctypes.ErrStopped, true},
		{fmt.Errorf("txn: %w", rpctypes.ErrLeaderChanged), true},
		{context.DeadlineExceeded, true},
		{rpctypes.ErrCompacted, false},
		{rpctypes.ErrKeyNotFound, false},
		{errors.New("boom"), false},
	} {
		if got := unavailable(c.err); got != c.want {
			t.Errorf("unavailable(%v) = %v, want %v", c.err, got, c.want)
		}
		e, ok := errs.As(wrap("put", c.err))
		if got := ok && e.Code == errs.CodeMetadataUnavailable; got != c.want {
			t.Errorf("wrap(%v) = %v", c.err, wrap("put", c.err))
		}
	}
}
