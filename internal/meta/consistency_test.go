package meta

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// slowWatcher delays every watch response by delay: a watch that lags
// the commits, as it may by milliseconds on any node.
type slowWatcher struct {
	clientv3.Watcher
	delay time.Duration
}

func (w *slowWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := w.Watcher.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for resp := range in {
			select {
			case <-time.After(w.delay):
			case <-ctx.Done():
				return
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// TestMirrorReadsOwnWrites: a node that has committed a change of a
// mirrored record never serves the record as it was before from its
// mirror (read-your-writes on one node): a bucket deleted through this
// node is not found here afterwards, however late the watch reports it.
func TestMirrorReadsOwnWrites(t *testing.T) {
	openTestStore(t)
	ctx := ctxT(t)
	s := clientStore(t)
	s.cli.Watcher = &slowWatcher{Watcher: s.cli.Watcher, delay: 300 * time.Millisecond}
	m := s.MirrorBuckets(ctx)
	name := uniq("ryw-bucket")
	if err := s.Update(ctx, func(tx *Tx) error { tx.PutBucket(&Bucket{Name: name, Owner: "alice"}); return nil }); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bucket in the mirror", func() bool { _, ok := m.Get(name); return ok })

	if err := s.Update(ctx, func(tx *Tx) error { tx.DeleteBucket(name); return nil }); err != nil {
		t.Fatal(err)
	}
	if b, ok := m.Get(name); ok {
		t.Fatalf("after this node deleted bucket %s, its mirror still serves it: %+v", name, b)
	}
	if err := s.Update(ctx, func(tx *Tx) error { tx.PutBucket(&Bucket{Name: name, Owner: "bob"}); return nil }); err != nil {
		t.Fatal(err)
	}
	if b, ok := m.Get(name); ok && b.Owner != "bob" {
		t.Fatalf("after this node gave bucket %s to bob, its mirror serves owner %s", name, b.Owner)
	}
	// Once the watch has caught up, the mirror answers again.
	eventually(t, "the mirror to catch up", func() bool { b, ok := m.Get(name); return ok && b.Owner == "bob" })
	// Deleting a bucket that does not exist changes nothing: the mirror
	// goes on answering.
	if err := s.Update(ctx, func(tx *Tx) error { tx.DeleteBucket(uniq("never")); return nil }); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Get(name); !ok {
		t.Fatal("deleting an absent bucket made the mirror wait for a change that never comes")
	}
	if err := s.Update(ctx, func(tx *Tx) error { tx.DeleteBucket(name); return nil }); err != nil {
		t.Fatal(err)
	}
}

// twoVoters starts a cluster of two voters and returns their stores:
// stopping either one leaves the other without a quorum.
func twoVoters(t *testing.T, ctx context.Context) (*Store, *Store) {
	t.Helper()
	o := newOpener(t)
	peer1, peer2 := freeAddr(t), freeAddr(t)
	s1, url1 := o.open("m1", peer1, nil, "")
	id2, err := s1.AddLearner(ctx, "https://"+peer2)
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := o.open("m2", peer2, []string{url1}, "m1=https://"+peer1+",m2=https://"+peer2)
	promote(t, ctx, s1, id2)
	for {
		if _, serves, learner := s2.ownMember(); serves && !learner {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("m2 never saw itself promoted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s1, s2
}

// TestQuorumLost: with its quorum lost, a node keeps answering the
// reads it can serve from its own copy — the provisioned-bytes counter
// among them — and fails the calls that need the quorum within the
// write timeout instead of hanging, whatever the caller's context.
func TestQuorumLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s1, s2 := twoVoters(t, ctx)
	id := uniq("vol")
	if err := s1.Update(ctx, func(tx *Tx) error {
		tx.PutVolume(&Volume{ID: id, SizeBytes: 7, Status: StatusAvailable})
		return tx.Provision(7, 1<<40)
	}); err != nil {
		t.Fatal(err)
	}
	want, err := s1.Provisioned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Both members have the write before one of them goes.
	eventually(t, "m2 to apply the write", func() bool {
		r, err := s2.localCopy().Get(ctx, volumeKey(id), clientv3.WithSerializable())
		return err == nil && len(r.Kvs) == 1
	})
	s2.Close()

	// A stale read of a node with its quorum is answered from its copy.
	start := time.Now()
	if _, err := s1.Volume(ctx, id); err != nil {
		t.Fatalf("a read without quorum: %v", err)
	}
	t.Logf("first read without quorum: %v", time.Since(start))

	start = time.Now()
	rctx, ri := WithReadInfo(ctx)
	got, err := s1.Provisioned(rctx)
	if err != nil || got != want {
		t.Fatalf("provisioned bytes without quorum, after %v: %d, %v; want %d from the local copy", time.Since(start), got, err, want)
	}
	if !ri.Local {
		t.Fatal("the provisioned bytes read without quorum are not marked local")
	}

	// The join lock needs the quorum: it fails within the write
	// timeout, also for a caller without a deadline of its own.
	var wg sync.WaitGroup
	wg.Add(1)
	done := make(chan error, 1)
	go func() {
		defer wg.Done()
		done <- s1.WithJoinLock(context.Background(), func() error { return nil })
	}()
	select {
	case err := <-done:
		if !errs.IsCode(err, errs.CodeMetadataUnavailable) {
			t.Fatalf("join lock without quorum: %v, want MetadataUnavailable", err)
		}
	case <-time.After(2 * requestTimeout):
		t.Fatalf("join lock without quorum still waiting after %v", 2*requestTimeout)
	}
	wg.Wait()
}

// TestCarefulSnapshotCompacted: a careful attempt reads at one
// revision; history compacted past it meanwhile (`basalt meta defrag`
// compacts up to the current revision) makes its next read fail. That
// is no verdict on the transaction: it runs again, on a fresh snapshot,
// instead of failing the caller's write.
func TestCarefulSnapshotCompacted(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	a, b := uniq("vol"), uniq("vol")
	runs := 0
	err := runSTM(ctx, s.txnClient(), modeCareful, func(tx *Tx) error {
		runs++
		if _, err := tx.Volume(a); err != nil {
			return err
		}
		if runs == 1 {
			// Another write, then a compaction up to it.
			r, err := s.cli.Put(ctx, Prefix+"test/compact", uniq("x"))
			if err != nil {
				return err
			}
			if _, err := s.cli.Compact(ctx, r.Header.Revision); err != nil {
				return err
			}
		}
		if _, err := tx.Volume(b); err != nil {
			return err
		}
		tx.PutVolume(&Volume{ID: b, Status: StatusAvailable})
		return nil
	})
	if err != nil {
		t.Fatalf("a transaction whose snapshot was compacted away failed after %d runs: %v", runs, err)
	}
	if _, err := s.Volume(ctx, b); err != nil {
		t.Fatal(err)
	}
	cleanupVolume(t, s, b)
	s.cli.Delete(ctx, Prefix+"test/compact")
}

// TestTxReadsHundreds: a transaction commits whatever it read: a
// comparison per key. Attaching a volume reads each of its attachments
// (a read-only volume may have one per compute node), so a transaction
// of a few hundred reads must commit; etcd's default refuses one of more
// than 128 comparisons ("too many operations in txn request").
func TestTxReadsHundreds(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	id := uniq("vol")
	if err := s.Update(ctx, func(tx *Tx) error {
		for i := range 300 {
			if _, err := tx.Attachment(fmt.Sprintf("%s-att-%d", id, i)); err != nil {
				return err
			}
		}
		tx.PutVolume(&Volume{ID: id, Status: StatusInUse})
		return nil
	}); err != nil {
		t.Fatalf("a transaction of 300 reads: %v", err)
	}
	cleanupVolume(t, s, id)
}
