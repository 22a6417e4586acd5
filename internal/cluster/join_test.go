package cluster

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
)

func TestMain(m *testing.M) { metatest.Main(m) }

// joinService is the membership service of the test member's node, in a
// cluster whose target is one voter: the member is it, so every join makes
// a client node (no etcd member is added).
func joinService(t *testing.T) *Service {
	t.Helper()
	e := metatest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, _, err := e.Meta.Bootstrap(ctx, "join-test", 1, e.CA.CertPEM, e.CA.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return New(e.Meta, e.CA, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func joinRequest(name, host string) JoinRequest {
	return JoinRequest{Name: name, Peer: "https://" + host + ":2380", Client: "https://" + host + ":2379", API: "https://" + host + ":8443"}
}

// TestJoinDuplicateName: a join under the name of a registered node with
// other addresses is refused (409 NodeExists) and leaves that node's
// record alone; the node itself asking again (same addresses: a crash
// mid-join) gets its answer again.
func TestJoinDuplicateName(t *testing.T) {
	s := joinService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "dup-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	first := joinRequest(name, "first.example")
	if resp, err := s.Join(ctx, first); err != nil || resp.Role != meta.RoleClient {
		t.Fatalf("first join: %+v %v", resp, err)
	}
	if resp, err := s.Join(ctx, first); err != nil || resp.Role != meta.RoleClient {
		t.Fatalf("the same node asking again: %+v %v", resp, err)
	}
	_, err := s.Join(ctx, joinRequest(name, "second.example"))
	if !errs.IsCode(err, CodeNodeExists) {
		t.Fatalf("a second node under the name %s: %v, want %s", name, err, CodeNodeExists)
	}
	if e, _ := errs.As(err); e.Kind != errs.KindConflict || !strings.Contains(err.Error(), first.API) {
		t.Fatalf("error %v: want a conflict naming the registered node's API %s", err, first.API)
	}
	n, err := s.meta.Node(ctx, name)
	if err != nil || n.API != first.API {
		t.Fatalf("registered node after the refused join: %+v %v", n, err)
	}
}

// bootstrapped is a private metadata store bootstrapped as cluster name
// (3 voters wanted), its Service, and a context that ends with the test
// (at most 60 s).
func bootstrapped(t *testing.T, name string) (*metatest.Env, *Service, context.Context) {
	t.Helper()
	e := metatest.Private(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	if _, _, _, err := e.Meta.Bootstrap(ctx, name, 3, e.CA.CertPEM, e.CA.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return e, New(e.Meta, e.CA, "test", slog.New(slog.NewTextHandler(io.Discard, nil))), ctx
}

// TestStuckLearnerNamed: a node whose join added a learner and that then
// died for good, before its member started, blocks the joins of voters.
// The refusal names that learner and the way out, and removing it (by
// the node's name) lets the next join through.
func TestStuckLearnerNamed(t *testing.T) {
	_, s, ctx := bootstrapped(t, "stuck-learner")
	gone := joinRequest("gone", "gone.example")
	if resp, err := s.Join(ctx, gone); err != nil || resp.Role != meta.RoleLearner {
		t.Fatalf("first join: %+v %v", resp, err)
	}
	_, err := s.Join(ctx, joinRequest("next", "next.example"))
	if !errs.IsCode(err, CodeJoinInProgress) || !strings.Contains(err.Error(), gone.Peer) ||
		!strings.Contains(err.Error(), "basalt node remove") {
		t.Fatalf("join behind a stuck learner: %v; want %s naming %s and the way out", err, CodeJoinInProgress, gone.Peer)
	}
	if err := s.Remove(ctx, "gone"); err != nil {
		t.Fatalf("remove the stuck learner's node: %v", err)
	}
	if resp, err := s.Join(ctx, joinRequest("next", "next.example")); err != nil || resp.Role != meta.RoleLearner {
		t.Fatalf("join after the removal: %+v %v", resp, err)
	}
}
