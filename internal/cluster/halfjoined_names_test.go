package cluster

import (
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestHalfJoinedNodeNamed: a node half joined — its learner added, its
// record written, its member never started — is one name everywhere:
// `node list` shows it under its node's name, so the JoinInProgress that
// it causes names it so too (not unstarted-<id>), and removing the name
// the error gives takes out the learner and the record both, leaving no
// stale client entry in the list.
func TestHalfJoinedNodeNamed(t *testing.T) {
	_, s, ctx := bootstrapped(t, "half-joined")
	gone := joinRequest("gone", "gone.example")
	if resp, err := s.Join(ctx, gone); err != nil || resp.Role != meta.RoleLearner {
		t.Fatalf("first join: %+v %v", resp, err)
	}
	_, err := s.Join(ctx, joinRequest("next", "next.example"))
	if !errs.IsCode(err, CodeJoinInProgress) {
		t.Fatalf("join behind a stuck learner: %v, want %s", err, CodeJoinInProgress)
	}
	if !strings.Contains(err.Error(), "learner gone (peer "+gone.Peer+")") || strings.Contains(err.Error(), "unstarted-") {
		t.Fatalf("join behind gone's learner: %v; want it named gone, as node list does", err)
	}
	if err := s.Remove(ctx, "gone"); err != nil {
		t.Fatalf("remove the node the error names: %v", err)
	}
	list, err := s.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range list {
		if n.Name == "gone" || strings.HasPrefix(n.Name, "unstarted-") {
			t.Fatalf("after removing gone, the list still has %+v", n)
		}
	}
}

// TestStepUpAfterCrashRecordsURLs: a client node that crashed after its
// learner was added restarts as a client, and its registration drops its
// etcd URLs. Asking to step up again finds its learner and must give its
// record the URLs back: else `node list` shows it as a client beside a
// nameless unstarted-<id> learner, and the JoinInProgress a voter's join
// meets names that learner rather than the node.
func TestStepUpAfterCrashRecordsURLs(t *testing.T) {
	e, s, ctx := bootstrapped(t, "step-up-crash")
	c := joinRequest("c", "c.example")
	if err := e.Meta.PutNode(ctx, nodeRecord(c, meta.RoleClient)); err != nil {
		t.Fatal(err)
	}
	if resp, err := s.StepUp(ctx, c); err != nil || resp == nil {
		t.Fatalf("step up: %+v %v", resp, err)
	}
	// The crash and restart: registered again as a client (Register
	// writes the record a client node has, without etcd URLs).
	if err := s.Register(ctx, &meta.Node{Name: "c", API: c.API}, "step-up-crash"); err != nil {
		t.Fatal(err)
	}
	if resp, err := s.StepUp(ctx, c); err != nil || resp == nil || resp.Role != meta.RoleLearner {
		t.Fatalf("step up after the restart: %+v %v", resp, err)
	}
	if n, err := e.Meta.Node(ctx, "c"); err != nil || n.Peer != c.Peer || n.Client != c.Client {
		t.Fatalf("c's record after stepping up again: %+v %v; want its etcd URLs", n, err)
	}
	list, err := s.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range list {
		if n.Name == "c" && n.Role != meta.RoleLearner || strings.HasPrefix(n.Name, "unstarted-") {
			t.Fatalf("node list %+v: want c listed as the learner", list)
		}
	}
}
