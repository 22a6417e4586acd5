package meta

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
)

// TestJoinLockBusy: a membership change that waits for the join lock
// longer than a request may — another one holds it: a removal retrying
// its steps through an election, a slow join — fails as a join in
// progress (409 JoinInProgress, which a joining node waits out), not as
// the metadata cluster having no quorum (503 MetadataUnavailable,
// "writes resume when a majority of the voters is up"): the quorum
// answers throughout.
func TestJoinLockBusy(t *testing.T) {
	s := openTestStore(t)
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.WithJoinLock(context.Background(), func() error {
			close(held)
			<-release
			return nil
		})
	}()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("the first holder did not get the lock: %v", err)
	}
	var once sync.Once
	finish := func() error {
		var err error
		once.Do(func() { close(release); err = <-done })
		return err
	}
	defer finish()

	start := time.Now()
	ran := false
	err := s.WithJoinLock(context.Background(), func() error { ran = true; return nil })
	if ran {
		t.Fatal("a second holder ran while the first held the lock")
	}
	if !errs.IsCode(err, CodeJoinInProgress) {
		t.Fatalf("waiting %v for a join lock another change holds: %v, want %s", time.Since(start).Round(time.Millisecond), err, CodeJoinInProgress)
	}
	if s.QuorumLost() {
		t.Fatal("a busy join lock recorded the quorum lost")
	}
	// The lock is free again for the next change once its holder is done.
	if err := finish(); err != nil {
		t.Fatalf("the first holder: %v", err)
	}
	if err := s.WithJoinLock(ctxT(t), func() error { return nil }); err != nil {
		t.Fatalf("the join lock once free: %v", err)
	}
}
