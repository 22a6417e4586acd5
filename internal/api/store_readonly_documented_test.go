package api

import (
	"encoding/json"
	"io/fs"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
)

// storeReadOnly, while set, makes the test layer "testerofs" fail to
// build as a layer over a file system remounted read-only does.
var storeReadOnly atomic.Bool

// erofsLayer passes its child through.
type erofsLayer struct{ block.Layer }

func (l erofsLayer) Children() []block.Layer { return []block.Layer{l.Layer} }

func init() {
	block.Register(block.Type{Name: "testerofs", Doc: "test: fails with EROFS while storeReadOnly is set",
		MinChildren: 1, MaxChildren: 1,
		New: func(env block.Env, _ json.RawMessage, children []block.Layer) (block.Layer, error) {
			if storeReadOnly.Load() {
				return nil, &fs.PathError{Op: "open", Path: env.Dir, Err: syscall.EROFS}
			}
			return erofsLayer{children[0]}, nil
		}})
}

// TestStoreReadOnlyDocumented: the operations that write a volume's
// stack — create, extend, snapshot — answer 503 StoreReadOnly when the
// store's file system is read-only (errs.Public), a code docs/api.md
// says comes "from any operation that writes to the store". None of them
// listed it in openapi.json's x-error-codes nor in docs/api.md's Errors,
// though the description says "each operation lists the codes it can
// return": a client generated from it did not know the code.
func TestStoreReadOnlyDocumented(t *testing.T) {
	t.Cleanup(func() { storeReadOnly.Store(false) })
	e := newNodeEnv(t, nil)
	_, alice := e.user("alice", false)
	_, admin := e.user("root", true)
	typ := uniq("erofs")
	stack := `{"type":"testerofs","children":[{"type":"cow","children":[{"type":"file","params":{"path":"data.img"}}]}]}`
	if st, _, body := e.do(admin, "POST", "/v1/types", `{"name":"`+typ+`","stack":`+stack+`}`); st != 201 {
		t.Fatalf("type create: %d %s", st, body)
	}
	t.Cleanup(func() { e.do(admin, "DELETE", "/v1/types/"+typ, "") })
	if st, _, body := e.do(alice, "POST", "/v1/volumes", `{"name":"db","size":"1MiB","type":"`+typ+`"}`); st != 201 {
		t.Fatalf("create: %d %s", st, body)
	}

	storeReadOnly.Store(true)
	cases := []struct {
		method, pattern, target, body string
	}{
		{"POST", "/v1/volumes/{id}/extend", "/v1/volumes/db/extend", `{"size":"2MiB"}`},
		{"POST", "/v1/snapshots", "/v1/snapshots", `{"volume":"db","name":"nightly"}`},
		{"POST", "/v1/volumes", "/v1/volumes", `{"name":"db2","size":"1MiB","type":"` + typ + `"}`},
	}
	for _, c := range cases {
		st, code, body := e.do(alice, c.method, c.target, c.body)
		if st != 503 || code != errs.CodeStoreReadOnly {
			t.Errorf("%s %s on a read-only store: %d %s %s, want 503 StoreReadOnly", c.method, c.target, st, code, body)
			continue
		}
		op := openapiOp(t, c.method, c.pattern)
		codes, _ := op["x-error-codes"].([]any)
		if !slices.Contains(codes, any(errs.CodeStoreReadOnly)) {
			t.Errorf("%s %s answers StoreReadOnly, which is not among its x-error-codes %v", c.method, c.pattern, codes)
		}
	}
}
