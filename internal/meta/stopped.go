package meta

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A member whose raft node has stopped — one just removed from the
// cluster, between applying its removal and its server's shutdown, or
// one shutting down — answers requests with raft's ErrStopped, which
// etcd sends as gRPC's Unknown code: the client's own retries (for
// Unavailable) do not apply, and the error would reach the API as a 500.
// Every node's client still lists a removed member's URL until its next
// endpoint sync (30 s, or the removal itself on the node that served it:
// RemoveMember). A read is sent again — the client's round-robin
// balancer sends it to the next endpoint. A write is not: a stopping
// member may have handed the proposal on before it stopped (raft answers
// ErrStopped whichever comes first), so its outcome is unknown, as after
// a timeout, and the caller is told so (MetadataUnavailable, unavailable).

// stoppedRetries bounds the attempts after the first: enough to pass
// every other endpoint of a 5-voter cluster's list once.
const stoppedRetries = 4

// memberStopped reports whether err is a stopped member's answer.
func memberStopped(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unknown && st.Message() == raft.ErrStopped.Error()
}

// readOnly lists the etcd RPCs basalt sends again: those that change
// nothing. Every other one (Txn, Put, DeleteRange, leases, membership)
// is not.
var readOnly = map[string]bool{
	etcdserverpb.KV_Range_FullMethodName:              true,
	etcdserverpb.Cluster_MemberList_FullMethodName:    true,
	etcdserverpb.Maintenance_Status_FullMethodName:    true,
	etcdserverpb.Lease_LeaseTimeToLive_FullMethodName: true,
	etcdserverpb.Lease_LeaseLeases_FullMethodName:     true,
}

// retryStopped is a unary client interceptor that sends a read a stopped
// member refused again (see above). Streams (watches) have their own
// reconnection.
func retryStopped(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	for i := 0; i < stoppedRetries && readOnly[method] && memberStopped(err); i++ {
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(time.Duration(i+1) * 20 * time.Millisecond):
		}
		err = invoker(ctx, method, req, reply, cc, opts...)
	}
	return err
}
