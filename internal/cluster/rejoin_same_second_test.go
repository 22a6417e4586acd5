package cluster

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/meta"
)

// TestRejoinRightAfterRemoval: etcd names a new member by a hash of its
// peer URLs and the current second, and refuses an id it removed before
// ("member not found"). A node whose learner was just removed (`node
// remove` of a half-joined node, a StepDown) joining again with the same
// peer URL within that second must still get its learner, not a 500.
func TestRejoinRightAfterRemoval(t *testing.T) {
	_, s, ctx := bootstrapped(t, "rejoin")
	req := joinRequest("again", "again.example")
	for i := range 3 {
		resp, err := s.Join(ctx, req)
		if err != nil || resp.Role != meta.RoleLearner {
			t.Fatalf("join %d: role %q, %v", i, role(resp), err)
		}
		if err := s.Remove(ctx, req.Name); err != nil {
			t.Fatalf("remove %d: %v", i, err)
		}
	}
}
