package store

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestConcurrentCheck: every node checks the one shared store (a
// status request each), and so do concurrent requests on one node: no
// check fails because another one's probe file came and went under it,
// and none leaves a probe behind.
func TestConcurrentCheck(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const checkers, each = 8, 200
	var wg sync.WaitGroup
	errc := make(chan error, checkers)
	for range checkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := s.Check(); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("a check of a healthy store failed: %v", err)
	}
	left, err := os.ReadDir(filepath.Join(s.Root, "tmp"))
	if err != nil || len(left) != 0 {
		t.Fatalf("tmp after the checks: %v, %v", left, err)
	}
}
