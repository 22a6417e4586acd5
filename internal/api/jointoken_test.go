package api

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/basalt-storage/basalt/internal/cluster"
)

// TestRevokeJoinToken: an administrator revokes a join token before it
// expires (one that leaked); it is unusable at once, a second revoke and
// one of a token never issued are 404, and only administrators may.
func TestRevokeJoinToken(t *testing.T) {
	e := newNodeEnv(t, nil)
	_, admin := e.user("root", true)
	_, alice := e.user("alice", false)
	st, _, out := e.do(admin, "POST", "/v1/nodes/join-token", "")
	if st != 201 {
		t.Fatalf("join-token: HTTP %d %s", st, out)
	}
	var tok JoinToken
	if err := json.Unmarshal([]byte(out), &tok); err != nil {
		t.Fatal(err)
	}
	secret, _, err := cluster.ParseJoinToken(tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"token":` + strconv.Quote(tok.Token) + `}`
	if st, code, _ := e.do(alice, "POST", "/v1/nodes/join-token/revoke", body); st != 403 || code != "AdminRequired" {
		t.Errorf("revoke by a user: HTTP %d %s, want 403 AdminRequired", st, code)
	}
	if ok, err := e.meta.JoinTokenValid(context.Background(), secret); err != nil || !ok {
		t.Fatalf("the token before its revocation: valid %v, %v", ok, err)
	}
	if st, _, out := e.do(admin, "POST", "/v1/nodes/join-token/revoke", body); st != 204 {
		t.Fatalf("revoke: HTTP %d %s, want 204", st, out)
	}
	if ok, err := e.meta.JoinTokenValid(context.Background(), secret); err != nil || ok {
		t.Fatalf("the token after its revocation: valid %v, %v", ok, err)
	}
	if st, code, _ := e.do(admin, "POST", "/v1/nodes/join-token/revoke", body); st != 404 || code != "NotFound" {
		t.Errorf("second revoke: HTTP %d %s, want 404 NotFound", st, code)
	}
	for b, want := range map[string]string{
		`{"token":"basalt-join.nope"}`: "InvalidJoinToken",
		`{}`:                           "InvalidRequest",
		`{"token":1}`:                  "MalformedJSON",
	} {
		if _, code, _ := e.do(admin, "POST", "/v1/nodes/join-token/revoke", b); code != want {
			t.Errorf("revoke %s: %s, want %s", b, code, want)
		}
	}
}
