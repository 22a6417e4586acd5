package volume

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/lock"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
)

// otherNode takes workflow locks as another node would (its own session).
func otherNode(t *testing.T, e *env, name string) *lock.Locker {
	l, err := lock.Open(ctxT(t), e.meta.Client(), meta.LocksPrefix, 10, lock.Options{Owner: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestWorkflowLocks: workflows on one volume or snapshot, started through
// different nodes, take the seed's modes: what conflicts waits, then fails
// with VolumeBusy naming the holder; what is compatible goes on.
func TestWorkflowLocks(t *testing.T) {
	old := lockWait
	lockWait = 300 * time.Millisecond
	t.Cleanup(func() { lockWait = old })
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	other := otherNode(t, e, "node-b")

	// Another node snapshots the volume (update): no second snapshot,
	// no extend, no delete meanwhile — each names the holder.
	h, err := other.Acquire(ctx, "volume/"+v.ID, lock.Update)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateSnapshot(ctx, alice, v.ID, "s", "")
	wantCode(t, err, errs.CodeVolumeBusy)
	if !strings.Contains(err.Error(), "node-b holds update") {
		t.Errorf("the conflict does not name the holder: %v", err)
	}
	_, err = s.ExtendVolume(ctx, alice, v.ID, 2<<20)
	wantCode(t, err, errs.CodeVolumeBusy)
	wantCode(t, s.DeleteVolume(ctx, alice, v.ID), errs.CodeVolumeBusy)
	// A snapshot asked for meanwhile waits, and goes through when it ends.
	done := make(chan error, 1)
	lockWait = 10 * time.Second
	go func() {
		sn, err := s.CreateSnapshot(ctx, alice, v.ID, "s2", "")
		if err == nil && sn.Status != meta.StatusAvailable {
			err = errs.Conflict("x", "snapshot %s", sn.Status)
		}
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("snapshot after the other node's workflow ended: %v", err)
	}
	lockWait = 300 * time.Millisecond

	// Clones read the snapshot: any number at once; a delete (write)
	// waits for them, and they for it.
	sn, err := s.Snapshot(ctx, alice, "s2")
	if err != nil {
		t.Fatal(err)
	}
	r, err := other.Acquire(ctx, "snapshot/"+sn.ID, lock.Read)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "clone", FromSnapshot: sn.ID}); err != nil {
		t.Fatalf("a clone beside another node's reader: %v", err)
	}
	wantCode(t, s.DeleteSnapshot(ctx, alice, sn.ID), errs.CodeVolumeBusy)
	r.Release(ctx)
	w, err := other.Acquire(ctx, "snapshot/"+sn.ID, lock.Write)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateVolume(ctx, alice, CreateVolume{Name: "clone2", FromSnapshot: sn.ID})
	wantCode(t, err, errs.CodeVolumeBusy)
	w.Release(ctx)
	if err := s.DeleteSnapshot(context.Background(), alice, sn.ID); err != nil {
		t.Fatalf("delete after the other node's workflow ended: %v", err)
	}
}

// TestDeleteMeetsWorkflow: a delete that finds another node's workflow on
// the volume waits for it (the write lock), then deletes; a workflow that
// comes after a delete finds the volume gone or going.
func TestDeleteMeetsWorkflow(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	other := otherNode(t, e, "node-b")
	h, err := other.Acquire(ctx, "volume/"+v.ID, lock.Update)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.DeleteVolume(ctx, alice, v.ID) }()
	select {
	case err := <-done:
		t.Fatalf("delete went on while another node held the volume's lock: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if q, err := other.Queue(ctx, "volume/"+v.ID); err != nil || len(q) != 2 || !q[1].Waiting || q[1].Mode != lock.Write {
		t.Fatalf("queue while the delete waits: %v %v", q, err)
	}
	h.Release(ctx)
	if err := <-done; err != nil {
		t.Fatalf("delete after the workflow ended: %v", err)
	}
	if _, err := s.Volume(ctx, alice, v.ID); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("volume after delete: %v", err)
	}
	// Deletes without a workflow in the way leave no lock behind.
	v2, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "v2", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, alice, v2.ID); err != nil {
		t.Fatal(err)
	}
	if q, err := other.Queue(ctx, "volume/"+v2.ID); err != nil || len(q) != 0 {
		t.Fatalf("queue after a plain delete: %v %v", q, err)
	}
	_, err = s.CreateSnapshot(ctx, alice, v2.ID, "late", "")
	wantCode(t, err, errs.CodeNotFound)
}

// TestConcurrentDeletes: of deletes of one volume at once, one succeeds and
// the others answer NotFound; the stacks are gone.
func TestConcurrentDeletes(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	alice := caller("alice")
	for round := range 5 {
		v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "v", SizeBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		const n = 4
		errc := make(chan error, n)
		for range n {
			go func() { errc <- s.DeleteVolume(ctx, alice, v.ID) }()
		}
		ok := 0
		for range n {
			switch err := <-errc; {
			case err == nil:
				ok++
			case !errs.IsCode(err, errs.CodeNotFound):
				t.Fatalf("round %d: delete: %v", round, err)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d of %d concurrent deletes succeeded, want 1", round, ok, n)
		}
	}

	if dirs := e.volumeDirs(); len(dirs) != 0 {
		t.Fatalf("volume directories left: %v", dirs)
	}
	checkProvisioned(t)
}

// TestLostLockRecordsNothing: a workflow whose lock is lost after it was
// granted — its key gone, as when the node's etcd session expires in a
// partition — records nothing: the transaction that would record the
// workflow checks the lock (fencing), and the call fails with
// MetadataUnavailable instead of acting beside a successor.
func TestLostLockRecordsNothing(t *testing.T) {
	ctx := ctxT(t)
	e := newEnv(t)
	s := e.started(Config{})
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "s", "")
	if err != nil {
		t.Fatal(err)
	}

	lose := func(h *lock.Held) {
		if _, err := e.meta.Client().Delete(ctx, h.Key()); err != nil {
			t.Error(err)
		}
	}
	testHookLocked = lose
	t.Cleanup(func() { testHookLocked = nil })

	_, err = s.CreateSnapshot(ctx, alice, v.ID, "s2", "")
	wantCode(t, err, errs.CodeMetadataUnavailable)
	_, err = s.ExtendVolume(ctx, alice, v.ID, 2<<20)
	wantCode(t, err, errs.CodeMetadataUnavailable)
	_, err = s.StartJob(ctx, alice, v.ID, meta.JobFlatten)
	wantCode(t, err, errs.CodeMetadataUnavailable)
	_, err = s.CreateVolume(ctx, alice, CreateVolume{Name: "clone", FromSnapshot: sn.ID})
	wantCode(t, err, errs.CodeMetadataUnavailable)
	wantCode(t, s.DeleteSnapshot(ctx, alice, sn.ID), errs.CodeMetadataUnavailable)

	testHookLocked = nil
	cur, err := s.Volume(ctx, alice, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if cur.SizeBytes != 1<<20 || cur.Status != meta.StatusAvailable || cur.Job != nil || len(cur.Snapshotting) > 0 {
		t.Errorf("a workflow without its lock changed the volume: size %d, status %s, job %v, snapshotting %v",
			cur.SizeBytes, cur.Status, cur.Job, cur.Snapshotting)
	}
	if _, err := s.Snapshot(ctx, alice, "s2"); !errs.IsCode(err, errs.CodeNotFound) {
		t.Errorf("snapshot s2 recorded without its lock: %v", err)
	}
	if _, err := s.Volume(ctx, alice, "clone"); !errs.IsCode(err, errs.CodeNotFound) {
		t.Errorf("clone recorded without its lock: %v", err)
	}
	if got, err := s.Snapshot(ctx, alice, sn.ID); err != nil || got.Status != meta.StatusAvailable {
		t.Errorf("snapshot after a delete without its lock: %v, %v", got, err)
	}
	// With its lock held, the same calls go through.
	if _, err := s.CreateSnapshot(ctx, alice, v.ID, "s2", ""); err != nil {
		t.Fatalf("snapshot with its lock: %v", err)
	}
}

// stallableEnv is an env whose service talks to etcd over a connection of
// its own whose KV the test can stall (a lost quorum, as this node sees
// it), while other (the lock holder, another node) keeps the shared one.
func stallableEnv(t *testing.T) (e *env, s *Service, kv *metatest.KV, other *lock.Locker) {
	e = newEnv(t)
	other = otherNode(t, e, "node-b")
	e.meta = metatest.Shared(t).Connect(t)
	kv = metatest.StallableKV(e.meta)
	return e, e.started(Config{}), kv, other
}

// waitQueued waits until n requests are in resource's queue.
func waitQueued(t *testing.T, l *lock.Locker, resource string, n int) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		q, err := l.Queue(ctxT(t), resource)
		if err == nil && len(q) >= n {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("queue of %s: %v, %v; want %d requests", resource, q, err, n)
		}
	}
}

// extendBehindOther starts an extend of a new volume that waits for node-b,
// which holds the volume's lock, on a store the test can stall; it returns
// once the extend is queued, with the volume, when the extend started and
// where its error goes.
func extendBehindOther(t *testing.T) (e *env, kv *metatest.KV, vol string, start time.Time, done <-chan error) {
	ctx := ctxT(t)
	e, s, kv, other := stallableEnv(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	h, err := other.Acquire(ctx, "volume/"+v.ID, lock.Update)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Release(ctx) })
	start = time.Now()
	ch := make(chan error, 1)
	go func() {
		_, err := s.ExtendVolume(ctx, alice, v.ID, 2<<20)
		ch <- err
	}()
	waitQueued(t, other, "volume/"+v.ID, 2)
	return e, kv, v.ID, start, ch
}

// TestLockWaitEndsWhenQuorumLost: a workflow waiting for another node's
// workflow stops waiting soon after this node learns that no quorum of the
// metadata cluster answers — here from another request — and says so
// (503 MetadataUnavailable), instead of waiting out lockWait and then
// calling the volume busy.
func TestLockWaitEndsWhenQuorumLost(t *testing.T) {
	ctx := ctxT(t)
	e, kv, vol, _, done := extendBehindOther(t)
	release := kv.Stall()
	t.Cleanup(release)
	// Another request through this node finds no quorum: its linearizable
	// read gives up and the store records the quorum lost. (The read then
	// waits on, for the local copy, which is behind the same stalled
	// connection: it ends with the test's context.)
	go e.meta.Volume(ctx, vol)
	for !e.meta.QuorumLost() {
		if ctx.Err() != nil {
			t.Fatal("the store never found its quorum lost")
		}
		time.Sleep(10 * time.Millisecond)
	}
	lost := time.Now()
	select {
	case err := <-done:
		t.Logf("the wait ended %v after the quorum was found lost: %v", time.Since(lost), err)
		wantCode(t, err, errs.CodeMetadataUnavailable)
		if !strings.Contains(err.Error(), "quorum") {
			t.Errorf("the error does not say that no quorum answers: %v", err)
		}
	case <-time.After(2 * time.Second):
		release()
		err := <-done
		t.Fatalf("the lock wait went on for %v after the quorum was found lost; it ended %v later with %v",
			2*time.Second, time.Since(lost)-2*time.Second, err)
	}
}

// TestLockBusyWithoutQuorum: a lock wait that times out while etcd does not
// answer (nobody on this node has noticed yet) does not call the volume
// busy with an empty list of holders, nor wait without end for that list:
// the read of the queue is bounded and its failure is a 503
// MetadataUnavailable, which the store remembers for the next requests.
func TestLockBusyWithoutQuorum(t *testing.T) {
	old := lockWait
	lockWait = 2 * time.Second
	t.Cleanup(func() { lockWait = old })
	e, kv, _, start, done := extendBehindOther(t)
	release := kv.Stall()
	t.Cleanup(release)
	limit := lockWait + queueTimeout + time.Second
	select {
	case err := <-done:
		t.Logf("the request ended after %v: %v", time.Since(start), err)
		wantCode(t, err, errs.CodeMetadataUnavailable)
	case <-time.After(limit - time.Since(start)):
		release()
		err := <-done
		t.Fatalf("the request was still waiting after %v; it ended %v later with %v", limit, time.Since(start)-limit, err)
	}
	if !e.meta.QuorumLost() {
		t.Error("after a read of the lock queue found no quorum, the store does not know it")
	}
}
