package metatest

import (
	"context"
	"strings"
	"sync"

	"github.com/basalt-storage/basalt/internal/meta"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Reads stands in for a Store's etcd KV and records every key etcd
// answers with — in Gets, and in the Gets of transactions — so that a
// test can count the records a call read. Only a Store without a member
// of its own (Env.Connect) reads everything through its client.
type Reads struct {
	clientv3.KV

	mu   sync.Mutex
	keys []string
}

// CountReads puts a Reads under m's client.
func CountReads(m *meta.Store) *Reads {
	cli := m.Client()
	r := &Reads{KV: cli.KV}
	cli.KV = r
	return r
}

// Count returns how many keys under prefix were read since the last
// Reset (a key read twice counts twice).
func (r *Reads) Count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, k := range r.keys {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// Reset forgets the keys read so far.
func (r *Reads) Reset() {
	r.mu.Lock()
	r.keys = nil
	r.mu.Unlock()
}

func (r *Reads) saw(resp *clientv3.GetResponse) {
	if resp == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, kv := range resp.Kvs {
		r.keys = append(r.keys, string(kv.Key))
	}
}

// Get implements clientv3.KV.
func (r *Reads) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := r.KV.Get(ctx, key, opts...)
	r.saw(resp)
	return resp, err
}

// Do implements clientv3.KV.
func (r *Reads) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	resp, err := r.KV.Do(ctx, op)
	r.saw(resp.Get())
	return resp, err
}

// Txn implements clientv3.KV.
func (r *Reads) Txn(ctx context.Context) clientv3.Txn { return &readsTxn{Txn: r.KV.Txn(ctx), r: r} }

type readsTxn struct {
	clientv3.Txn
	r *Reads
}

func (t *readsTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *readsTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *readsTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *readsTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil {
		for _, op := range resp.Responses {
			if rr := op.GetResponseRange(); rr != nil {
				t.r.saw((*clientv3.GetResponse)(rr))
			}
		}
	}
	return resp, err
}
