package cluster

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestJoinOfStartedMemberRefused: a join that finds its member by peer URL
// is only the same node asking again (a crash mid-join) while that member
// has never started — the joining node records its answer before its
// member starts, and never asks again after. A member that has started
// (it has a name) and is asked for again is a node that lost its data
// directory, or another one given its addresses: told "voter" (or
// "learner"), it would start that member with an empty log, which etcd's
// Raft takes for a lost log (it panics, or a voter that forgot what it
// acknowledged breaks the quorum's guarantees). It must be refused, with
// the way out; likewise a client node stepping up to that member.
func TestJoinOfStartedMemberRefused(t *testing.T) {
	e, s, ctx := bootstrapped(t, "started-member")
	ms, err := e.Meta.Members(ctx)
	if err != nil || len(ms) != 1 || ms[0].Name == "" {
		t.Fatalf("members: %+v %v", ms, err)
	}
	m := ms[0]
	req := JoinRequest{Name: m.Name, Peer: m.Peers[0], Client: m.Clients[0], API: "https://wiped.example:8443"}
	resp, err := s.Join(ctx, req)
	if !errs.IsCode(err, CodeNodeExists) {
		t.Fatalf("join as the running member %s with a fresh data directory: role %q, %v; want %s", m.Name, role(resp), err, CodeNodeExists)
	}
	if err := e.Meta.PutNode(ctx, nodeRecord(req, meta.RoleClient)); err != nil {
		t.Fatal(err)
	}
	if resp, err := s.StepUp(ctx, req); !errs.IsCode(err, CodeNodeExists) {
		t.Fatalf("step up to the running member %s: role %q, %v; want %s", m.Name, role(resp), err, CodeNodeExists)
	}
	if ms, err := e.Meta.Members(ctx); err != nil || len(ms) != 1 {
		t.Fatalf("members after the refusals: %+v %v", ms, err)
	}
}

func role(r *JoinResponse) string {
	if r == nil {
		return ""
	}
	return r.Role
}
