package cluster

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestSecondLearnerIsJoinInProgress: etcd refuses a second learner (its
// client returns the refusal as an rpctypes.EtcdError, not the gRPC
// status): the store must say 409 JoinInProgress — which a joining node
// waits out — not fail with an internal error.
func TestSecondLearnerIsJoinInProgress(t *testing.T) {
	e, _, ctx := bootstrapped(t, "second-learner")
	if _, err := e.Meta.AddLearner(ctx, "https://first.example:2380"); err != nil {
		t.Fatal(err)
	}
	_, err := e.Meta.AddLearner(ctx, "https://second.example:2380")
	if !errs.IsCode(err, meta.CodeJoinInProgress) {
		t.Fatalf("a second learner: %v; want %s", err, meta.CodeJoinInProgress)
	}
}
