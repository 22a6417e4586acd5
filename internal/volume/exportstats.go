package volume

import (
	"sort"
	"time"

	"github.com/basalt-storage/basalt/internal/nbd"
)

// Per-volume NBD counts, for the node's metrics: while counting is on
// (CountRequests), every export Open returns counts into its volume's
// nbd.Stats, shared by all of that volume's connections here. A volume's
// Stats outlives its last connection by statsIdle, so that a scraper sees
// what a short-lived client (a copy, a qemu-img run) did; opened again
// meanwhile, the volume goes on counting from where it was.

// statsIdle is how long a volume's counts stay after its last export here
// closed: a few scrape intervals.
const statsIdle = 15 * time.Minute

// volumeStats is one volume's counts, how many open exports share them,
// and since when none has (refs 0).
type volumeStats struct {
	stats *nbd.Stats
	refs  int
	idle  time.Time
}

// CountRequests turns per-volume request counting on, for exports opened
// from now on. Call it before serving.
func (e *Exports) CountRequests() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stats == nil {
		e.stats = map[string]*volumeStats{}
	}
}

// holdStats returns volume vol's counts (nil while counting is off) and
// the function that lets them go.
func (e *Exports) holdStats(vol string) (*nbd.Stats, func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stats == nil {
		return nil, func() {}
	}
	vs := e.stats[vol]
	if vs == nil {
		vs = &volumeStats{stats: &nbd.Stats{}}
		e.stats[vol] = vs
	}
	vs.refs++
	return vs.stats, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if vs.refs--; vs.refs == 0 {
			vs.idle = time.Now()
		}
	}
}

// EachStats calls fn, in volume order, with the counts of every volume
// open here or closed less than statsIdle ago, and whether it is open;
// it forgets the others.
func (e *Exports) EachStats(fn func(vol string, st *nbd.Stats, open bool)) {
	type entry struct {
		vol  string
		st   *nbd.Stats
		open bool
	}
	e.mu.Lock()
	entries := make([]entry, 0, len(e.stats))
	for v, vs := range e.stats {
		if vs.refs == 0 && time.Since(vs.idle) > statsIdle {
			delete(e.stats, v)
			continue
		}
		entries = append(entries, entry{v, vs.stats, vs.refs > 0})
	}
	e.mu.Unlock()
	sort.Slice(entries, func(i, j int) bool { return entries[i].vol < entries[j].vol })
	for _, en := range entries {
		fn(en.vol, en.st, en.open)
	}
}
