package cluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/pki"
)

// TestJoinPeerOfAnotherMember: a node of another name whose
// advertised etcd peer URL is a running member's (two hosts left at the
// default --etcd-peer 127.0.0.1:2380, say) is not that member asking
// again: it must be refused, not told it is a voter under that member's
// identity.
func TestJoinPeerOfAnotherMember(t *testing.T) {
	s := joinService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	members, err := s.meta.Members(ctx)
	if err != nil || len(members) == 0 || members[0].Name == "" {
		t.Fatalf("members: %+v %v", members, err)
	}
	name := "intruder-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	req := joinRequest(name, "intruder.example")
	req.Peer = members[0].Peers[0]
	resp, err := s.Join(ctx, req)
	if !errs.IsCode(err, CodeNodeExists) {
		role := ""
		if resp != nil {
			role = resp.Role
		}
		t.Fatalf("join of %s with member %s's peer URL %s: role %q, %v; want %s", name, members[0].Name, req.Peer, role, err, CodeNodeExists)
	}
	if _, err := s.meta.Node(ctx, name); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("the refused node was registered: %v", err)
	}
}

// TestStepUpPeerOfAnotherMember: a client node whose etcd peer URL
// is a running member's must not step up as that member (it would start
// a member under the other's identity, and StepDown would leave its
// record naming the other's URLs); nor may it claim the learner added
// for another node that has not started yet.
func TestStepUpPeerOfAnotherMember(t *testing.T) {
	e, s, ctx := bootstrapped(t, "step-up-peer")
	members, err := e.Meta.Members(ctx)
	if err != nil || len(members) != 1 {
		t.Fatalf("members: %+v %v", members, err)
	}
	a, b := joinRequest("a", "a.example"), joinRequest("b", "b.example")
	a.Peer = members[0].Peers[0]
	for _, r := range []JoinRequest{a, b} {
		if err := e.Meta.PutNode(ctx, nodeRecord(r, meta.RoleClient)); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := s.StepUp(ctx, a); !errs.IsCode(err, CodeNodeExists) {
		t.Fatalf("a steps up with member %s's peer URL: %+v %v, want %s", members[0].Name, resp, err, CodeNodeExists)
	}
	// b's learner is added; c, given b's peer URL, cannot take it over.
	if resp, err := s.StepUp(ctx, b); err != nil || resp == nil {
		t.Fatalf("b steps up: %+v %v", resp, err)
	}
	c := joinRequest("c", "c.example")
	c.Peer = b.Peer
	if err := e.Meta.PutNode(ctx, nodeRecord(c, meta.RoleClient)); err != nil {
		t.Fatal(err)
	}
	if resp, err := s.StepUp(ctx, c); !errs.IsCode(err, CodeNodeExists) {
		t.Fatalf("c steps up with b's peer URL: %+v %v, want %s", resp, err, CodeNodeExists)
	}
	if resp, err := s.StepUp(ctx, b); err != nil || resp == nil {
		t.Fatalf("b asking again: %+v %v", resp, err)
	}
}

// TestJoinTokenNegativeTTL: a join token asked for with a negative
// TTL (`basalt node join-token --ttl -1h`) is refused like one too short,
// not issued with the 24 h default — longer-lived than any TTL asked for.
func TestJoinTokenNegativeTTL(t *testing.T) {
	s := joinService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tok, exp, err := s.NewJoinToken(ctx, -time.Hour)
	if !errs.IsCode(err, errs.CodeInvalidRequest) {
		t.Fatalf("join token with ttl -1h: %q valid until %v, %v; want %s", tok, exp, err, errs.CodeInvalidRequest)
	}
}

// TestEnterTrustsOnlyTheTokensCA: with a join token, the joining
// node trusts the CA the token's hash names — that certificate only. A
// node (or someone in between) that serves the real CA followed by a CA
// of its own must not get the join (and with it the token, sent as a
// bearer secret) over TLS made with that other CA.
func TestEnterTrustsOnlyTheTokensCA(t *testing.T) {
	real, err := pki.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	evil, err := pki.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := evil.ServerCertificate(t.TempDir(), []string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	var leaked atomic.Value
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/cluster/ca", func(w http.ResponseWriter, r *http.Request) {
		w.Write(append(append([]byte{}, real.CertPEM...), evil.CertPEM...))
	})
	mux.HandleFunc("POST /v1/nodes/join", func(w http.ResponseWriter, r *http.Request) {
		leaked.Store(r.Header.Get("Authorization"))
		json.NewEncoder(w).Encode(JoinResponse{ClusterID: "impostor", Role: meta.RoleClient})
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()

	token := "basalt-join." + strings.Repeat("a", 48) + "." + CAHash(real.CertPEM)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := Enter(ctx, EnterParams{Via: srv.URL, Token: token, Request: joinRequest("n", "n.example")})
	if err == nil || leaked.Load() != nil {
		t.Fatalf("joined %+v through a server whose certificate the token's CA did not sign (token sent: %v)", resp, leaked.Load())
	}
}
