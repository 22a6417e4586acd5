package lock

import (
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// FuzzParseQueue: a queue read back from etcd is whatever the keys hold —
// another build's records, a hand edit. parseQueue accepts only records
// whose mode is one of the three, and the grant rule over what it accepts
// never panics and grants no request with an earlier conflicting one.
func FuzzParseQueue(f *testing.F) {
	f.Add([]byte(`{"mode":"read","owner":"a"}`), []byte(`{"mode":"update","owner":"b"}`), []byte(`{"mode":"read","admitted":true}`), uint8(0))
	f.Add([]byte(`{"mode":"write"}`), []byte(`{"mode":"update","upgraded":true}`), []byte(`{"mode":"read"}`), uint8(3))
	f.Add([]byte(`{"mode":"exclusive"}`), []byte(`{}`), []byte(`null`), uint8(1))
	f.Add([]byte(`{"mode":"read"`), []byte(`[]`), []byte("\xff"), uint8(2))
	f.Fuzz(func(t *testing.T, v0, v1, v2 []byte, order uint8) {
		vals := [][]byte{v0, v1, v2}
		kvs := make([]*mvccpb.KeyValue, len(vals))
		for i, v := range vals {
			// Create revisions in an order the fuzzer picks: etcd's
			// range is by key, the queue is by creation.
			rev := int64((int(order)>>(2*i))&3)*10 + int64(i) + 1
			kvs[i] = &mvccpb.KeyValue{Key: []byte(fmt.Sprintf("q/%d", i)), Value: v, CreateRevision: rev, ModRevision: rev}
		}
		q, err := parseQueue(kvs)
		if err != nil {
			return
		}
		if len(q) != len(vals) {
			t.Fatalf("%d records, %d entries", len(vals), len(q))
		}
		for i := 1; i < len(q); i++ {
			if q[i-1].create > q[i].create {
				t.Fatalf("queue out of creation order: %+v", q)
			}
		}
		for i, e := range q {
			if e.mode != Read && e.mode != Update && e.mode != Write {
				t.Fatalf("entry %s accepted with mode %v", e.key, e.mode)
			}
			v, ok := decide(q, e.key)
			if !ok {
				t.Fatalf("entry %s not found by decide", e.key)
			}
			for _, o := range q[:i] {
				if v.granted && !mCompatible(e.mode, o.mode) {
					t.Fatalf("%s (%v) granted behind %s (%v)", e.key, e.mode, o.key, o.mode)
				}
			}
		}
		_ = describe(q)
	})
}
