package e2e

// Robustness: a 3-node cluster (each node in its own network namespace)
// serves a mix of control operations through all nodes while a nemesis
// kills, restarts, cuts off and reconnects nodes in turn. The recorded
// history is checked for linearizability with porcupine against a model of
// the API, and the availability is printed.
//
// Short form in `make test`; BASALT_ROBUST_DURATION=5m (say) runs longer.

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The model: volumes by name, each existing or not. Operations are
// create, delete and get by name; a name is its own partition.
type robustOp struct {
	Kind string // create, delete, get
	Name string
}

// Outcomes. unknown: the write may or may not have taken effect (a
// timeout, a lost connection, 503 after the request was sent).
const (
	outOK       = "ok"
	outExists   = "exists"    // create: 409 NameConflict
	outNotFound = "not-found" // delete, get: 404
	outUnknown  = "unknown"
)

var volumeModel = porcupine.Model{
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
	Init: func() any { return false },
	Step: func(state, input, output any) (bool, any) {
		exists, in, out := state.(bool), input.(robustOp), output.(string)
		switch in.Kind {
		case "create":
			switch out {
			case outOK:
				return !exists, true
			case outExists:
				return exists, exists
			case outUnknown:
				return true, true // as if it happened (it returns at infinity)
			}
		case "delete":
			switch out {
			case outOK:
				return exists, false
			case outNotFound:
				return !exists, false
			case outUnknown:
				return true, false
			}
		case "get":
			switch out {
			case outOK:
				return exists, exists
			case outNotFound:
				return !exists, exists
			}
		}
		return false, state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(robustOp)
		return fmt.Sprintf("%s(%s) -> %s", in.Kind, in.Name, output)
	},
	DescribeState: func(state any) string { return fmt.Sprint(state) },
}

type robustRecorder struct {
	mu      sync.Mutex
	start   time.Time
	ops     []porcupine.Operation
	total   int
	ok      int       // definite outcomes
	local   int       // reads answered from a node's local copy: left out
	lastOK  time.Time // for the longest stretch without a success
	longest time.Duration
}

func (r *robustRecorder) add(client int, op robustOp, call, ret time.Time, out string, local bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total++
	if local {
		r.local++
		return
	}
	o := porcupine.Operation{ClientId: client, Input: op, Call: call.Sub(r.start).Nanoseconds(), Output: out,
		Return: ret.Sub(r.start).Nanoseconds()}
	if out == outUnknown {
		if op.Kind == "get" {
			return // a read that failed says nothing
		}
		o.Return = math.MaxInt64
	} else {
		r.ok++
		if gap := ret.Sub(r.lastOK); gap > r.longest {
			r.longest = gap
		}
		r.lastOK = ret
	}
	r.ops = append(r.ops, o)
}

// do runs op through node n and classifies the answer.
func robustDo(hc *http.Client, n *Node, op robustOp) (out string, local bool) {
	var req *http.Request
	switch op.Kind {
	case "create":
		req, _ = http.NewRequest("POST", n.Endpoint()+"/v1/volumes", strings.NewReader(`{"name":"`+op.Name+`","size":"1MiB"}`))
	case "delete":
		req, _ = http.NewRequest("DELETE", n.Endpoint()+"/v1/volumes/"+op.Name, nil)
	case "get":
		req, _ = http.NewRequest("GET", n.Endpoint()+"/v1/volumes/"+op.Name, nil)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return outUnknown, false
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	local = resp.Header.Get("Basalt-Read") == "local"
	switch {
	case resp.StatusCode < 300:
		return outOK, local
	case resp.StatusCode == 409 && strings.Contains(string(body), "NameConflict"):
		return outExists, local
	case resp.StatusCode == 404 && strings.Contains(string(body), `"NotFound"`):
		return outNotFound, local
	case resp.StatusCode == 409 && op.Kind != "create":
		// VolumeBusy: refused before any change (a workflow lock, an
		// attachment): it took no effect.
		return "", local
	}
	return outUnknown, local
}

func TestRobustCluster(t *testing.T) {
	t.Parallel()
	duration := 40 * time.Second
	if d, err := time.ParseDuration(os.Getenv("BASALT_ROBUST_DURATION")); err == nil {
		duration = d
	}
	c, lab := StartNetCluster(t, 3)
	hc := identityHTTP(t, c.Nodes[0].AdminDir())
	hc.Timeout = 8 * time.Second
	rec := &robustRecorder{start: time.Now()}
	rec.lastOK = rec.start
	names := []string{"r0", "r1", "r2", "r3", "r4", "r5"}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for client := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(client), 7))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				op := robustOp{Name: names[rng.IntN(len(names))]}
				switch k := rng.IntN(10); {
				case k < 4:
					op.Kind = "create"
				case k < 7:
					op.Kind = "delete"
				default:
					op.Kind = "get"
				}
				n := c.Nodes[(client+i)%len(c.Nodes)]
				call := time.Now()
				out, local := robustDo(hc, n, op)
				if out == "" {
					continue // refused, no effect: nothing to check
				}
				rec.add(client, op, call, time.Now(), out, local)
			}
		}()
	}

	// The nemesis: one fault at a time, each node in turn.
	end := time.Now().Add(duration)
	var faults []string
	for k := 0; time.Now().Before(end); k++ {
		i := k % 3
		n := c.Nodes[i]
		if k%2 == 0 {
			faults = append(faults, "kill "+n.opts.Name)
			n.Kill()
			time.Sleep(4 * time.Second)
			n.Restart()
		} else {
			faults = append(faults, "partition "+n.opts.Name)
			lab.cut(i + 1)
			time.Sleep(6 * time.Second)
			lab.heal(i + 1)
		}
		time.Sleep(3 * time.Second)
	}
	close(stop)
	wg.Wait()

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if gap := time.Since(rec.lastOK); gap > rec.longest {
		rec.longest = gap
	}
	sort.Slice(rec.ops, func(a, b int) bool { return rec.ops[a].Call < rec.ops[b].Call })
	t.Logf("nemesis: %s", strings.Join(faults, ", "))
	t.Logf("operations: %d, with a definite outcome %d (%.1f%%), reads from a local copy left out %d; longest stretch without a success %v",
		rec.total, rec.ok, 100*float64(rec.ok)/float64(max(rec.total, 1)), rec.local, rec.longest.Round(time.Millisecond))
	if rec.ok < 50 {
		t.Fatalf("only %d operations succeeded: the cluster was not available enough to test", rec.ok)
	}
	res, info := porcupine.CheckOperationsVerbose(volumeModel, rec.ops, 60*time.Second)
	switch res {
	case porcupine.Ok:
		t.Logf("porcupine: linearizable (%d operations checked)", len(rec.ops))
	case porcupine.Illegal:
		path := filepath.Join(os.TempDir(), fmt.Sprintf("basalt-robust-%d.html", time.Now().UnixNano()))
		porcupine.VisualizePath(volumeModel, info, path)
		t.Fatalf("porcupine: NOT linearizable; visualization: %s", path)
	default:
		t.Logf("porcupine: check timed out (inconclusive)")
	}
}

// TestRobustModelCatchesViolations: the model rejects a history a broken
// store could produce — a get that misses a create acknowledged before it
// — so the check above can fail.
func TestRobustModelCatchesViolations(t *testing.T) {
	op := func(kind, out string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: robustOp{Kind: kind, Name: "x"}, Output: out, Call: call, Return: ret}
	}
	good := []porcupine.Operation{op("create", outOK, 0, 10), op("get", outOK, 11, 20), op("delete", outOK, 21, 30), op("get", outNotFound, 31, 40)}
	if !porcupine.CheckOperations(volumeModel, good) {
		t.Fatal("a linearizable history was rejected")
	}
	stale := []porcupine.Operation{op("create", outOK, 0, 10), op("get", outNotFound, 11, 20)}
	if porcupine.CheckOperations(volumeModel, stale) {
		t.Fatal("a stale read after an acknowledged create was accepted")
	}
	unknown := []porcupine.Operation{op("create", outUnknown, 0, math.MaxInt64), op("get", outNotFound, 11, 20), op("get", outOK, 21, 30)}
	if !porcupine.CheckOperations(volumeModel, unknown) {
		t.Fatal("a create of unknown outcome that took effect late was rejected")
	}
}
