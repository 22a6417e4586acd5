package e2e

// Clients on a node's side of a partition, and a test of the network lab
// (netlab_test.go) itself: a voter cut off by its veth loses quorum — the
// other two go on writing, it refuses writes and answers reads from its own
// copy, marked as such — and it catches up when its link comes back.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// nsHTTP is a copy of c whose connections start inside network namespace
// ns: a client on that node's side of a partition. It still reaches the
// node while the node's link is cut, when the root namespace cannot.
func nsHTTP(c *http.Client, ns string) *http.Client {
	tr := c.Transport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialIn(ctx, ns, network, addr)
	}
	cc := *c
	cc.Transport = tr
	return &cc
}

// dialIn dials from inside namespace ns. A socket belongs to the namespace
// of the thread that creates it, so the dial runs on a goroutine locked to
// an OS thread moved into ns. That goroutine never unlocks: the runtime then
// ends the thread with it rather than reuse it, still in ns, for other
// goroutines. (A dial of one IP literal makes its socket on the calling
// goroutine; only dual-stack names race dials on other goroutines.)
func dialIn(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open(filepath.Join("/run/netns", ns))
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		if err != nil {
			ch <- result{nil, &net.OpError{Op: "dial", Net: network, Err: err}}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// apiAnswer is one HTTP exchange with the control API.
type apiAnswer struct {
	Status int    // 0: no answer (Err)
	Code   string // the error code of an error body
	Local  bool   // Basalt-Read: local — served from the node's own copy
	Body   []byte
	Took   time.Duration
	Err    error
}

// apiDo sends one request; unlike call it reports a transport error
// instead of failing the test, and keeps the read marker.
func apiDo(c *http.Client, method, url, body string) apiAnswer {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return apiAnswer{Err: err}
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return apiAnswer{Err: err, Took: time.Since(start)}
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	a := apiAnswer{Status: resp.StatusCode, Local: resp.Header.Get("Basalt-Read") == "local", Body: data,
		Took: time.Since(start), Err: err}
	var eb ErrorBody
	if json.Unmarshal(data, &eb) == nil {
		a.Code = eb.Error.Code
	}
	return a
}

// neverSent reports whether a transport error came before the request left:
// the connection was never made (the harness's clients use one connection
// per request), so the request had no effect.
func neverSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func TestNetnsPartition(t *testing.T) {
	t.Parallel()
	c, lab := StartNetCluster(t, 3)
	hc := identityHTTP(t, c.Nodes[0].AdminDir())
	hc.Timeout = 20 * time.Second
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	in3 := nsHTTP(hc, lab.ns(3)) // a client beside n3, inside the partition
	vol := func(n *Node, name string) string { return n.Endpoint() + "/v1/volumes/" + name }
	create := func(c *http.Client, n *Node, name string) apiAnswer {
		return apiDo(c, "POST", n.Endpoint()+"/v1/volumes", `{"name":"`+name+`","size":"1MiB"}`)
	}
	// mustCreate retries through n while the cluster elects a leader; a
	// retry after an attempt of unknown outcome may find the name taken.
	mustCreate := func(n *Node, name string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		tried := false
		for {
			a := create(hc, n, name)
			if a.Status == 201 || (tried && a.Code == "NameConflict") {
				return time.Since(start)
			}
			if a.Status != 503 && a.Err == nil {
				t.Fatalf("create %s through %s: HTTP %d %s", name, n.opts.Name, a.Status, a.Body)
			}
			if time.Since(start) > within {
				t.Fatalf("create %s through %s: still failing after %v: HTTP %d %s %v", name, n.opts.Name, within, a.Status, a.Body, a.Err)
			}
			tried = tried || !neverSent(a.Err)
			time.Sleep(200 * time.Millisecond)
		}
	}

	mustCreate(n3, "before", 10*time.Second)
	a := apiDo(hc, "GET", vol(n1, "before"), "")
	var before struct {
		ID string `json:"id"`
	}
	if a.Status != 200 || a.Local || json.Unmarshal(a.Body, &before) != nil {
		t.Fatalf("GET before through n1: HTTP %d local=%v %s", a.Status, a.Local, a.Body)
	}

	lab.cut(3)
	cut := time.Now()
	// The cut really drops n3's traffic: the root namespace no longer
	// reaches it at all (a dial that times out or finds no host, not a
	// refused connection from a live peer).
	probe := *hc
	probe.Timeout = 3 * time.Second
	if a := apiDo(&probe, "GET", n3.Endpoint()+"/healthz", ""); a.Err == nil || strings.Contains(a.Err.Error(), "refused") {
		t.Fatalf("n3 still reachable over the bridge after the cut: HTTP %d %v", a.Status, a.Err)
	}

	// The majority side goes on writing (after an election if n3 led).
	took := mustCreate(n1, "during-1", 20*time.Second)
	mustCreate(n2, "during-2", 5*time.Second)
	t.Logf("majority side wrote %v after the cut", took.Round(time.Millisecond))

	// n3 refuses writes, cleanly and in bounded time (docs/cluster.md:
	// ≤ 10 s, then ≤ 3 s while the loss is known).
	for i, limit := range []time.Duration{12 * time.Second, 5 * time.Second} {
		a := create(in3, n3, "isolated")
		if a.Status != 503 || a.Code != "MetadataUnavailable" {
			t.Fatalf("write %d on the cut-off n3: HTTP %d %s %v, want 503 MetadataUnavailable", i+1, a.Status, a.Body, a.Err)
		}
		if a.Took > limit {
			t.Errorf("write %d on the cut-off n3 took %v to fail, want ≤ %v", i+1, a.Took, limit)
		}
		t.Logf("write %d on the cut-off n3 failed with MetadataUnavailable in %v", i+1, a.Took.Round(time.Millisecond))
	}
	// Its reads go on from its own copy, and say so.
	if a := apiDo(in3, "GET", vol(n3, before.ID), ""); a.Status != 200 || !a.Local {
		t.Fatalf("GET %s (before) on the cut-off n3: HTTP %d local=%v %s %v, want 200 marked Basalt-Read: local",
			before.ID, a.Status, a.Local, a.Body, a.Err)
	}
	// So do reads by name (the name lookup falls back to the local copy).
	if a := apiDo(in3, "GET", vol(n3, "before"), ""); a.Status != 200 || !a.Local {
		t.Errorf("GET before (by name) on the cut-off n3: HTTP %d %s local=%v after %v, want 200 marked Basalt-Read: local",
			a.Status, a.Code, a.Local, a.Took.Round(time.Millisecond))
	}

	lab.heal(3)
	healed := time.Now()
	// n3 catches up: through the bridge again, linearizable reads (no
	// marker) see what the majority wrote while it was away. Not at once:
	// etcd's peer connections carry messages again when TCP retransmits,
	// up to about the partition's length after the heal with the kernel's
	// default tcp_rto_max_ms (docs/cluster.md), and the partition lasts
	// longer on a loaded machine.
	catchUp := 30*time.Second + healed.Sub(cut)
	for _, name := range []string{"during-1", "during-2"} {
		for {
			a := apiDo(hc, "GET", vol(n3, name), "")
			if a.Status == 200 && !a.Local {
				break
			}
			if time.Since(healed) > catchUp {
				t.Fatalf("GET %s through n3 %v after the heal (the partition lasted %v): HTTP %d local=%v %s %v",
					name, catchUp.Round(time.Second), healed.Sub(cut).Round(time.Millisecond), a.Status, a.Local, a.Body, a.Err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t.Logf("n3 read the majority's writes %v after the heal", time.Since(healed).Round(time.Millisecond))
	mustCreate(n3, "after", 20*time.Second)
	if a := apiDo(hc, "GET", vol(n1, "after"), ""); a.Status != 200 {
		t.Fatalf("GET after through n1: HTTP %d %s", a.Status, a.Body)
	}
	// A write refused with MetadataUnavailable has an unknown outcome in
	// general (it may still commit later), so it is only reported.
	a = apiDo(hc, "GET", vol(n1, "isolated"), "")
	t.Logf("the refused write on n3 afterwards: HTTP %d (404: it left no trace)", a.Status)
	c.WaitRoles(60*time.Second, nil)
}
