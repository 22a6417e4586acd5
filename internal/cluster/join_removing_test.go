package cluster

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
)

// TestJoinOfNodeBeingRemoved: a removal that failed after marking the node
// (its revocation or its record's deletion met no quorum) leaves the
// record marked removing, so that the node gets no credentials again
// until `node remove` is run again (Register, Tx.Registered). The node
// asking to join again with its old addresses — a crash mid-join, or a
// supervisor restarting it — must not rewrite the record unmarked and be
// handed the cluster CA: the join is refused, the mark stays.
func TestJoinOfNodeBeingRemoved(t *testing.T) {
	e, s, ctx := bootstrapped(t, "join-removing")
	req := joinRequest("leaving", "leaving.example")
	if _, err := s.Join(ctx, req); err != nil {
		t.Fatalf("first join: %v", err)
	}
	n, err := e.Meta.Node(ctx, req.Name)
	if err != nil {
		t.Fatal(err)
	}
	n.Removing = true // what Remove writes before it revokes
	if err := e.Meta.PutNode(ctx, n); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Join(ctx, req)
	if !errs.IsCode(err, CodeNodeExists) || resp != nil {
		t.Fatalf("join of a node being removed: role %q, %v; want %s", role(resp), err, CodeNodeExists)
	}
	if n, err := e.Meta.Node(ctx, req.Name); err != nil || !n.Removing {
		t.Fatalf("record after the refused join: %+v %v; want it still marked removing", n, err)
	}
	// Asked again, the removal finishes.
	if err := s.Remove(ctx, req.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Meta.Node(ctx, req.Name); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("record after the removal: %v", err)
	}
}
