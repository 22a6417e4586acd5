package e2e

// Robustness: a 3-node cluster, each node in its own network namespace,
// serves a stream of control operations (volume create/delete/show and
// snapshot create/delete/show, by name, through every node, over the
// bridge and from inside the nodes' namespaces) while a nemesis kills
// (SIGKILL) and restarts nodes, cuts them off and reconnects them, in turn
// — one node at a time, and every fourth fault two at once (no quorum
// anywhere). Once the cluster has settled, every name used is read once
// more (what was acknowledged must have outlived the faults). The recorded
// history is checked for linearizability with porcupine against a model
// of the API; no write may be acknowledged from a minority; writes must
// fail cleanly without quorum; the availability is printed.
//
// Short form in `make test` (about 45 s of faults). Environment:
//
//	BASALT_ROBUST_DURATION=5m   run the nemesis longer
//	BASALT_ROBUST_SEED=N        replay the same operation sequence
//	BASALT_ROBUST_HISTORY=PATH  write every operation (and the nodes' logs) there
//	BASALT_ROBUST_INJECT=stale  add one fabricated stale read to the history: the check must fail

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The model. Every operation names a volume, and the snapshot NAME-s
// belongs to the volume NAME in the model (snapshot create needs the
// volume; the snapshot outlives it), so a name is its own partition.
type robustOp struct {
	Kind string // vcreate, vdelete, vget (volumes); screate, sdelete, sget (snapshots)
	Name string
}

func (o robustOp) write() bool { return o.Kind != "vget" && o.Kind != "sget" }

// Outcomes.
const (
	outOK      = "ok"
	outExists  = "exists" // create: 409 NameConflict
	outAbsent  = "absent" // 404 NotFound (snapshot create: of the volume)
	outUnknown = "unknown"
)

type robustOut struct {
	Res string
	// The volume id: of the volume (vcreate, vget) or of the volume the
	// snapshot was taken of (screate, sget). It tells incarnations of a
	// name apart: a read of a deleted volume's id is stale even if the
	// name exists again.
	ID string
}

// robustState is one name's state. Vol is "" (no volume), the volume's id,
// or "?" for an id no answer showed (made by a create of unknown outcome).
// Snap is "" (no snapshot NAME-s) or the id of the volume it was taken of.
// Used lists the ids already attributed to creates of unknown outcome.
type robustState struct {
	Vol, Snap, Used string
}

// robustModel is the model for a history. A create of unknown outcome has
// no id of its own; if it took effect, its volume's id may show up later
// in a read. orphans[name] are the ids answers showed for a name that no
// acknowledged create returned: such a create may have made any one of
// them (or an id nobody saw: "?"), but each only once — otherwise a read
// of a long-deleted volume could pass as a new creation of it.
func robustModel(orphans map[string][]string) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			var names []string
			for _, op := range h {
				n := op.Input.(robustOp).Name
				if _, ok := by[n]; !ok {
					names = append(names, n)
				}
				by[n] = append(by[n], op)
			}
			out := make([][]porcupine.Operation, 0, len(names))
			for _, n := range names {
				out = append(out, by[n])
			}
			return out
		},
		Init: func() []any { return []any{robustState{}} },
		Step: func(state, input, output any) []any {
			s, in, out := state.(robustState), input.(robustOp), output.(robustOut)
			same := []any{s}
			if out.Res == outOK && out.ID == "" && in.Kind != "vdelete" && in.Kind != "sdelete" {
				// A create or read answered 2xx must name the volume: its
				// id "" would match the empty state below, and a success
				// with no record in it (null, a changed body) would pass
				// as absence.
				return nil
			}
			switch in.Kind + "/" + out.Res {
			case "vcreate/ok":
				if s.Vol == "" {
					return []any{robustState{Vol: out.ID, Snap: s.Snap, Used: s.Used}}
				}
			case "vcreate/exists":
				if s.Vol != "" {
					return same
				}
			case "vcreate/unknown":
				if s.Vol != "" {
					return same // it would have been a NameConflict
				}
				next := []any{robustState{Vol: "?", Snap: s.Snap, Used: s.Used}}
				var used []string
				if s.Used != "" {
					used = strings.Split(s.Used, ",")
				}
				for _, id := range orphans[in.Name] {
					if !slices.Contains(used, id) {
						u := append(slices.Clone(used), id)
						slices.Sort(u)
						next = append(next, robustState{Vol: id, Snap: s.Snap, Used: strings.Join(u, ",")})
					}
				}
				return next
			case "vdelete/ok":
				if s.Vol != "" {
					return []any{robustState{Snap: s.Snap, Used: s.Used}}
				}
			case "vdelete/absent", "vget/absent", "screate/absent":
				if s.Vol == "" {
					return same
				}
			case "vdelete/unknown":
				return []any{robustState{Snap: s.Snap, Used: s.Used}}
			case "vget/ok":
				if s.Vol == out.ID {
					return same
				}
			case "screate/ok":
				if s.Vol == out.ID && s.Snap == "" {
					return []any{robustState{Vol: s.Vol, Snap: s.Vol, Used: s.Used}}
				}
			case "screate/exists":
				if s.Vol != "" && s.Snap != "" {
					return same
				}
			case "screate/unknown":
				if s.Vol != "" && s.Snap == "" {
					return []any{robustState{Vol: s.Vol, Snap: s.Vol, Used: s.Used}}
				}
				return same
			case "sdelete/ok":
				if s.Snap != "" {
					return []any{robustState{Vol: s.Vol, Used: s.Used}}
				}
			case "sdelete/absent", "sget/absent":
				if s.Snap == "" {
					return same
				}
			case "sdelete/unknown":
				return []any{robustState{Vol: s.Vol, Used: s.Used}}
			case "sget/ok":
				if s.Snap == out.ID {
					return same
				}
			}
			return nil
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(robustOp), output.(robustOut)
			if out.ID != "" {
				return fmt.Sprintf("%s(%s) -> %s %s", in.Kind, in.Name, out.Res, out.ID)
			}
			return fmt.Sprintf("%s(%s) -> %s", in.Kind, in.Name, out.Res)
		},
		DescribeState: func(state any) string {
			s := state.(robustState)
			return fmt.Sprintf("vol=%q snap=%q", s.Vol, s.Snap)
		},
	}
	return nm.ToModel()
}

// orphansOf collects, per name, the ids answers showed that no
// acknowledged create of that name returned.
func orphansOf(ops []porcupine.Operation) map[string][]string {
	created := map[string]bool{}
	for _, op := range ops {
		if in, out := op.Input.(robustOp), op.Output.(robustOut); in.Kind == "vcreate" && out.Res == outOK {
			created[out.ID] = true
		}
	}
	orphans := map[string][]string{}
	for _, op := range ops {
		in, out := op.Input.(robustOp), op.Output.(robustOut)
		if out.ID != "" && !created[out.ID] && !slices.Contains(orphans[in.Name], out.ID) {
			orphans[in.Name] = append(orphans[in.Name], out.ID)
		}
	}
	return orphans
}

// robustName is the name of a slot that moved on g times.
func robustName(slot string, g int) string {
	if g == 0 {
		return slot
	}
	return fmt.Sprintf("%s-%d", slot, g)
}

// robustRequest is op's HTTP request on node endpoint ep.
func robustRequest(ep string, op robustOp) (method, url, body string) {
	switch op.Kind {
	case "vcreate":
		return "POST", ep + "/v1/volumes", `{"name":"` + op.Name + `","size":"1MiB"}`
	case "vdelete":
		return "DELETE", ep + "/v1/volumes/" + op.Name, ""
	case "vget":
		return "GET", ep + "/v1/volumes/" + op.Name, ""
	case "screate":
		return "POST", ep + "/v1/snapshots", `{"volume":"` + op.Name + `","name":"` + op.Name + `-s"}`
	case "sdelete":
		return "DELETE", ep + "/v1/snapshots/" + op.Name + "-s", ""
	default: // sget
		return "GET", ep + "/v1/snapshots/" + op.Name + "-s", ""
	}
}

// Classes of answers that do not go into the checked history.
const (
	dropNotSent  = "not sent"   // no connection: no effect
	dropRefused  = "refused"    // 409 busy/in use: checked before any change, no effect
	dropLocal    = "local read" // Basalt-Read: local: may be stale by design
	dropReadFail = "read failed"
)

// robustClassify turns an answer into a model outcome, or says why the
// operation stays out of the history.
func robustClassify(op robustOp, a apiAnswer) (out robustOut, drop string) {
	if a.Err != nil && a.Status == 0 {
		switch {
		case neverSent(a.Err):
			return out, dropNotSent
		case !op.write():
			return out, dropReadFail
		}
		// Sent, no answer: a timeout or a lost connection; it may have
		// taken effect, now or later.
		return robustOut{Res: outUnknown}, ""
	}
	ok := a.Status >= 200 && a.Status < 300
	if a.Local && !(ok && op.write()) {
		// Served from the node's own copy. A read may be stale by
		// design; a write answered from that copy (404, 409) made no
		// change. (An acknowledged write was committed: it stays.)
		switch {
		case a.Status >= 500 && op.write():
			return robustOut{Res: outUnknown}, ""
		case a.Status >= 500:
			return out, dropReadFail
		}
		return out, dropLocal
	}
	switch {
	case ok:
		var v struct {
			ID       string `json:"id"`
			VolumeID string `json:"volume_id"`
		}
		json.Unmarshal(a.Body, &v)
		out = robustOut{Res: outOK, ID: v.ID}
		switch op.Kind {
		case "screate", "sget":
			out.ID = v.VolumeID
		case "vdelete", "sdelete":
			out.ID = ""
		}
		return out, ""
	case a.Status == 404 && a.Code == "NotFound" && op.Kind != "vcreate":
		return robustOut{Res: outAbsent}, ""
	case a.Status == 409 && a.Code == "NameConflict" && (op.Kind == "vcreate" || op.Kind == "screate"):
		return robustOut{Res: outExists}, ""
	case a.Status == 409 && (a.Code == "VolumeBusy" || a.Code == "VolumeInUse" || a.Code == "SnapshotNotReady" || a.Code == "SnapshotInUse"):
		return out, dropRefused
	case !op.write():
		return out, dropReadFail
	}
	// 503 MetadataUnavailable and the like: the write may still commit.
	return robustOut{Res: outUnknown}, ""
}

// robustEvent is one attempted operation, kept or not.
type robustEvent struct {
	client    int
	node      int
	inside    bool // sent from inside the node's namespace
	op        robustOp
	call, ret time.Time
	a         apiAnswer
	out       robustOut
	drop      string
}

// fault is one nemesis action and when it lasted.
type fault struct {
	what       string
	nodes      []int
	quorum     bool // two nodes cut off: no quorum anywhere
	start, end time.Time
}

func TestRobustCluster(t *testing.T) {
	t.Parallel()
	duration := 45 * time.Second
	if v := os.Getenv("BASALT_ROBUST_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("BASALT_ROBUST_DURATION=%q: %v", v, err)
		}
		duration = d
	}
	c, lab := StartNetCluster(t, 3)

	// Two ways in: over the bridge, and from inside a node's namespace.
	// The latter still reaches a cut-off node, so the minority side of a
	// partition gets requests too (and must refuse writes and mark its
	// reads). Dials time out quickly: a dial that fails sent nothing, so
	// its operation leaves the history instead of becoming one of unknown
	// outcome.
	const answerTimeout = 20 * time.Second // > the 10 s a write may take to fail without quorum, and a lock wait's 10 s + 5 s
	bridge := identityHTTP(t, c.Nodes[0].AdminDir())
	bridge.Timeout = answerTimeout
	bridge.Transport.(*http.Transport).DialContext = (&net.Dialer{Timeout: 2 * time.Second}).DialContext
	var insideNS []*http.Client
	for i := range c.Nodes {
		insideNS = append(insideNS, nsHTTP(bridge, lab.ns(i+1)))
	}

	start := time.Now()
	var (
		mu     sync.Mutex
		events []robustEvent
	)
	// Names rotate: every epoch has its own four, so a name sees a few
	// seconds of operations. That keeps each of porcupine's partitions
	// small — above all in operations of unknown outcome, which stay
	// pending to the end of their partition and make the search
	// exponential in their number — however long the run. A few seconds
	// are not enough on their own: without quorum every write is under
	// way for 10 s and most end unknown, and a name that gathered twenty
	// of them kept the check busy past its 8 minutes (CI, stop 37). So a
	// name also takes at most maxRisky writes that are under way or ended
	// unknown; past that its slot moves on to a fresh name, reads too.
	// risky counts those writes per name and moved is how many times a
	// slot moved on; both under mu.
	const epoch, perEpoch, maxRisky = 5 * time.Second, 4, 3
	risky, moved := map[string]int{}, map[string]int{}
	// do sends op through node (from inside its namespace or over the
	// bridge) and returns what happened; run records it.
	do := func(client, node int, inside bool, op robustOp) robustEvent {
		e := robustEvent{client: client, node: node, inside: inside, op: op}
		hc := bridge
		if inside {
			hc = insideNS[node]
		}
		method, url, body := robustRequest(c.Nodes[node].Endpoint(), op)
		e.call = time.Now()
		e.a = apiDo(hc, method, url, body)
		e.ret = time.Now()
		e.out, e.drop = robustClassify(op, e.a)
		return e
	}
	run := func(client, node int, inside bool, op robustOp) {
		e := do(client, node, inside, op)
		mu.Lock()
		events = append(events, e)
		if op.write() && e.out.Res != outUnknown {
			risky[op.Name]--
		}
		mu.Unlock()
	}
	randomOp := func(rng *rand.Rand) robustOp {
		var op robustOp
		switch k := rng.IntN(100); {
		case k < 30:
			op.Kind = "vcreate"
		case k < 48:
			op.Kind = "vdelete"
		case k < 73:
			op.Kind = "vget"
		case k < 83:
			op.Kind = "screate"
		case k < 91:
			op.Kind = "sdelete"
		default:
			op.Kind = "sget"
		}
		base := fmt.Sprintf("e%d-v%d", time.Since(start)/epoch, rng.IntN(perEpoch))
		mu.Lock()
		defer mu.Unlock()
		g := moved[base]
		for op.write() && risky[robustName(base, g)] >= maxRisky {
			g++
		}
		moved[base] = g
		op.Name = robustName(base, g)
		if op.write() {
			risky[op.Name]++
		}
		return op
	}
	seed := uint64(start.UnixNano())
	if v := os.Getenv("BASALT_ROBUST_SEED"); v != "" {
		fmt.Sscan(v, &seed)
	}
	t.Logf("clients' seed %d (BASALT_ROBUST_SEED)", seed)
	// Open loop: an operation starts every 25 ms whatever the others are
	// doing, each on its own goroutine (up to maxInFlight at once). Many
	// requests wait long — a write without quorum up to 10 s, a busy
	// volume 10 s, a request to a cut-off node until it times out — and
	// closed-loop clients would all end up waiting on the slowest resource:
	// the availability figures would be the clients', not the cluster's,
	// and whole phases would go untested. Each goroutine takes a free
	// client id (porcupine draws one row per id).
	const maxInFlight = 128
	slots := make(chan int, maxInFlight)
	for i := range maxInFlight {
		slots <- i
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	skipped := 0
	// Also when the nemesis fails the test: no requests after it ends.
	stopClients := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopClients()
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 7))
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			node, inside, op := rng.IntN(len(c.Nodes)), rng.IntN(2) == 0, randomOp(rng)
			select {
			case id := <-slots:
				wg.Add(1)
				go func() {
					defer wg.Done()
					run(id, node, inside, op)
					slots <- id
				}()
			default:
				skipped++
			}
		}
	}()

	// The nemesis: one fault at a time, node after node, 3 s apart; every
	// fourth fault cuts two nodes off (no quorum anywhere) for 14 s, long
	// enough for writes to time out inside it.
	end := start.Add(duration)
	var faults []fault
	for k := 0; time.Now().Before(end); k++ {
		i := k % 3
		f := fault{start: time.Now()}
		switch k % 4 {
		case 0, 2:
			f.what, f.nodes = "kill "+c.Nodes[i].opts.Name, []int{i}
			c.Nodes[i].Kill()
			time.Sleep(4 * time.Second)
			c.Nodes[i].Restart()
		case 1:
			f.what, f.nodes = "cut "+c.Nodes[i].opts.Name, []int{i}
			lab.cut(i + 1)
			f.start = time.Now() // the partition is whole from here
			time.Sleep(6 * time.Second)
			f.end = time.Now() // and from here it heals
			lab.heal(i + 1)
		case 3:
			j := (i + 1) % 3
			f.what, f.nodes, f.quorum = "cut "+c.Nodes[i].opts.Name+"+"+c.Nodes[j].opts.Name, []int{i, j}, true
			// Each cut and heal is an `ip` process: on a loaded machine
			// one may take a while, and until both cuts are in place (or
			// from the first heal on) two nodes have a quorum. The fault
			// is timed from the second cut to the first heal, so that no
			// write those moments may legitimately commit counts as
			// acknowledged from a minority.
			lab.cut(i + 1)
			lab.cut(j + 1)
			f.start = time.Now()
			time.Sleep(14 * time.Second)
			f.end = time.Now()
			lab.heal(i + 1)
			lab.heal(j + 1)
		}
		if f.end.IsZero() {
			f.end = time.Now()
		}
		faults = append(faults, f)
		time.Sleep(3 * time.Second)
	}
	stopClients()
	finish := time.Now()
	all := events // events and the final reads
	defer func() {
		if t.Failed() && os.Getenv("BASALT_ROBUST_HISTORY") == "" {
			robustDump(t, "", all, faults, start)
		}
	}()
	if skipped > 0 {
		t.Logf("%d operations not started: %d already under way", skipped, maxInFlight)
	}
	// Every node is back and healthy: the faults left no lasting damage.
	c.WaitRoles(60*time.Second, nil)
	robustLeftoverLocks(t, c.Nodes[0], finish)
	finals := robustFinalReads(t, len(c.Nodes), events, func(node int, op robustOp) robustEvent {
		return do(maxInFlight, node, false, op)
	})
	all = append(slices.Clip(events), finals...)

	var ops []porcupine.Operation
	dropped := map[string]int{}
	oddAnswers := map[string]int{}
	for _, e := range events {
		if e.drop != "" {
			dropped[e.drop]++
			continue
		}
		if e.out.Res == outUnknown && e.a.Status != 0 {
			oddAnswers[fmt.Sprintf("%s %d %s", e.op.Kind, e.a.Status, e.a.Code)]++
		}
		o := porcupine.Operation{ClientId: e.client, Input: e.op, Output: e.out,
			Call: e.call.Sub(start).Nanoseconds(), Return: e.ret.Sub(start).Nanoseconds()}
		if e.out.Res == outUnknown {
			o.Return = math.MaxInt64 // it may take effect at any time after the call
		}
		ops = append(ops, o)
	}

	if path := os.Getenv("BASALT_ROBUST_HISTORY"); path != "" {
		robustDump(t, path, all, faults, start)
		for _, n := range c.Nodes {
			os.WriteFile(path+"."+n.opts.Name+".log", []byte(n.Log()), 0o644)
		}
	}
	robustReport(t, events, faults, start, finish)
	t.Logf("left out of the check: %v; writes of unknown outcome with an answer: %v", dropped, oddAnswers)
	robustMinority(t, events, faults)
	definite := len(ops)
	for _, o := range ops {
		if o.Output.(robustOut).Res == outUnknown {
			definite--
		}
	}
	if definite < 100 {
		t.Fatalf("only %d operations had a definite outcome: the cluster was not available enough to test", definite)
	}
	for _, e := range finals {
		ops = append(ops, porcupine.Operation{ClientId: e.client, Input: e.op, Output: e.out,
			Call: e.call.Sub(start).Nanoseconds(), Return: e.ret.Sub(start).Nanoseconds()})
	}

	if os.Getenv("BASALT_ROBUST_INJECT") == "stale" {
		ops = injectStaleRead(t, ops)
	}
	model := robustModel(orphansOf(ops))
	checkStart := time.Now()
	// With at most maxRisky writes of unknown outcome per name the check
	// takes milliseconds; before that bound a quorum loss's pile of them
	// made it take minutes, or not end. The budget is for a loaded CI
	// machine, with room to spare.
	const checkFor = 2 * time.Minute
	res, info := porcupine.CheckOperationsVerbose(model, ops, checkFor)
	switch res {
	case porcupine.Ok:
		t.Logf("porcupine: linearizable (%d operations, %d of unknown outcome, %d final reads; checked in %v)",
			len(ops), len(ops)-definite-len(finals), len(finals), time.Since(checkStart).Round(time.Millisecond))
	case porcupine.Illegal:
		f, err := os.CreateTemp("", "basalt-robust-*.html")
		if err != nil {
			t.Fatalf("porcupine: NOT linearizable (no visualization: %v)", err)
		}
		f.Close()
		t.Fatalf("porcupine: NOT linearizable; visualization: %s (%v)", f.Name(), porcupine.VisualizePath(model, info, f.Name()))
	default:
		t.Fatalf("porcupine: the check did not finish within %v: nothing was verified", checkFor)
	}
}

// robustFinalReads reads every name the clients used, its volume and its
// snapshot, once the cluster is whole again and the clients have stopped:
// linearizable reads (one answered from a node's own copy, or failed, is
// asked again through the next node), through every node in turn. They
// go into the checked history, after everything else.
//
// Names rotate every epoch, so a name sees client operations for a few
// seconds only — shorter than any fault: no operation after a kill, a
// restart or a partition ever looked at what had been acknowledged before
// it. Without these reads a cluster that lost acknowledged metadata when a
// node died or came back (a minority: it must survive that) passed.
func robustFinalReads(t *testing.T, nodes int, events []robustEvent, do func(node int, op robustOp) robustEvent) []robustEvent {
	var names []string
	for _, e := range events {
		if !slices.Contains(names, e.op.Name) {
			names = append(names, e.op.Name)
		}
	}
	var out []robustEvent
	deadline := time.Now().Add(60 * time.Second)
	k, found := 0, 0
	for _, name := range names {
		for _, kind := range []string{"vget", "sget"} {
			for {
				e := do(k%nodes, robustOp{Kind: kind, Name: name})
				k++
				if e.drop == "" {
					out = append(out, e)
					if e.out.Res == outOK {
						found++
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("final read %s(%s) through n%d: %s (HTTP %d %s %v): no linearizable answer 60s after the cluster settled",
						kind, name, e.node+1, e.drop, e.a.Status, e.a.Code, e.a.Err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	t.Logf("final reads: %d names, %d volumes and snapshots found", len(names), found)
	return out
}

// robustDump writes every attempted operation, one a line, to path (or a
// temporary file): what the check saw, to read next to the nodes' logs.
func robustDump(t *testing.T, path string, events []robustEvent, faults []fault, start time.Time) {
	var b strings.Builder
	at := func(x time.Time) string { return fmt.Sprintf("%8.3f", x.Sub(start).Seconds()) }
	fmt.Fprintf(&b, "# times in seconds from %s\n", start.UTC().Format(time.RFC3339Nano))
	for _, f := range faults {
		fmt.Fprintf(&b, "# %s from %s to %s\n", f.what, at(f.start), at(f.end))
	}
	sort.Slice(events, func(a, b int) bool { return events[a].call.Before(events[b].call) })
	for _, e := range events {
		route := "bridge"
		if e.inside {
			route = "inside"
		}
		res := e.out.Res
		if e.drop != "" {
			res = "(" + e.drop + ")"
		}
		errText := ""
		if e.a.Err != nil {
			errText = e.a.Err.Error()
		} else if e.a.Status >= 300 {
			var eb ErrorBody
			json.Unmarshal(e.a.Body, &eb)
			errText = eb.Error.Message
		}
		fmt.Fprintf(&b, "%s %s c%d n%d %s %s(%s) -> %s %s | HTTP %d %s local=%v %s\n", at(e.call), at(e.ret), e.client,
			e.node+1, route, e.op.Kind, e.op.Name, res, e.out.ID, e.a.Status, e.a.Code, e.a.Local, errText)
	}
	if path == "" {
		f, err := os.CreateTemp("", "basalt-robust-*.history")
		if err != nil {
			t.Logf("history: %v", err)
			return
		}
		path = f.Name()
		f.Close()
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Logf("history: %v", err)
		return
	}
	t.Logf("history of %d operations: %s", len(events), path)
}

// robustLeftoverLocks: once the clients have stopped and their last
// workflows have ended, no workflow lock may remain. A lock whose release
// (or a request whose withdrawal) failed during a fault stays on its
// node's etcd session, which outlives the fault: the volume then answers
// VolumeBusy to every conflicting workflow until that node's session ends
// — unless the release is retried once etcd answers again, as it must be.
func robustLeftoverLocks(t *testing.T, n *Node, finish time.Time) {
	pki := filepath.Join(n.Data, "pki")
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "server.pem"), filepath.Join(pki, "server-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(mustRead(t, filepath.Join(pki, "ca.pem")))
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"https://" + n.addr(n.EtcdClient)},
		DialTimeout: 5 * time.Second,
		TLS:         &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// A request answered or abandoned by the client may still run on
	// its node for a while (a lock wait, then a metadata timeout): 20 s
	// after the last one started, none is left.
	var left []string
	for deadline := finish.Add(20 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := cli.Get(ctx, "/basalt/locks/", clientv3.WithPrefix())
		cancel()
		if err != nil {
			t.Fatalf("list the workflow locks: %v", err)
		}
		left = left[:0]
		for _, kv := range resp.Kvs {
			left = append(left, fmt.Sprintf("%s = %s", strings.TrimPrefix(string(kv.Key), "/basalt/locks/"), kv.Value))
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if len(left) == 0 {
		t.Logf("no workflow lock left after the run")
		return
	}
	msg := fmt.Sprintf("%d workflow locks left 20 s after the last request, with no workflow running (leaked: their volumes stay busy until the holder's session ends):\n  %s",
		len(left), strings.Join(left, "\n  "))
	t.Error(msg)
}

// robustReport prints the availability: overall, per fault, and the
// longest stretches without an answer and without a successful write.
func robustReport(t *testing.T, events []robustEvent, faults []fault, start, finish time.Time) {
	var desc []string
	for _, f := range faults {
		desc = append(desc, fmt.Sprintf("%s @%.0fs", f.what, f.start.Sub(start).Seconds()))
	}
	t.Logf("nemesis: %s", strings.Join(desc, ", "))

	definite := func(e robustEvent) bool { return e.drop == "" && e.out.Res != outUnknown }
	written := func(e robustEvent) bool { return definite(e) && e.op.write() && e.out.Res == outOK }
	inQuorumLoss := func(at time.Time) bool {
		for _, f := range faults {
			if f.quorum && !at.Before(f.start) && !at.After(f.end) {
				return true
			}
		}
		return false
	}
	// longestGap is the longest time between consecutive answers that
	// pass keep (the first measured from start, the last to finish).
	longestGap := func(evs []robustEvent, from, to time.Time, keep func(robustEvent) bool) (time.Duration, time.Time) {
		var at []time.Time
		for _, e := range evs {
			if keep(e) {
				at = append(at, e.ret)
			}
		}
		sort.Slice(at, func(a, b int) bool { return at[a].Before(at[b]) })
		at = append(at, to)
		last, gap, where := from, time.Duration(0), from
		for _, x := range at {
			if x.Sub(last) > gap {
				gap, where = x.Sub(last), last
			}
			if x.After(last) {
				last = x
			}
		}
		return gap, where
	}

	n, ok, local := len(events), 0, 0
	for _, e := range events {
		if definite(e) {
			ok++
		}
		if e.drop == dropLocal {
			local++
		}
	}
	t.Logf("operations: %d in %v; answered with a definite outcome %d (%.1f%%); reads from a node's own copy (left out) %d",
		n, finish.Sub(start).Round(time.Second), ok, 100*float64(ok)/float64(max(n, 1)), local)
	g, at := longestGap(events, start, finish, definite)
	t.Logf("longest stretch without a definite answer: %v (from %.1fs)", g.Round(time.Millisecond), at.Sub(start).Seconds())
	g, at = longestGap(events, start, finish, func(e robustEvent) bool { return written(e) || inQuorumLoss(e.ret) })
	t.Logf("longest stretch without an acknowledged write, quorum losses aside: %v (from %.1fs)", g.Round(time.Millisecond), at.Sub(start).Seconds())
	for _, f := range faults {
		var in []robustEvent
		for _, e := range events {
			if !e.call.Before(f.start) && e.call.Before(f.end) {
				in = append(in, e)
			}
		}
		k, w := 0, 0
		for _, e := range in {
			if definite(e) {
				k++
			}
			if written(e) {
				w++
			}
		}
		g, _ := longestGap(in, f.start, f.end, definite)
		t.Logf("  %-10s %5.1fs: %4d operations, %5.1f%% definite, %4d writes acknowledged, longest gap %v",
			f.what, f.end.Sub(f.start).Seconds(), len(in), 100*float64(k)/float64(max(len(in), 1)), w, g.Round(time.Millisecond))
	}
}

// robustMinority checks the partitions. A write through a cut-off node,
// or through any node while two are cut off (no quorum anywhere), cannot
// commit before the heal, so none may be acknowledged before it. And in a
// quorum loss, a write that reaches a node fails cleanly — an answer, 503
// MetadataUnavailable, within the documented 10 s (2 s of slack for a
// loaded machine) — instead of hanging. (Writes over the bridge to a
// cut-off node never reach it: not counted.)
// This holds for writes that name an existing volume or snapshot (delete,
// snapshot create) too: their name lookup falls back to the local copy
// after 3 s and marks the quorum lost, and a workflow lock is then refused
// at once instead of waited for.
//
// Once a node on the side without quorum has shown that it knows (it
// answered a request of the fault with 503 MetadataUnavailable, or from its
// own copy), the documented bound is 3 s (6 s with the slack: CI machines are loaded): every write
// reaching it from then until 1 s before the heal is held to that, the
// cut-off node of a one-node cut included. Before, only the writes called
// early enough for 12 s to pass before the heal were timed — those of the
// first 1.5 s of a 14 s quorum loss, none of a one-node cut — so a node
// that, once it knew the loss, made writes wait for the quorum instead of
// failing them passed: they hung until the heal and were then acknowledged.
func robustMinority(t *testing.T, events []robustEvent, faults []fault) {
	const limit = 12 * time.Second
	const knownLimit = 6 * time.Second
	for _, f := range faults {
		if !strings.HasPrefix(f.what, "cut") {
			continue
		}
		// Writes called just before the cut may still commit.
		settled := f.start.Add(500 * time.Millisecond)
		minority := func(e robustEvent) bool { return f.quorum || slices.Contains(f.nodes, e.node) }
		reached := func(e robustEvent) bool { return e.inside || !slices.Contains(f.nodes, e.node) }
		// When each node without quorum first showed it knew.
		known := map[int]time.Time{}
		for _, e := range events {
			if e.call.Before(settled) || e.ret.After(f.end) || !minority(e) || !reached(e) {
				continue
			}
			if e.a.Local || (e.a.Status == 503 && e.a.Code == "MetadataUnavailable") {
				if k, ok := known[e.node]; !ok || e.ret.Before(k) {
					known[e.node] = e.ret
				}
			}
		}
		refused, acked, slow, fast := 0, 0, 0, 0
		for _, e := range events {
			if !e.op.write() || e.call.Before(settled) || e.call.After(f.end) {
				continue
			}
			if minority(e) && !e.ret.After(f.end) && e.a.Status >= 200 && e.a.Status < 300 {
				acked++
				t.Errorf("%s: %s(%s) through n%d acknowledged %v into the partition, before the heal: %s",
					f.what, e.op.Kind, e.op.Name, e.node+1, e.ret.Sub(f.start).Round(time.Millisecond), e.a.Body)
			}
			if !minority(e) || !reached(e) || e.drop == dropNotSent {
				continue
			}
			took := e.ret.Sub(e.call).Round(time.Millisecond)
			clean := (e.a.Status == 503 && e.a.Code == "MetadataUnavailable") || e.drop == dropLocal
			if k, ok := known[e.node]; ok && !e.call.Before(k) && !e.call.After(f.end.Add(-time.Second)) {
				// A write still under way at the heal may get a definite
				// answer after it, from the healed quorum: committed, or
				// refused by a linearizable read (404, 409) — the history
				// check covers those.
				healedOK := e.ret.After(f.end) && e.drop == "" && e.out.Res != outUnknown
				if (clean || healedOK) && took <= knownLimit {
					fast++
					continue
				}
				slow++
				t.Errorf("%s: %s(%s) through n%d, %v after n%d showed it knew the quorum was lost: HTTP %d %s (local %v) after %v, %v after the heal (%v), want 503 MetadataUnavailable within %v",
					f.what, e.op.Kind, e.op.Name, e.node+1, e.call.Sub(k).Round(time.Millisecond), e.node+1, e.a.Status, e.a.Code, e.a.Local,
					took, e.ret.Sub(f.end).Round(time.Millisecond), e.a.Err, knownLimit)
				continue
			}
			if !f.quorum || e.call.Add(limit).After(f.end) {
				continue
			}
			switch {
			case clean && took <= limit:
				if e.a.Status == 503 {
					refused++
				}
				// Else a 404 or 409 from the node's own copy: no change made.
			default:
				slow++
				msg := fmt.Sprintf("quorum loss (%s): %s(%s) through n%d: HTTP %d %s after %v (%v), want 503 MetadataUnavailable within %v",
					f.what, e.op.Kind, e.op.Name, e.node+1, e.a.Status, e.a.Code, took, e.a.Err, limit)
				t.Error(msg)
			}
		}
		t.Logf("%s (%.0fs): %d writes refused cleanly within %v, %d within %v of the loss being known, %d acknowledged before the heal, %d slow or failed otherwise",
			f.what, f.end.Sub(f.start).Seconds(), refused, limit, fast, knownLimit, acked, slow)
		if f.quorum && refused+fast == 0 {
			t.Errorf("quorum loss (%s): no write was seen failing: nothing was checked", f.what)
		}
	}
}

// injectStaleRead adds a read that a correct store cannot give: after a
// create acknowledged with id X and a delete of that name called after the
// create returned, a read of the name answers X again. Only that create
// ever made X, and it is linearized before the delete, so nothing can
// bring X back — whatever else (pending operations included) the history
// holds.
func injectStaleRead(t *testing.T, ops []porcupine.Operation) []porcupine.Operation {
	for _, c := range ops {
		cin, cout := c.Input.(robustOp), c.Output.(robustOut)
		if cin.Kind != "vcreate" || cout.Res != outOK {
			continue
		}
		for _, d := range ops {
			din := d.Input.(robustOp)
			if din.Kind == "vdelete" && din.Name == cin.Name && d.Output.(robustOut).Res == outOK && d.Call > c.Return {
				stale := porcupine.Operation{ClientId: c.ClientId, Input: robustOp{Kind: "vget", Name: cin.Name},
					Output: robustOut{Res: outOK, ID: cout.ID}, Call: d.Return + 1, Return: d.Return + 2}
				t.Logf("injected a stale read: vget(%s) -> %s at %.3fs, after the delete that returned at %.3fs",
					cin.Name, cout.ID, float64(stale.Call)/1e9, float64(d.Return)/1e9)
				return append(ops, stale)
			}
		}
	}
	t.Fatal("no acknowledged create followed by an acknowledged delete to build a stale read on")
	return nil
}

// TestRobustModel: the model accepts what a correct store may answer —
// including creates of unknown outcome that take effect late — and rejects
// stale reads, so the check above can fail.
func TestRobustModel(t *testing.T) {
	op := func(kind, res, id string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: robustOp{Kind: kind, Name: "x"}, Output: robustOut{Res: res, ID: id}, Call: call, Return: ret}
	}
	const inf = math.MaxInt64
	for _, c := range []struct {
		what string
		ok   bool
		h    []porcupine.Operation
	}{
		{"create, read, snapshot, delete, read", true, []porcupine.Operation{
			op("vcreate", outOK, "A", 0, 10), op("vget", outOK, "A", 11, 20), op("screate", outOK, "A", 21, 30),
			op("vdelete", outOK, "", 31, 40), op("vget", outAbsent, "", 41, 50), op("sget", outOK, "A", 51, 60),
			op("screate", outAbsent, "", 61, 70), op("vcreate", outOK, "B", 71, 80), op("screate", outExists, "", 81, 90)}},
		{"a read misses an acknowledged create", false, []porcupine.Operation{
			op("vcreate", outOK, "A", 0, 10), op("vget", outAbsent, "", 11, 20)}},
		{"a read sees a deleted incarnation after a new create", false, []porcupine.Operation{
			op("vcreate", outOK, "A", 0, 10), op("vdelete", outOK, "", 11, 20), op("vcreate", outOK, "B", 21, 30),
			op("vget", outOK, "A", 31, 40)}},
		{"a snapshot of another incarnation", false, []porcupine.Operation{
			op("vcreate", outOK, "A", 0, 10), op("vdelete", outOK, "", 11, 20), op("vcreate", outOK, "B", 21, 30),
			op("screate", outOK, "A", 31, 40)}},
		{"a create of unknown outcome takes effect late", true, []porcupine.Operation{
			op("vcreate", outUnknown, "", 0, inf), op("vget", outAbsent, "", 11, 20), op("vget", outOK, "C", 21, 30),
			op("vcreate", outExists, "", 31, 40)}},
		{"an unseen id read back after its delete", false, []porcupine.Operation{
			op("vcreate", outUnknown, "", 0, inf), op("vcreate", outUnknown, "", 1, inf), op("vget", outOK, "C", 21, 30),
			op("vdelete", outOK, "", 31, 40), op("vget", outOK, "C", 41, 50)}},
		{"a delete of unknown outcome, then a read", true, []porcupine.Operation{
			op("vcreate", outOK, "A", 0, 10), op("vdelete", outUnknown, "", 11, inf), op("vget", outOK, "A", 21, 30),
			op("vget", outAbsent, "", 31, 40)}},
		// An answer 2xx whose body names no id (a handler encoding a nil
		// record as null, say) is no evidence of a volume or snapshot;
		// read as id "", it matched the empty state.
		{"a read of an absent volume answered 200 with no id", false, []porcupine.Operation{
			op("vget", outOK, "", 0, 10)}},
		{"a read of an absent snapshot answered 200 with no id", false, []porcupine.Operation{
			op("vcreate", outOK, "A", 0, 10), op("sget", outOK, "", 11, 20)}},
		{"a create acknowledged with no id, then a read misses it", false, []porcupine.Operation{
			op("vcreate", outOK, "", 0, 10), op("vget", outAbsent, "", 11, 20)}},
		{"a snapshot of no volume acknowledged with no id", false, []porcupine.Operation{
			op("screate", outOK, "", 0, 10), op("sget", outAbsent, "", 11, 20)}},
	} {
		got := porcupine.CheckOperations(robustModel(orphansOf(c.h)), c.h)
		if got != c.ok {
			t.Errorf("%s: linearizable = %v, want %v", c.what, got, c.ok)
		}
	}
}
