package meta

import (
	"context"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestJoinTokenExpiryOutlivesLease: a join token whose key is still there
// after its expiry — etcd restarts every lease's TTL at a leader change
// or a restart, so the key of a 1 h token issued before an election lives
// on for another hour after it — is refused: the expiry the token was
// issued with decides, not the lease. Revoking it reports it expired.
func TestJoinTokenExpiryOutlivesLease(t *testing.T) {
	s := openTestStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	token := "expiry-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := s.PutJoinToken(ctx, token, time.Hour); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.JoinTokenValid(ctx, token); err != nil || !ok {
		t.Fatalf("a token just issued: valid %v, %v", ok, err)
	}
	// What a leader change leaves: the key, on its renewed lease, past
	// the expiry it was issued with.
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	if _, err := s.cli.Put(ctx, prefixJoinTokens+tokenHash(token), past, clientv3.WithIgnoreLease()); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.JoinTokenValid(ctx, token); err != nil || ok {
		t.Fatalf("a token past its expiry whose key a renewed lease kept: valid %v, %v; want refused", ok, err)
	}
	if found, err := s.RevokeJoinToken(ctx, token); err != nil || found {
		t.Fatalf("revoking a token past its expiry: found %v, %v; want not found (expired)", found, err)
	}
}

func TestJoinTokenLive(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		value string
		want  bool
	}{
		{now.Add(time.Second).Format(time.RFC3339), true},
		{now.Format(time.RFC3339), false},
		{now.Add(-time.Hour).Format(time.RFC3339), false},
		{"", false},
		{"not a time", false},
	} {
		if got := joinTokenLive([]byte(c.value), now); got != c.want {
			t.Errorf("joinTokenLive(%q) = %v, want %v", c.value, got, c.want)
		}
	}
}
