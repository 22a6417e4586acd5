package lock

// The exhaustive test: a model check of the real, etcd-backed service with
// three clients on one resource. It explores every state reachable by any
// sequence of operations, breadth first, and checks every transition
// against the model (harness.do compares the outcome, every client's state,
// the etcd queue and liveness after each step).
//
// A state is what decides all future behaviour: the etcd queue (owner, mode,
// admitted and upgraded flags of each key, in create order), each client's
// position (idle, waiting with the entry it watches and whether that entry
// changed, holding in a mode, upgrading with the readers it waits for) and
// the model's queue. Revisions themselves do not matter, only their order,
// which the queue order records. Clients are interchangeable, so a state is
// named by the least of its renderings over the client permutations. A
// transition into a state already seen is checked but not explored again;
// the search ends when no new state appears, so it covers sequences of any
// length, not only of a bounded one.
//
// The operations offered in a state: to a waiter, cancel, and poll if the
// key it watches has changed (what wakes the real loop: polls are where
// interleavings happen, e.g. an upgrade between a reader's wake-up and its
// look at the queue); to a reader that looked and must record its
// admission, admit (an upgrade may come in between) and cancel; to a
// holder, release, and to an update holder upgrade and try-upgrade; to an
// upgrader, poll as a waiter, cancel and kill; to one idle client (idle
// clients are interchangeable), acquire and try in each mode. Killing a
// waiter or holder deletes its key as cancel and release do (the scripts
// and TestSessionDeath show the lease doing it), so it is left out here.
//
// etcd state cannot be forked, so each transition replays the state's
// (shortest) path on a fresh resource, checking outcomes on the way.

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestExhaustive(t *testing.T) {
	const clients = 3
	// The work is mostly waiting for etcd round trips (fsync included):
	// more workers than CPUs keep it busy.
	workers := 16
	if s := os.Getenv("LOCK_MODEL_WORKERS"); s != "" {
		workers, _ = strconv.Atoi(s)
	}
	start := time.Now()
	x := &explorer{states: map[string]*xstate{}, edges: map[string]map[op]string{}, depth: maxPath}
	if testing.Short() {
		x.depth = 4
	}
	hs := make([]*harness, workers)
	for i := range hs {
		hs[i] = newHarness(t, clients)
		defer hs[i].close()
	}
	// The initial state.
	h := hs[0]
	h.reset("s0")
	sig, perm, err := h.signature()
	if err != nil {
		t.Fatal(err)
	}
	offers, err := h.offers()
	if err != nil {
		t.Fatal(err)
	}
	x.states[sig] = &xstate{perm: perm, offers: canonical(offers, perm)}

	var wg sync.WaitGroup
	for _, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := x.work(h); err != nil {
				x.fail(err)
			}
		}()
	}
	wg.Wait()
	if x.err != nil {
		t.Fatal(x.err)
	}
	longest := 0
	for _, st := range x.states {
		longest = max(longest, len(st.path))
	}
	t.Logf("%d states (paths up to %d steps), %d transitions checked, %d replays and %d walks of %d steps in all, %v",
		len(x.states), longest, x.transitions, x.replays, x.walks, x.steps, time.Since(start).Round(time.Millisecond))
	if len(x.states) < 50 && !testing.Short() {
		t.Fatalf("only %d states: the exploration is broken", len(x.states))
	}
}

// maxPath bounds the paths to states. The state space is finite; the bound
// catches a bug that makes it grow without end (keys never removed, ...).
const maxPath = 40

type xstate struct {
	path []op  // a shortest known path from the initial state
	perm []int // the canonical names, at its end, of path's clients
	// offers: operations not tried yet from this state, with clients named
	// canonically (see signature).
	offers []op
}

// explorer is the shared search. Workers move through the state graph in
// place (each transition leaves the harness in the next state, whose
// untried operations come next) and replay a path only when their current
// state has nothing left to try.
type explorer struct {
	mu          sync.Mutex
	states      map[string]*xstate
	edges       map[string]map[op]string // known transitions, canonical
	depth       int                      // states further away are not expanded
	busy        int
	err         error
	transitions int
	replays     int
	walks       int
	steps       int
}

func (x *explorer) fail(err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.err == nil {
		x.err = err
	}
}

// plan is a worker's next move: get to state target, try o there.
type plan struct {
	target string
	o      op // canonical
	// How to get there, if not there already: walk known transitions
	// (canonical operations, through states via), or replay target's
	// path on a fresh resource.
	walk   []op
	via    []string
	replay []op
}

// claim takes an untried operation: from cur if it has one, else from the
// nearest state with one through known transitions, else from the state
// with the shortest path. ok is false when the search is over.
func (x *explorer) claim(cur string) (p plan, ok bool) {
	for {
		x.mu.Lock()
		if x.err != nil {
			x.mu.Unlock()
			return plan{}, false
		}
		p, found := x.nearest(cur)
		if found {
			st := x.states[p.target]
			p.o, st.offers = st.offers[0], st.offers[1:]
			x.busy++
			x.mu.Unlock()
			return p, true
		}
		idle := x.busy == 0
		x.mu.Unlock()
		if idle {
			return plan{}, false
		}
		// Another worker may still discover states.
		time.Sleep(2 * time.Millisecond)
	}
}

// nearest plans the cheapest way to a state with untried operations.
func (x *explorer) nearest(cur string) (plan, bool) {
	// Breadth first over known transitions from cur.
	type hop struct {
		from string
		o    op
	}
	back := map[string]hop{cur: {}}
	queue := []string{cur}
	for len(queue) > 0 && cur != "" {
		s := queue[0]
		queue = queue[1:]
		if st := x.states[s]; st != nil && len(st.offers) > 0 {
			p := plan{target: s}
			for t := s; t != cur; t = back[t].from {
				p.walk = append([]op{back[t].o}, p.walk...)
				p.via = append([]string{t}, p.via...)
			}
			// Walking costs about what replaying does per step; a
			// replay also starts afresh.
			if len(p.walk) <= len(st.path) {
				return p, true
			}
			break
		}
		for o, t := range x.edges[s] {
			if _, ok := back[t]; !ok {
				back[t] = hop{from: s, o: o}
				queue = append(queue, t)
			}
		}
	}
	var best *xstate
	sig := ""
	for s, st := range x.states {
		if len(st.offers) > 0 && (best == nil || len(st.path) < len(best.path) ||
			len(st.path) == len(best.path) && s < sig) {
			best, sig = st, s
		}
	}
	if best == nil {
		return plan{}, false
	}
	return plan{target: sig, replay: slices.Clone(best.path)}, true
}

func (x *explorer) work(h *harness) error {
	// The harness is in state cur, its client c named perm[c] there.
	// curPath leads to cur too, but possibly in another worker's naming
	// of the clients: its client d is named pathPerm[d] at cur.
	cur := ""
	var perm, pathPerm []int
	var curPath []op
	for {
		p, ok := x.claim(cur)
		if !ok {
			return nil
		}
		switch {
		case p.target == cur:
		case p.walk != nil:
			for i, o := range p.walk {
				o.client = slices.Index(perm, o.client)
				if _, err := h.step(o, false); err != nil {
					return err
				}
				got, gp, err := h.signature()
				if err != nil {
					return err
				}
				if got != p.via[i] {
					return fmt.Errorf("%s: not deterministic: reached\n\t%s\ninstead of\n\t%s",
						strings.Join(h.trace, "; "), got, p.via[i])
				}
				perm = gp
			}
			x.mu.Lock()
			x.walks++
			x.steps += len(p.walk)
			st := x.states[p.target]
			cur, curPath, pathPerm = p.target, slices.Clone(st.path), slices.Clone(st.perm)
			x.mu.Unlock()
		default:
			h.reset(fmt.Sprintf("s%d", testSeq.Add(1)))
			for _, o := range p.replay {
				if _, err := h.step(o, false); err != nil {
					return err
				}
			}
			got, gp, err := h.signature()
			if err != nil {
				return err
			}
			if got != p.target {
				return fmt.Errorf("replaying %v reached\n\t%s\ninstead of\n\t%s", p.replay, got, p.target)
			}
			x.mu.Lock()
			x.replays++
			x.steps += len(p.replay)
			x.mu.Unlock()
			cur, perm, curPath, pathPerm = p.target, gp, p.replay, gp
		}
		canon := p.o
		o := canon
		o.client = slices.Index(perm, canon.client)
		if _, err := h.do(o); err != nil {
			return err
		}
		next, nextPerm, err := h.signature()
		if err != nil {
			return err
		}
		// The same step in curPath's naming, and the naming at its end.
		po := canon
		po.client = slices.Index(pathPerm, canon.client)
		nextPath := append(slices.Clone(curPath), po)
		nextPathPerm := make([]int, len(perm))
		for d := range nextPathPerm {
			nextPathPerm[d] = nextPerm[slices.Index(perm, pathPerm[d])]
		}
		x.mu.Lock()
		x.transitions++
		if x.edges[cur] == nil {
			x.edges[cur] = map[op]string{}
		}
		x.edges[cur][canon] = next
		st, seen := x.states[next]
		if !seen {
			if len(nextPath) > maxPath {
				x.mu.Unlock()
				return fmt.Errorf("a state %d steps away: %v", len(nextPath), nextPath)
			}
			// Reserve it; its operations follow below.
			st = &xstate{path: nextPath, perm: nextPathPerm}
			x.states[next] = st
		} else if len(nextPath) < len(st.path) {
			st.path, st.perm = nextPath, nextPathPerm
		}
		x.mu.Unlock()
		if !seen && len(nextPath) <= x.depth {
			offers, err := h.offers()
			if err != nil {
				return err
			}
			x.mu.Lock()
			st.offers = canonical(offers, nextPerm)
			x.mu.Unlock()
		}
		x.mu.Lock()
		x.busy--
		cur, perm = next, nextPerm
		curPath, pathPerm = slices.Clone(st.path), slices.Clone(st.perm)
		x.mu.Unlock()
	}
}

// offers lists the operations to try in the current state (see the file
// comment).
func (h *harness) offers() ([]op, error) {
	q, err := h.current()
	if err != nil {
		return nil, err
	}
	woken := h.wokenIn(q)
	var out []op
	idleOffered := false
	for c := range h.cs {
		if h.m.find(c) < 0 {
			if idleOffered {
				continue
			}
			idleOffered = true
		}
		switch {
		case h.cs[c].w != nil && h.cs[c].w.admitting:
			out = append(out, op{client: c, kind: opAdmit})
		case woken[c]:
			out = append(out, op{client: c, kind: opPoll})
		}
		for _, o := range h.m.possible(c) {
			// A killed waiter or holder leaves the queue as a cancelled or
			// released one does (its key is deleted; the scripts and
			// TestSessionDeath show the lease does it): only an upgrader's
			// death differs from what else it can do.
			if o.kind != opKill || h.cs[c].u != nil {
				out = append(out, o)
			}
		}
	}
	return out, nil
}

// canonical renames the clients of ops by perm.
func canonical(ops []op, perm []int) []op {
	out := slices.Clone(ops)
	for i := range out {
		out[i].client = perm[out[i].client]
	}
	return out
}

// signature names the current state, canonically over client renamings:
// the least rendering, and the renaming (perm[client] = canonical name)
// that gives it.
func (h *harness) signature() (string, []int, error) {
	q, err := h.current()
	if err != nil {
		return "", nil, err
	}
	woken := h.wokenIn(q)
	n := len(h.cs)
	owner := map[string]int{}
	for _, e := range q {
		owner[e.key] = int(e.rec.Owner[0] - 'a')
	}
	best, bestPerm := "", []int(nil)
	for _, perm := range permutations(n) {
		name := func(c int) byte { return byte('a' + perm[c]) }
		keyName := func(k string) byte {
			if c, ok := owner[k]; ok {
				return name(c)
			}
			return '-'
		}
		var b strings.Builder
		for _, e := range q {
			b.WriteByte(keyName(e.key))
			b.WriteString(e.mode.String()[:1])
			if e.rec.Admitted && fenced(q, e) {
				b.WriteByte('+')
			}
			b.WriteByte(' ')
		}
		b.WriteString("| ")
		inv := make([]int, n)
		for c, p := range perm {
			inv[p] = c
		}
		for _, c := range inv {
			hc := h.cs[c]
			switch {
			case hc.w != nil && hc.w.admitting:
				// Whether its admission can succeed: the update keys it
				// passes are as it saw them.
				valid := true
				for _, f := range hc.w.fence {
					valid = valid && slices.ContainsFunc(q, func(e entry) bool { return e.key == f.key && e.mod == f.mod })
				}
				fmt.Fprintf(&b, "a%s%v ", hc.w.mode.String()[:1], valid)
			case hc.w != nil:
				fmt.Fprintf(&b, "w%s>%c%v ", hc.w.mode.String()[:1], keyName(hc.w.watchKey), woken[c])
			case hc.u != nil:
				var drain []byte
				for _, e := range hc.u.drain {
					if k := keyName(e.key); k != '-' {
						drain = append(drain, k)
					}
				}
				slices.Sort(drain)
				fmt.Fprintf(&b, "u[%s]>%c%v ", drain, keyName(hc.u.watchKey), woken[c])
			case hc.h != nil:
				fmt.Fprintf(&b, "h%s ", hc.h.mode.String()[:1])
			default:
				b.WriteString("i ")
			}
		}
		b.WriteString("| ")
		for _, e := range h.m.q {
			fmt.Fprintf(&b, "%c%s%d ", name(e.client), e.mode.String()[:1], e.st)
		}
		if s := b.String(); best == "" || s < best {
			best, bestPerm = s, perm
		}
	}
	return best, bestPerm, nil
}

// fenced says whether reader e's admission flag can still matter: only an
// update key older than e (or one upgrading) ever reads it.
func fenced(q []entry, e entry) bool {
	for _, o := range q {
		if o.create < e.create && (o.mode == Update || o.rec.Upgraded) {
			return true
		}
	}
	return false
}

func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}
