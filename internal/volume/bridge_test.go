package volume

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/meta"
)

// TestAccountByRecord: an export writes its object as the snapshot's owner
// only while that user's record is the one the snapshot was made under; a
// user created since under the same name is someone else.
func TestAccountByRecord(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	e.update(func(tx *meta.Tx) error {
		tx.PutUser(&meta.User{Name: "bob", ID: "bob-2", AccessKeyID: "AKBOB2", CreatedAt: now()})
		return nil
	})
	if a, err := s.account(ctx, "bob", "bob-2"); err != nil || a.Access != "AKBOB2" {
		t.Fatalf("the owner's own record: %+v, %v", a, err)
	}
	if a, err := s.account(ctx, "bob", "bob-1"); err != nil || a.Access != "" {
		t.Fatalf("a namesake's record: %+v, %v", a, err)
	}
	if a, err := s.account(ctx, "carol", "carol-1"); err != nil || a.Access != "" {
		t.Fatalf("a deleted user: %+v, %v", a, err)
	}
}
