package server

import (
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestJoinWithVoterDown: in a cluster growing to 5 voters that has 3, one
// of them down, etcd takes no new member — not even a learner (too few
// voters would be connected) — until that voter is back or removed.
// A node joining meanwhile must not wait for that (its join failed after
// minutes of JoinInProgress): it joins as a client, the role it would
// have beyond the target, and steps up later.
func TestJoinWithVoterDown(t *testing.T) {
	ctx, a, c := threeVoters(t, 5, 90*time.Second)
	c.Close()
	for down := false; !down; { // its liveness key gone (5 s)
		if ctx.Err() != nil {
			t.Fatal("c still healthy after it stopped")
		}
		time.Sleep(200 * time.Millisecond)
		ns, _ := a.cluster.Nodes(ctx)
		for _, x := range ns {
			down = down || x.Name == "c" && x.Health == cluster.Unhealthy
		}
	}
	req := cluster.JoinRequest{Name: "d", Peer: "https://d.example:2380", Client: "https://d.example:2379", API: "https://d.example:8443"}
	resp, err := a.cluster.Join(ctx, req)
	if err != nil || resp.Role != meta.RoleClient {
		role := ""
		if resp != nil {
			role = resp.Role
		}
		t.Fatalf("join with voter c down: role %q, %v; want %s", role, err, meta.RoleClient)
	}
	if n, err := a.meta.Node(ctx, "d"); err != nil || n.Peer != "" {
		t.Fatalf("d's record: %+v %v; want a client's", n, err)
	}
	if ms, err := a.meta.Members(ctx); err != nil || len(ms) != 3 {
		t.Fatalf("members: %+v %v; want no learner added", ms, err)
	}
}
