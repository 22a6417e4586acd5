package meta

import "testing"

// TestPromoteVoter: promoting a member that already is a voter (a node
// that crashed after its promotion, before recording it) succeeds, so the
// node's promotion loop ends instead of retrying forever.
func TestPromoteVoter(t *testing.T) {
	s := openTestStore(t)
	if err := s.Promote(ctxT(t), s.MemberID()); err != nil {
		t.Fatalf("promote a voter: %v", err)
	}
}
