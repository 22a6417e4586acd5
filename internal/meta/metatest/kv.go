package metatest

import (
	"context"
	"slices"
	"sync"

	"github.com/basalt-storage/basalt/internal/meta"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// KV stands in for a Store's etcd KV (reads, writes, transactions: what
// the store and the lock package built on its client send): the test can
// stall it as a lost quorum does. While stalled, a call waits until its
// context ends (the error a caller then sees is its own deadline, as when
// no quorum answers) or until the KV is let go again. Watches and lease
// keepalives are not touched.
type KV struct {
	clientv3.KV

	mu   sync.Mutex
	gate chan struct{} // while non-nil, calls wait for it to close
	// lose, while non-nil, picks the key whose next committed write loses
	// its reply (LoseReply).
	lose func(key string) bool
}

// StallableKV puts a KV under m's client. m should be a Store of the
// test's own (Env.Connect): the shared one serves other tests.
func StallableKV(m *meta.Store) *KV {
	cli := m.Client()
	k := &KV{KV: cli.KV}
	cli.KV = k
	return k
}

// Stall makes calls wait from now on, until release is called.
func (k *KV) Stall() (release func()) {
	gate := make(chan struct{})
	k.mu.Lock()
	k.gate = gate
	k.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			k.mu.Lock()
			k.gate = nil
			k.mu.Unlock()
			close(gate)
		})
	}
}

// LoseReply makes the next transaction that commits a write to a key
// match accepts lose its reply: the write is committed, and the caller
// sees etcd's "request timed out" — what it sees when a commit's leader
// changes, or its deadline passes, after the proposal was made. One
// transaction only; a test arms it again for another.
func (k *KV) LoseReply(match func(key string) bool) {
	k.mu.Lock()
	k.lose = match
	k.mu.Unlock()
}

// wait returns when the KV is not stalled, or with ctx's error.
func (k *KV) wait(ctx context.Context) error {
	k.mu.Lock()
	gate := k.gate
	k.mu.Unlock()
	if gate == nil {
		return nil
	}
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Put implements clientv3.KV.
func (k *KV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	if err := k.wait(ctx); err != nil {
		return nil, err
	}
	return k.KV.Put(ctx, key, val, opts...)
}

// Get implements clientv3.KV.
func (k *KV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if err := k.wait(ctx); err != nil {
		return nil, err
	}
	return k.KV.Get(ctx, key, opts...)
}

// Delete implements clientv3.KV.
func (k *KV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	if err := k.wait(ctx); err != nil {
		return nil, err
	}
	return k.KV.Delete(ctx, key, opts...)
}

// Do implements clientv3.KV.
func (k *KV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	if err := k.wait(ctx); err != nil {
		return clientv3.OpResponse{}, err
	}
	return k.KV.Do(ctx, op)
}

// Txn implements clientv3.KV: the transaction waits at Commit.
func (k *KV) Txn(ctx context.Context) clientv3.Txn {
	return &txn{Txn: k.KV.Txn(ctx), k: k, ctx: ctx}
}

type txn struct {
	clientv3.Txn
	k    *KV
	ctx  context.Context
	keys []string // written on success
}

func (t *txn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *txn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		if op.IsPut() || op.IsDelete() {
			t.keys = append(t.keys, string(op.KeyBytes()))
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *txn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *txn) Commit() (*clientv3.TxnResponse, error) {
	if err := t.k.wait(t.ctx); err != nil {
		return nil, err
	}
	resp, err := t.Txn.Commit()
	if err != nil || !resp.Succeeded {
		return resp, err
	}
	t.k.mu.Lock()
	defer t.k.mu.Unlock()
	if t.k.lose != nil && slices.ContainsFunc(t.keys, t.k.lose) {
		t.k.lose = nil
		return nil, rpctypes.ErrTimeout
	}
	return resp, nil
}
