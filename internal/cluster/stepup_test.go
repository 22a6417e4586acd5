package cluster

import (
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/meta"
)

// TestStepUp: with fewer voters than its target, the first client node to
// ask is added as a learner (its record gains its etcd URLs) and told how
// to start its member; asking again gets the same answer (a crash before
// the member started); another client node is told no while that learner
// exists; StepDown removes the learner and the URLs, and then a voter is
// wanted again. The learner never starts here: this only tests the
// decision.
func TestStepUp(t *testing.T) {
	e, s, ctx := bootstrapped(t, "step-up-test")
	a, b := joinRequest("a", "a.example"), joinRequest("b", "b.example")
	for _, r := range []JoinRequest{a, b} { // two client nodes
		if err := e.Meta.PutNode(ctx, nodeRecord(r, meta.RoleClient)); err != nil {
			t.Fatal(err)
		}
	}

	resp, err := s.StepUp(ctx, a)
	if err != nil || resp == nil || resp.Role != meta.RoleLearner {
		t.Fatalf("step up a: %+v %v", resp, err)
	}
	if !strings.Contains(resp.InitialCluster, "a="+a.Peer) || len(resp.Endpoints) == 0 {
		t.Fatalf("step up a: initial cluster %q, endpoints %v", resp.InitialCluster, resp.Endpoints)
	}
	if n, err := e.Meta.Node(ctx, "a"); err != nil || n.Peer != a.Peer || n.Client != a.Client {
		t.Fatalf("a's record: %+v %v", n, err)
	}
	again, err := s.StepUp(ctx, a)
	if err != nil || again == nil || again.InitialCluster != resp.InitialCluster {
		t.Fatalf("a asking again: %+v %v, want %+v", again, err, resp)
	}
	if got, err := s.StepUp(ctx, b); err != nil || got != nil {
		t.Fatalf("b while a's learner exists: %+v %v, want nothing", got, err)
	}
	if err := s.StepDown(ctx, a); err != nil {
		t.Fatal(err)
	}
	if n, err := e.Meta.Node(ctx, "a"); err != nil || n.Peer != "" {
		t.Fatalf("a's record after StepDown: %+v %v", n, err)
	}
	if ms, err := e.Meta.Members(ctx); err != nil || len(ms) != 1 {
		t.Fatalf("members after StepDown: %+v %v", ms, err)
	}
	if _, want, err := s.wantsVoter(ctx, b.Peer); err != nil || !want {
		t.Fatalf("after StepDown, a voter wanted: %v %v", want, err)
	}
}
