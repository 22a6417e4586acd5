package volume

import (
	"sync"
	"testing"
	"time"
)

// TestCollector: requests from many goroutines are served; a waiter
// returns once the requests made before it ran; a stopped service
// releases its waiters instead of hanging them.
func TestCollector(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.collectSoon()
			s.collected()
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("collection requests not served")
	}
	s.gc.mu.Lock()
	asked, done := s.gc.asked, s.gc.done
	s.gc.mu.Unlock()
	if done < 50 || done > asked {
		t.Fatalf("served %d of %d requests", done, asked)
	}

	s.Stop()
	s.collectSoon()
	stopped := make(chan struct{})
	go func() { s.collected(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("a waiter on a stopped service hangs")
	}
}
