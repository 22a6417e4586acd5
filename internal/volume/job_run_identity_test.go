package volume

import (
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
)

// TestJobRunIsItsOwn: a job run that finds, once it holds the volume's
// write lease, another job recorded for its node — its own was adopted by
// a node that took this one for gone, finished there, and the user asked
// for a new job through this node meanwhile — runs that new job as it was
// asked for, not its own kind under the new job's record, and does not
// record its own outcome over it.
func TestJobRunIsItsOwn(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20, Type: "verified"})
	if err != nil {
		t.Fatal(err)
	}
	e.setJob(v.ID, &meta.Job{Kind: meta.JobScrub, Node: s.cfg.Node, StartedAt: now().Add(-time.Minute)})
	var once sync.Once
	s.leases.keyMade = func(vol string) {
		if vol != v.ID {
			return
		}
		// While this run took the lease: the scrub it read was adopted
		// and finished elsewhere, and a flatten recorded for this node.
		once.Do(func() { e.setJob(v.ID, flattenFor(s.cfg.Node)) })
	}
	s.startJob(v.ID)
	lj := e.waitJob(v.ID).LastJob
	if lj == nil || lj.Kind != meta.JobFlatten || lj.Error != "" {
		t.Fatalf("last job %+v: want the flatten recorded last, run and succeeded (not the scrub recorded before it)", lj)
	}
	cleanupAll(t, s, alice)
}
