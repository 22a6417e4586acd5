package api

import (
	"encoding/json"
	"testing"
)

// TestUserDeleteDetaches: deleting a user detaches its attachments — an
// export name is a bearer secret the user knows, and over plain NBD no
// certificate guards it — while its volumes stay, available, for
// administrators, who may attach them again. Before, the attachments
// stayed and the deleted user could go on using the volumes by name.
func TestUserDeleteDetaches(t *testing.T) {
	e := newNodeEnv(t, nil)
	carol, alice := e.user("carol", false)
	_, admin := e.user("adm2", true)
	var v, at struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	for _, c := range []struct {
		target, body string
		out          any
	}{
		{"/v1/volumes", `{"size":"1MiB","name":"vc"}`, &v},
		{"/v1/attachments", `{"volume":"vc","host":"h1","mode":"rw"}`, &at},
	} {
		st, code, b := e.do(alice, "POST", c.target, c.body)
		if st != 201 {
			t.Fatalf("POST %s: %d %s %s", c.target, st, code, b)
		}
		json.Unmarshal([]byte(b), c.out)
	}
	if st, code, b := e.do(admin, "DELETE", "/v1/users/"+carol, ""); st != 204 {
		t.Fatalf("DELETE user: %d %s %s", st, code, b)
	}
	if st, code, _ := e.do(admin, "GET", "/v1/attachments/"+at.ID, ""); st != 404 || code != "NotFound" {
		t.Errorf("the deleted user's attachment: %d %s, want 404 NotFound (detached)", st, code)
	}
	st, code, b := e.do(admin, "GET", "/v1/volumes/"+v.ID, "")
	if st != 200 {
		t.Fatalf("the deleted user's volume: %d %s %s", st, code, b)
	}
	json.Unmarshal([]byte(b), &v)
	if v.Status != "available" {
		t.Errorf("the deleted user's volume is %q, want available (kept, detached)", v.Status)
	}
}
