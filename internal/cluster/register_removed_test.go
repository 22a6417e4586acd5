package cluster

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestRegisterAfterRemoval: a node's start checks that it was not removed,
// then — much later, after the volume service started — registers. A
// removal finishing in between left no record, and Register (read, then
// an unconditional put) made a new one: the removed node served on, with
// no removal left to stop it; one still running had its removing mark
// overwritten. A node recorded before now registers only if its record is
// still there and not being removed, in one transaction with the read.
func TestRegisterAfterRemoval(t *testing.T) {
	s := joinService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "reg-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if resp, err := s.Join(ctx, joinRequest(name, "reg.example")); err != nil {
		t.Fatalf("join: %+v %v", resp, err)
	}
	joined, err := s.meta.Node(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	rec := func() *meta.Node { return &meta.Node{Name: name, API: "https://reg.example:8443"} }

	// Registered as the join recorded it: URLs updated, JoinedAt kept.
	if err := s.Register(ctx, rec(), "c1"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.meta.Node(ctx, name); err != nil || got.API != "https://reg.example:8443" || !got.JoinedAt.Equal(joined.JoinedAt) {
		t.Fatalf("after registering: %+v %v (joined at %v)", got, err, joined.JoinedAt)
	}

	// Being removed: the mark stays, and the node is refused.
	marked, _ := s.meta.Node(ctx, name)
	marked.Removing = true
	if err := s.meta.PutNode(ctx, marked); err != nil {
		t.Fatal(err)
	}
	if err := s.Register(ctx, rec(), "c1"); !errs.IsCode(err, CodeNodeRemoved) {
		t.Fatalf("registering while being removed: %v, want NodeRemoved", err)
	}
	if got, err := s.meta.Node(ctx, name); err != nil || !got.Removing {
		t.Fatalf("the removing mark after the refused registration: %+v %v", got, err)
	}

	// Removed: no record is made again.
	if err := s.meta.DeleteNode(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := s.Register(ctx, rec(), "c1"); !errs.IsCode(err, CodeNodeRemoved) {
		t.Fatalf("registering after the removal: %v, want NodeRemoved", err)
	}
	if _, err := s.meta.Node(ctx, name); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("a removed node's registration made its record again: %v", err)
	}

	// A first registration (never recorded before) makes it.
	if err := s.Register(ctx, rec(), ""); err != nil {
		t.Fatal(err)
	}
	if got, err := s.meta.Node(ctx, name); err != nil || got.JoinedAt.IsZero() {
		t.Fatalf("first registration: %+v %v", got, err)
	}
}
