package objects

import (
	"context"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
)

// TestCreateBucketRevokedKey: a bucket is created for its owner only while
// the access key the request was signed with is still the owner's. A
// request signed with a key revoked a moment before — the user deleted and
// created again under the name, or given new keys — and let through by a
// node whose copy of the users lags, used to create the bucket for
// whoever held the name at the commit.
func TestCreateBucketRevokedKey(t *testing.T) {
	e := metatest.Private(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Meta.Update(ctx, func(tx *meta.Tx) error {
		tx.PutUser(&meta.User{Name: "dora", ID: "id-new", AccessKeyID: "KEYNEW", CreatedAt: time.Now()})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	m := MetaBuckets{Meta: e.Meta}
	if err := m.CreateBucket(ctx, Bucket{Name: "stale-key", Owner: "dora", OwnerAccess: "KEYOLD", CreatedAt: time.Now()}); err == nil {
		t.Fatal("a bucket was created with a key the owner no longer has")
	}
	if r, err := e.Meta.Bucket(ctx, "stale-key"); err == nil {
		t.Fatalf("bucket recorded: %+v", r)
	}
	if err := m.CreateBucket(ctx, Bucket{Name: "live-key", Owner: "dora", OwnerAccess: "KEYNEW", CreatedAt: time.Now()}); err != nil {
		t.Fatalf("the owner's current key: %v", err)
	}
}
