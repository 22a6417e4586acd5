package meta

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// stalledGets makes every Get wait until gate closes or its context ends,
// as linearizable reads do while no quorum answers.
type stalledGets struct {
	clientv3.KV
	gate chan struct{}
}

func (k *stalledGets) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	select {
	case <-k.gate:
		return k.KV.Get(ctx, key, opts...)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestNoQuorum: an error of a call on the raw client records the quorum
// lost when it says that etcd did not answer while the caller still
// waited, and only then; the probe clears it when etcd answers again.
func TestNoQuorum(t *testing.T) {
	openTestStore(t)
	ctx := ctxT(t)
	// A store of its own: the flag changes how the shared one answers.
	s := clientStore(t)
	kv := &stalledGets{KV: s.cli.KV, gate: make(chan struct{})}
	s.cli.KV = kv

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	for _, c := range []struct {
		what string
		ctx  context.Context
		err  error
	}{
		{"no error", ctx, nil},
		{"an error that is etcd's answer", ctx, errors.New(`lock "volume/v": request key k already exists`)},
		{"the caller's own end", canceled, context.Canceled},
		{"a deadline the caller's context ran into", canceled, context.DeadlineExceeded},
	} {
		if s.NoQuorum(c.ctx, c.err) || s.QuorumLost() {
			t.Fatalf("%s (%v) counts as no quorum", c.what, c.err)
		}
	}

	gctx, gcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := s.Client().Get(gctx, keyCluster)
	gcancel()
	if !s.NoQuorum(ctx, err) {
		t.Fatalf("a read that etcd did not answer in time (%v) does not count as no quorum", err)
	}
	// The probe finds no quorum either: the flag stays.
	time.Sleep(1500 * time.Millisecond)
	if !s.QuorumLost() {
		t.Fatal("the quorum lost is not recorded, or cleared while etcd does not answer")
	}
	close(kv.gate)
	eventually(t, "the probe to find the quorum back", func() bool { return !s.QuorumLost() })
}

// stalledLinearGets makes every linearizable Get of key wait until its
// context ends, as a leader too loaded to answer some requests in time
// does; other Gets, and serializable ones (the member's own copy), are
// answered.
type stalledLinearGets struct {
	clientv3.KV
	key string
}

func (k stalledLinearGets) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if key != k.key || clientv3.OpGet(key, opts...).IsSerializable() {
		return k.KV.Get(ctx, key, opts...)
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestSlowIsNotLost: a voter whose linearizable read times out while it
// follows a leader and other requests go through is slow, not without
// quorum: the read is answered from its copy, but the node does not record
// the quorum lost, which would turn every other request here stale
// (reads) or short (writes, locks) until a probe cleared it — under a
// burst of load that once marked a healthy single node's quorum lost four
// times. The same timeout with nothing else going through (a member whose
// disk hangs keeps its leader known) counts as no quorum.
func TestSlowIsNotLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, _ := newOpener(t).open("m1", freeAddr(t), nil, "")
	slow, other := uniq("vol"), uniq("vol")
	for _, id := range []string{slow, other} {
		if err := s.Update(ctx, func(tx *Tx) error {
			tx.PutVolume(&Volume{ID: id, SizeBytes: 7, Status: StatusAvailable})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	m, _, _ := s.ownMember()
	m.local.KV = stalledLinearGets{m.local.KV, volumeKey(slow)}

	// Others' reads go through meanwhile.
	busy, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for busy.Err() == nil {
			s.Volume(busy, other)
			time.Sleep(100 * time.Millisecond)
		}
	}()
	_, err := s.Volume(ctx, slow)
	stop()
	<-done
	if err != nil {
		t.Fatalf("a read the leader does not answer in time: %v", err)
	}
	if s.QuorumLost() {
		t.Fatal("a read that timed out while this voter follows a leader and other reads go through recorded the quorum lost")
	}

	// Nothing else goes through for longer than a read waits.
	time.Sleep(linearTimeout)
	if _, err := s.Volume(ctx, slow); err != nil {
		t.Fatalf("the read again: %v", err)
	}
	if !s.QuorumLost() && !s.NoQuorum(ctx, context.DeadlineExceeded) {
		t.Fatal("a read that timed out while nothing else went through did not count as no quorum")
	}
}
