package volume

import (
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestCloneUnavailableSnapshotMessage: a clone of a snapshot that will
// never become available — being deleted (a delete whose finishing is
// pending, as after a node died in it), or failed — is refused saying
// so. It answered "clone it when it is available" for any status, and
// a caller retrying a clone of a snapshot being deleted waited for what
// never comes. A snapshot still being taken keeps that advice, which is
// true of it. The code stays 409 SnapshotNotReady, as for an export of
// such a snapshot; a read of it by id answers it with its status.
func TestCloneUnavailableSnapshotMessage(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	snap := func(name, status, msg string) *meta.Snapshot {
		sn, err := s.CreateSnapshot(ctx, alice, v.ID, name, "")
		if err != nil {
			t.Fatal(err)
		}
		e.update(func(tx *meta.Tx) error {
			cur, err := tx.Snapshot(sn.ID)
			if err != nil {
				return err
			}
			if status == meta.StatusDeleting {
				// As DeleteSnapshot marks it: the name goes at once.
				tx.ReleaseName(meta.NameSnapshot, cur.OwnerID, cur.Name, cur.ID)
			}
			// Another node's to finish, so nothing here does.
			cur.Status, cur.StatusMessage, cur.Node = status, msg, "some-other-node"
			tx.PutSnapshot(cur)
			return nil
		})
		return sn
	}
	for _, c := range []struct {
		status, msg string
		want        string
	}{
		{meta.StatusDeleting, "", "is being deleted and will not become available again"},
		{meta.StatusError, "freeze failed: disk full", "failed (freeze failed: disk full) and will never become available"},
		{meta.StatusCreating, "", "is still being taken; it can be cloned when it is available"},
	} {
		sn := snap(uniq("s"), c.status, c.msg)
		// What a read by id says of it: its status.
		if got, err := s.Snapshot(ctx, alice, sn.ID); err != nil || got.Status != c.status {
			t.Fatalf("GET snapshot %s: %+v, %v; want status %s", c.status, got, err, c.status)
		}
		_, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn.ID})
		wantCode(t, err, errs.CodeSnapshotNotReady)
		if e, _ := errs.As(err); !strings.Contains(e.Message, c.want) || !strings.Contains(e.Message, sn.ID) {
			t.Errorf("clone of a %s snapshot: %q; want it to say %q", c.status, e.Message, c.want)
		}
	}
}
