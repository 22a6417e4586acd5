package cluster

import (
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// FuzzParseJoinToken: any string is either a well-formed token, whose parts
// round-trip, or an InvalidJoinToken error; nothing panics.
func FuzzParseJoinToken(f *testing.F) {
	f.Add("basalt-join." + strings.Repeat("a", 48) + "." + strings.Repeat("0", 64))
	f.Add("basalt-join..")
	f.Add("")
	f.Add("basalt-join.x.y.z")
	f.Fuzz(func(t *testing.T, tok string) {
		secret, hash, err := ParseJoinToken(tok)
		if err != nil {
			if !errs.IsCode(err, CodeJoinTokenBad) {
				t.Fatalf("error %v is not %s", err, CodeJoinTokenBad)
			}
			return
		}
		if "basalt-join."+secret+"."+hash != tok {
			t.Fatalf("parts %q %q do not make %q", secret, hash, tok)
		}
	})
}

func TestCAHash(t *testing.T) {
	if CAHash([]byte("not a certificate")) != "" {
		t.Fatal("a hash for a non-certificate")
	}
}

func TestInitialCluster(t *testing.T) {
	members := []meta.Member{
		{ID: 1, Name: "a", Peers: []string{"https://a:2380"}},
		{ID: 2, Name: "", Peers: []string{"https://new:2380"}, Learner: true}, // the joining node, added just now
		{ID: 3, Name: "", Peers: []string{"https://other:2380"}, Learner: true},
	}
	got := initialCluster(members, JoinRequest{Name: "new", Peer: "https://new:2380"})
	if want := "a=https://a:2380,new=https://new:2380"; got != want {
		t.Fatalf("initial cluster %q, want %q", got, want)
	}
}

func TestCheckRequest(t *testing.T) {
	ok := JoinRequest{Name: "n2", Peer: "https://h:2380", Client: "https://h:2379", API: "https://h:8443"}
	if err := checkRequest(ok); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []JoinRequest{
		{Name: "", Peer: ok.Peer, Client: ok.Client, API: ok.API},
		{Name: "a,b", Peer: ok.Peer, Client: ok.Client, API: ok.API},
		{Name: "a=b", Peer: ok.Peer, Client: ok.Client, API: ok.API},
		{Name: "n", Peer: "http://h:2380", Client: ok.Client, API: ok.API},
		{Name: "n", Peer: ok.Peer, Client: ok.Client, API: ""},
	} {
		if err := checkRequest(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
