package volume

// Legs that come back. A mirror or parity leg whose backing file could not
// be opened (moved aside, on a file system not mounted yet) or vanished
// while open stays failed until a repair (mirror's invariant 3: a leg that
// missed writes must never be read as current). An operator who puts the
// file back expects the volume to heal without being asked — "the leg's
// return" — so every node looks at the failed legs of the stacks it has
// open, every legProbeEvery, and starts the volume's repair job (the
// job `volume repair` starts, which copies only what the leg missed) when
// a failed leg's backing file exists:
//
//   - the first time it is seen so after the stack was opened (a leg that
//     came back while the node was down, or one a restart found failed);
//   - and again each time it had been seen missing since the last repair.
//
// So a leg whose file stays in place but fails with I/O errors is retried
// once per open of its stack, not in a loop: a disk that keeps failing is
// for the operator to replace. A volume nobody uses has no open stack; its
// returned leg is repaired when the volume is next opened.

import (
	"os"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// legProbeEvery is how often the failed legs of open stacks are looked at
// (a variable for tests).
var legProbeEvery = 10 * time.Second

// systemCaller is who starts the repairs of returned legs.
var systemCaller = Caller{Name: "basalt", Admin: true}

// legSeen is what the probe knows of one failed leg's backing file.
type legSeen struct {
	tried   bool // a repair was started for it since the stack was opened
	missing bool // seen missing since then
}

// runLegProbe looks at failed legs until the service stops.
func (s *Service) runLegProbe() {
	t := time.NewTicker(legProbeEvery)
	defer t.Stop()
	seen := map[*liveStack]map[string]*legSeen{} // by open stack: a reopened stack starts afresh
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.liveMu.Lock()
		open := make(map[string]*liveStack, len(s.live))
		for id, ls := range s.live {
			ls.refs++ // held while described; released below
			open[id] = ls
		}
		s.liveMu.Unlock()
		next := make(map[*liveStack]map[string]*legSeen, len(open))
		for id, ls := range open {
			legs := seen[ls]
			if legs == nil {
				legs = map[string]*legSeen{}
			}
			next[ls] = legs
			back := returnedLegs(ls.l.Describe(), legs)
			s.releaseLive(id, ls)
			if len(back) > 0 {
				s.repairReturned(id, back, legs)
			}
		}
		seen = next
	}
}

// returnedLegs updates legs from the failed file legs in the tree n and
// returns the paths of those whose backing file is back.
func returnedLegs(n block.Node, legs map[string]*legSeen) []string {
	var back []string
	var walk func(block.Node)
	walk = func(n block.Node) {
		if n.State == block.StateFailed && n.Path != "" {
			l := legs[n.Path]
			if l == nil {
				l = &legSeen{}
				legs[n.Path] = l
			}
			if _, err := os.Stat(n.Path); err != nil {
				l.missing = true
			} else if !l.tried || l.missing {
				back = append(back, n.Path)
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(n)
	return back
}

// repairReturned starts volume id's repair job for its legs back (paths);
// if the volume is busy (a job already runs, another workflow holds its
// lock), the next probe tries again.
func (s *Service) repairReturned(id string, back []string, legs map[string]*legSeen) {
	log := s.logFor("volume", id)
	if _, err := s.StartJob(s.ctx, systemCaller, id, meta.JobRepair); err != nil {
		if errs.IsCode(err, errs.CodeVolumeBusy) || s.ctx.Err() != nil {
			log.Debug("returned leg: repair postponed", "legs", back, "err", err)
		} else {
			log.Warn("returned leg: cannot start a repair", "legs", back, "err", err)
		}
		return
	}
	for _, p := range back {
		legs[p].tried, legs[p].missing = true, false
	}
	log.Info("failed legs' backing files are back; repair started", "legs", back)
}
