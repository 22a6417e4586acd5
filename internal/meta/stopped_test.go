package meta

import (
	"context"
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A read a stopped member refused (raft.ErrStopped as etcd sends it) is
// sent again, a bounded number of times; a write is not (it may have been
// handed on), nor is any other answer; and if it is the last answer, the
// API says the metadata is unavailable (503, ask again), not an internal
// error.
func TestRetryStopped(t *testing.T) {
	stopped := status.Error(codes.Unknown, raft.ErrStopped.Error())
	other := status.Error(codes.Unknown, "something else")
	for _, c := range []struct {
		name    string
		method  string
		answers []error
		calls   int
		want    error
	}{
		{"ok", etcdserverpb.KV_Range_FullMethodName, []error{nil}, 1, nil},
		{"stopped then ok", etcdserverpb.KV_Range_FullMethodName, []error{stopped, stopped, nil}, 3, nil},
		{"other error", etcdserverpb.KV_Range_FullMethodName, []error{other, nil}, 1, other},
		{"always stopped", etcdserverpb.KV_Range_FullMethodName, []error{stopped, stopped, stopped, stopped, stopped, stopped, stopped}, 1 + stoppedRetries, stopped},
		{"a write", etcdserverpb.KV_Txn_FullMethodName, []error{stopped, nil}, 1, stopped},
		{"a put", etcdserverpb.KV_Put_FullMethodName, []error{stopped, nil}, 1, stopped},
	} {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			invoke := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
				calls++
				return c.answers[calls-1]
			}
			err := retryStopped(context.Background(), c.method, nil, nil, nil, invoke)
			if calls != c.calls || !errors.Is(err, c.want) && err != c.want {
				t.Fatalf("%d calls, %v; want %d, %v", calls, err, c.calls, c.want)
			}
		})
	}
	if err := wrap("register node", stopped); !errs.IsCode(err, errs.CodeMetadataUnavailable) {
		t.Fatalf("wrap(stopped) = %v, want %s", err, errs.CodeMetadataUnavailable)
	}
	if memberStopped(other) || memberStopped(errors.New(raft.ErrStopped.Error())) {
		t.Fatal("memberStopped takes other errors for a stopped member's answer")
	}
}
