package cluster

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestRemoveRevokes: removing a node revokes the credentials
// issued to it (the revoker the server sets: the node's local admin
// identity) before its registration goes, so that a removal whose
// revocation failed stays to be retried, and succeeds when retried.
func TestRemoveRevokes(t *testing.T) {
	s := joinService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "rev-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if resp, err := s.Join(ctx, joinRequest(name, "rev.example")); err != nil || resp.Role != meta.RoleClient {
		t.Fatalf("join: %+v %v", resp, err)
	}
	var revoked []string
	fail := errors.New("metadata hiccup")
	s.SetRevoker(func(_ context.Context, node string) error {
		revoked = append(revoked, node)
		if len(revoked) == 1 {
			return fail
		}
		return nil
	})
	if err := s.Remove(ctx, name); !errors.Is(err, fail) {
		t.Fatalf("remove with the revocation failing: %v", err)
	}
	if _, err := s.meta.Node(ctx, name); err != nil {
		t.Fatalf("the node's registration went although its credentials were not revoked: %v", err)
	}
	if err := s.Remove(ctx, name); err != nil {
		t.Fatal(err)
	}
	if len(revoked) != 2 || revoked[1] != name {
		t.Fatalf("revoked %v", revoked)
	}
	if _, err := s.meta.Node(ctx, name); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("registration after the removal: %v", err)
	}
}
