package meta

import (
	"context"
	"testing"
	"time"
)

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A mirror follows puts, changes of the index and deletes; records that
// exist before it starts are loaded.
func TestMirror(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	put := func(b *Bucket) {
		t.Helper()
		if err := s.Update(ctx, func(tx *Tx) error { tx.PutBucket(b); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	put(&Bucket{Name: "mirror-early", Owner: "alice"})
	m := s.MirrorBuckets(ctx)
	eventually(t, "the existing bucket", func() bool { _, ok := m.Get("mirror-early"); return ok })

	put(&Bucket{Name: "mirror-late", Owner: "bob"})
	eventually(t, "a new bucket", func() bool { b, ok := m.Get("mirror-late"); return ok && b.Owner == "bob" })
	put(&Bucket{Name: "mirror-late", Owner: "carol"})
	eventually(t, "an update", func() bool { b, ok := m.Get("mirror-late"); return ok && b.Owner == "carol" })
	if err := s.Update(ctx, func(tx *Tx) error { tx.DeleteBucket("mirror-late"); return nil }); err != nil {
		t.Fatal(err)
	}
	// Get misses while the mirror has yet to see this node's own write;
	// Await waits for it.
	if err := m.Await(ctx, "mirror-late", func(_ *Bucket, ok bool) bool { return !ok }); err != nil {
		t.Fatalf("a delete: %v", err)
	}
	if _, ok := m.Get("mirror-early"); !ok {
		t.Fatal("a delete removed another record")
	}

	// Users by access key: a changed key moves the index.
	u := &User{Name: "mirror-user", ID: "id1", AccessKeyID: "AK1"}
	users := s.MirrorUsersByAccessKey(ctx)
	if err := s.Update(ctx, func(tx *Tx) error { tx.PutUser(u); return nil }); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the user by key", func() bool { _, ok := users.Get("AK1"); return ok })
	u.AccessKeyID = "AK2"
	if err := s.Update(ctx, func(tx *Tx) error { tx.PutUser(u); return nil }); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new key", func() bool { _, ok := users.Get("AK2"); return ok })
	if _, ok := users.Get("AK1"); ok {
		t.Fatal("the old access key still resolves")
	}
	if err := s.Update(ctx, func(tx *Tx) error { tx.DeleteUser(u); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := users.Await(ctx, "AK2", func(_ *User, ok bool) bool { return !ok }); err != nil {
		t.Fatalf("the user's deletion: %v", err)
	}
}

// Await returns once the mirror shows what the caller waits for, and
// gives up with its context.
func TestMirrorAwait(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	m := s.MirrorUsersByName(ctx)
	u := &User{Name: "await-user", ID: "id-await"}
	if err := s.Update(ctx, func(tx *Tx) error { tx.PutUser(u); return nil }); err != nil {
		t.Fatal(err)
	}
	present := func(r *User, ok bool) bool { return ok && r.ID == u.ID }
	if err := m.Await(ctx, u.Name, present); err != nil {
		t.Fatal(err)
	}
	// An unsynced mirror answers every Await at once (it knows nothing):
	// what follows needs the first list done, which Get proves.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, ok := m.Get(u.Name); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the mirror never listed the user")
		}
	}
	if err := s.Update(ctx, func(tx *Tx) error { tx.DeleteUser(u); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := m.Await(ctx, u.Name, func(_ *User, ok bool) bool { return !ok }); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Get(u.Name); ok {
		t.Fatal("Await returned before the deletion reached the mirror")
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := m.Await(short, u.Name, present); err == nil {
		t.Fatal("Await of something that never happens returned nil")
	}
}
