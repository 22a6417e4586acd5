package meta

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestRemovalEndpointsSkipLearners: after a voter's removal, the client
// of the node that removed it, and the client of the removed node whose
// member stopped, are pointed at the members left that serve — voters,
// never a learner catching up (a join in progress), as etcd's own
// endpoint sync does. A learner refuses every write, watch and
// linearizable read (the client sends them again elsewhere, a round
// trip later), and answers serializable reads — the careful
// transactions' later reads, a client node's reads while the quorum is
// lost — from a copy that may lag far behind.
func TestRemovalEndpointsSkipLearners(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	o := newOpener(t)
	peer1, peer2, peer3 := freeAddr(t), freeAddr(t), freeAddr(t)
	s1, url1 := o.open("m1", peer1, nil, "")

	// m3: a second voter, to be removed.
	id3, err := s1.AddLearner(ctx, "https://"+peer3)
	if err != nil {
		t.Fatal(err)
	}
	s3, _ := o.open("m3", peer3, []string{url1}, "m1=https://"+peer1+",m3=https://"+peer3)
	promote(t, ctx, s1, id3)
	for {
		if _, serves, learner := s3.ownMember(); serves && !learner {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("m3 never saw itself promoted")
		}
		time.Sleep(50 * time.Millisecond)
	}

	// m2: a learner that has started, not promoted (a node joining).
	// (etcd adds a member only once every voter is connected.)
	for {
		_, err := s1.AddLearner(ctx, "https://"+peer2)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("add learner m2: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	_, url2 := o.open("m2", peer2, []string{url1},
		"m1=https://"+peer1+",m3=https://"+peer3+",m2=https://"+peer2)
	for {
		ms, err := s1.Members(ctx)
		if err == nil && slices.ContainsFunc(ms, func(m Member) bool {
			return m.Learner && m.Name == "m2" && slices.Contains(m.Clients, url2)
		}) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the learner m2 never published its client URL: %+v, %v", ms, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// etcd removes a voter only once the others have been connected to
	// it for 5 s (its strict reconfiguration check).
	for {
		err := s1.RemoveMember(ctx, id3)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("remove m3: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if eps := s1.cli.Endpoints(); slices.Contains(eps, url2) || !slices.Contains(eps, url1) {
		t.Fatalf("after the removal, m1's client endpoints are %v: want the voter %s, not the learner %s", eps, url1, url2)
	}
	select {
	case <-s3.MemberStopped():
	case <-ctx.Done():
		t.Fatal("m3's member did not stop after its removal")
	}
	if eps := s3.cli.Endpoints(); slices.Contains(eps, url2) || !slices.Contains(eps, url1) {
		t.Fatalf("after its member stopped, m3's client endpoints are %v: want the voter %s, not the learner %s", eps, url1, url2)
	}
}
