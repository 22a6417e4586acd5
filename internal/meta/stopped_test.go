package meta

import (
	"context"
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"go.etcd.io/raft/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A stopped member's answer (raft.ErrStopped as etcd sends it) is sent
// again, a bounded number of times; any other answer is not; and if it
// is the last answer, the API says the metadata is unavailable (503,
// ask again), not an internal error.
func TestRetryStopped(t *testing.T) {
	stopped := status.Error(codes.Unknown, raft.ErrStopped.Error())
	other := status.Error(codes.Unknown, "something else")
	for _, c := range []struct {
		name    string
		answers []error
		calls   int
		want    error
	}{
		{"ok", []error{nil}, 1, nil},
		{"stopped then ok", []error{stopped, stopped, nil}, 3, nil},
		{"other error", []error{other, nil}, 1, other},
		{"always stopped", []error{stopped, stopped, stopped, stopped, stopped, stopped, stopped}, 1 + stoppedRetries, stopped},
	} {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			invoke := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
				calls++
				return c.answers[calls-1]
			}
			err := retryStopped(context.Background(), "/etcdserverpb.KV/Put", nil, nil, nil, invoke)
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
