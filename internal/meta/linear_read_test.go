package meta

import (
	"context"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
)

// TestLinearReadNeverLocal: a read whose context is marked Linear and
// that the quorum does not answer fails (503 MetadataUnavailable) instead
// of being answered from this node's copy, as an unmarked read is — the
// join lock's reads decide membership changes on it. An unmarked read of
// the same key is still answered, from the copy.
func TestLinearReadNeverLocal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, _ := newOpener(t).open("m1", freeAddr(t), nil, "")
	id := uniq("vol")
	if err := s.Update(ctx, func(tx *Tx) error {
		tx.PutVolume(&Volume{ID: id, SizeBytes: 7, Status: StatusAvailable})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	m, _, _ := s.ownMember()
	m.local.KV = stalledLinearGets{m.local.KV, volumeKey(id)}

	lctx, lcancel := context.WithTimeout(Linear(ctx), 2*time.Second)
	rctx, ri := WithReadInfo(lctx)
	v, err := s.Volume(rctx, id)
	lcancel()
	if err == nil || ri.Local {
		t.Fatalf("a Linear read the quorum did not answer: %+v (local %v), %v; want an error", v, ri.Local, err)
	}
	if !errs.IsCode(err, errs.CodeMetadataUnavailable) {
		t.Errorf("a Linear read the quorum did not answer: %v, want MetadataUnavailable", err)
	}

	rctx, ri = WithReadInfo(ctx)
	if _, err := s.Volume(rctx, id); err != nil || !ri.Local {
		t.Fatalf("an unmarked read of the same key: local %v, %v; want an answer from the copy", ri.Local, err)
	}
}
