package throttle

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// Reads tried without waiting (as the NBD server's readers try every
// read), beside reads that wait, keep to the limits together, whether the
// child answers the tries or not; and tries the child refused leave no
// debt for the waiting reads. Before, the tokens a try reserved and gave
// back wound the limiter's clock back under contention: up to 6 times
// the rate went through, or the waiting reads were still waiting minutes
// later. Only upper bounds are checked (a slow machine reads less).
func TestConcurrentTriesKeepTheLimits(t *testing.T) {
	for _, c := range []struct {
		name, params string
		rate, burst  float64 // in reads of 4 KiB
		answers      bool
	}{
		{"iops, child refuses", `{"iops":1000}`, 1000, 1000, false},
		{"iops, child answers", `{"iops":1000}`, 1000, 1000, true},
		{"bps, child refuses", `{"bps":4194304}`, 1024, 256, false},
		{"bps, child answers", `{"bps":4194304}`, 1024, 256, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var child block.Layer = notNow{plainFile(t)}
			if c.answers {
				child = cachedFile(t)
			}
			l := throttle(t, c.params, child)
			start := time.Now()
			deadline := start.Add(time.Second)
			var reads, tries atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					p := make([]byte, 4096)
					for time.Now().Before(deadline) {
						if l.TryReadAt(p, 0) && time.Now().Before(deadline) {
							tries.Add(1)
						}
					}
				})
				wg.Go(func() {
					p := make([]byte, 4096)
					for time.Now().Before(deadline) {
						if l.ReadAt(p, 0) != nil {
							return
						}
						if time.Now().Before(deadline) {
							reads.Add(1)
						}
					}
				})
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(time.Until(deadline) + 2*time.Second):
				l.Close() // ends the waits
				<-done
				t.Errorf("reads still wait 2 s after the tries stopped: the tries left the limiter owing tokens")
			}
			elapsed := deadline.Sub(start).Seconds()
			if got, allowed := float64(reads.Load()+tries.Load()), c.burst+c.rate*elapsed; got > allowed*1.05 {
				t.Errorf("%d reads waited and %d were answered at once in %.1f s: want at most %.0f in all",
					reads.Load(), tries.Load(), elapsed, allowed)
			}
		})
	}
}
