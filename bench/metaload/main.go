// Command metaload is the load generator of bench/meta.sh: control-plane
// latency of basalt nodes, one request at a time.
//
//	metaload -mode bench -config targets.json -rounds 5 -writes 20 -reads 100 -raw 50
//	metaload -mode leader -pki DATA/pki URL...    # which etcd member leads
//
// targets.json lists the nodes to drive, each with the admin identity of
// its cluster and, optionally, what lets metaload look at its etcd (the
// node's pki directory, its own member, every member) and the processes
// of its cluster (for their CPU time):
//
//	[{"name": "single", "api": "https://127.0.0.1:8443", "identity": "DATA/identities/admin",
//	  "pki": "DATA/pki", "member": "https://127.0.0.1:2379", "etcd": ["https://127.0.0.1:2379"],
//	  "metrics": ["https://127.0.0.1:2381"], "pids": [4242]}]
//
// Per round, the targets take turns (in an order that rotates from round to
// round, so a machine whose speed drifts favours none) and each runs:
//
//   - writes: -writes sequential create + delete of a 1 MiB volume; the
//     pair, the create and the delete are timed. Around them the etcd
//     metrics of every member in "etcd" are read, so that the output says
//     what one pair cost etcd: Raft proposals, Range and Txn RPCs (and
//     the share the node's own member served), WAL fsyncs and their time;
//     and the CPU time of the "pids" per pair.
//   - reads: -reads GET /v1/volumes/{id}, then -reads more with
//     "Basalt-Consistency: stale", on a volume made for it; the answers'
//     "Basalt-Read: local" header is counted (a stale read must carry it,
//     a linearizable one must not), and the members' Range and Txn RPCs
//     during the stale reads, split into the receiving node's own member
//     and the others.
//   - raw: -raw etcd Puts, linearizable Gets and serializable Gets, and
//     -raw/5 replays of the etcd requests of one create + delete (with
//     linearizable reads, then with serializable ones), through the node's
//     own member ("member", with the node's certificate from "pki"): the
//     floor under the API's numbers.
//
// The first round is preceded by a few unmeasured operations per target
// (connections, TLS, caches). One JSON object is printed: per target,
// latency summaries in milliseconds and the per-pair etcd costs. Any
// failed request makes the exit status 1 (after the JSON).
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/pki"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// Target is one node to drive.
type Target struct {
	Name     string   `json:"name"`
	API      string   `json:"api"`
	Identity string   `json:"identity"`
	PKI      string   `json:"pki,omitempty"`
	Member   string   `json:"member,omitempty"`
	Etcd     []string `json:"etcd,omitempty"`
	// Metrics are the members' /metrics URLs, in Etcd's order, where
	// they are not on the client URLs (basalt's embedded members).
	Metrics []string `json:"metrics,omitempty"`
	// PIDs are the processes of the target's nodes (all of its cluster):
	// their CPU time during the writes is reported per pair.
	PIDs []int `json:"pids,omitempty"`

	http *http.Client
	etcd *clientv3.Client // the node's own member only
	mtls *http.Client     // /metrics of the members
	vol  string           // the volume the reads read
	res  *Result
}

// Stats summarises latencies in milliseconds.
type Stats struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
	Mean float64 `json:"mean_ms"`
	Min  float64 `json:"min_ms"`
	Max  float64 `json:"max_ms"`
}

// Cost is what one create + delete pair cost etcd, summed over members
// (Proposals: as the most advanced member counts them).
type Cost struct {
	Proposals   float64 `json:"proposals"`
	RangeRPCs   float64 `json:"range_rpcs"`
	TxnRPCs     float64 `json:"txn_rpcs"`
	WALFsyncs   float64 `json:"wal_fsyncs"`
	WALFsyncMs  float64 `json:"wal_fsync_mean_ms"`
	BackendMs   float64 `json:"backend_commit_mean_ms"`
	PeerBytesKB float64 `json:"peer_sent_kb"`
	// OwnMember is the share of those Range and Txn RPCs that the
	// receiving node's own member served (basalt's etcd client spreads
	// its requests over the members it knows).
	OwnMember float64 `json:"rpcs_own_member_share"`
	// CPUms is the CPU time of all the target's nodes (pids).
	CPUms float64 `json:"cpu_ms"`
}

// Result is one target's output.
type Result struct {
	Name        string `json:"name"`
	Write       Stats  `json:"write"`
	Create      Stats  `json:"create"`
	Delete      Stats  `json:"delete"`
	ReadLinear  Stats  `json:"read_linear"`
	ReadStale   Stats  `json:"read_stale"`
	StaleLocal  int    `json:"stale_answers_local"`
	LinearLocal int    `json:"linear_answers_local"`
	// etcd RPCs per stale read served by the receiving node's own
	// member and by the others (0: no other member was asked).
	StaleRPCsOwn  *float64 `json:"stale_rpcs_own_member,omitempty"`
	StaleRPCsElse *float64 `json:"stale_rpcs_other_members,omitempty"`
	RawPut        *Stats   `json:"raw_put,omitempty"`
	RawGetLinear  *Stats   `json:"raw_get_linear,omitempty"`
	RawGetSerial  *Stats   `json:"raw_get_serializable,omitempty"`
	// The etcd requests of one create + delete replayed (pairShape).
	RawPair       *Stats `json:"raw_pair,omitempty"`
	RawPairSerial *Stats `json:"raw_pair_serializable_reads,omitempty"`
	Cost          *Cost  `json:"cost_per_write,omitempty"`
	Errors        int    `json:"errors"`
	FirstError    string `json:"first_error,omitempty"`

	write, create, del, rlin, rstale, rput, rgl, rgs []time.Duration
	rpair, rpairS                                    []time.Duration
	pairs                                            int
	delta, staleDelta                                map[string]float64
}

func main() {
	var (
		mode   = flag.String("mode", "bench", "bench or leader")
		config = flag.String("config", "", "targets JSON (bench)")
		rounds = flag.Int("rounds", 5, "rounds")
		writes = flag.Int("writes", 20, "create + delete pairs per target and round")
		reads  = flag.Int("reads", 100, "GETs of each consistency per target and round")
		raw    = flag.Int("raw", 50, "raw etcd operations of each kind per target and round (0: none)")
		pkiDir = flag.String("pki", "", "a node's pki directory (leader)")
	)
	flag.Parse()
	switch *mode {
	case "leader":
		url, err := leader(*pkiDir, flag.Args())
		if err != nil {
			fmt.Fprintln(os.Stderr, "metaload:", err)
			os.Exit(1)
		}
		fmt.Println(url)
	case "bench":
		os.Exit(bench(*config, *rounds, *writes, *reads, *raw))
	default:
		fmt.Fprintln(os.Stderr, "metaload: -mode is bench or leader")
		os.Exit(2)
	}
}

// etcdTLS is a node's own certificate, which its etcd member accepts.
func etcdTLS(dir string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"))
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s/ca.pem holds no certificate", dir)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

func dial(dir string, endpoints ...string) (*clientv3.Client, error) {
	tc, err := etcdTLS(dir)
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: tc, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// leader prints the client URL of the member that leads, asking each.
func leader(dir string, urls []string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var lastErr error
	for _, u := range urls {
		cli, err := dial(dir, u)
		if err != nil {
			lastErr = err
			continue
		}
		st, err := cli.Status(ctx, u)
		cli.Close()
		if err != nil {
			lastErr = err
			continue
		}
		if st.Leader != 0 && st.Header.MemberId == st.Leader {
			return u, nil
		}
	}
	return "", fmt.Errorf("no member of %v says it leads (last error: %v)", urls, lastErr)
}

func bench(config string, rounds, writes, reads, raw int) int {
	b, err := os.ReadFile(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "metaload:", err)
		return 2
	}
	var ts []*Target
	if err := json.Unmarshal(b, &ts); err != nil || len(ts) == 0 {
		fmt.Fprintf(os.Stderr, "metaload: %s: want a JSON list of targets (%v)\n", config, err)
		return 2
	}
	ctx := context.Background()
	for _, t := range ts {
		if err := t.open(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "metaload: %s: %v\n", t.Name, err)
			return 1
		}
		defer t.close(ctx)
	}
	// Warm up: connections, TLS sessions, the nodes' caches.
	for _, t := range ts {
		for range 3 {
			t.pair(ctx, false)
			t.get(ctx, false, false)
			t.get(ctx, true, false)
		}
	}
	order := slices.Clone(ts)
	for range rounds {
		for _, t := range order {
			before := t.metrics(ctx)
			for range writes {
				t.pair(ctx, true)
			}
			if before != nil {
				if after := t.metrics(ctx); after != nil {
					for k, v := range after {
						t.res.delta[k] += v - before[k]
					}
					t.res.pairs += writes
				}
			}
			for range reads {
				t.get(ctx, false, true)
			}
			before = t.metrics(ctx)
			for range reads {
				t.get(ctx, true, true)
			}
			if before != nil {
				if after := t.metrics(ctx); after != nil {
					for k, v := range after {
						t.res.staleDelta[k] += v - before[k]
					}
				}
			}
			if raw > 0 && t.etcd != nil {
				t.rawOps(ctx, raw)
			}
		}
		order = append(order[1:], order[0])
	}
	out := struct {
		Rounds  int       `json:"rounds"`
		Writes  int       `json:"writes_per_round"`
		Reads   int       `json:"reads_per_round"`
		Raw     int       `json:"raw_per_round"`
		Targets []*Result `json:"targets"`
	}{rounds, writes, reads, raw, nil}
	failed := false
	for _, t := range ts {
		r := t.res
		r.Write, r.Create, r.Delete = summarize(r.write), summarize(r.create), summarize(r.del)
		r.ReadLinear, r.ReadStale = summarize(r.rlin), summarize(r.rstale)
		if len(r.rput) > 0 {
			p, gl, gs := summarize(r.rput), summarize(r.rgl), summarize(r.rgs)
			r.RawPut, r.RawGetLinear, r.RawGetSerial = &p, &gl, &gs
			rp, rps := summarize(r.rpair), summarize(r.rpairS)
			r.RawPair, r.RawPairSerial = &rp, &rps
		}
		if r.pairs > 0 {
			r.Cost = r.cost()
		}
		if n := float64(len(r.rstale)); n > 0 && t.Member != "" && r.staleDelta != nil {
			own := (r.staleDelta["range"] + r.staleDelta["txn"] - r.staleDelta["remote:range"] - r.staleDelta["remote:txn"]) / n
			remote := (r.staleDelta["remote:range"] + r.staleDelta["remote:txn"]) / n
			r.StaleRPCsOwn, r.StaleRPCsElse = &own, &remote
		}
		failed = failed || r.Errors > 0
		out.Targets = append(out.Targets, r)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(out)
	if failed {
		return 1
	}
	return 0
}

func (t *Target) open(ctx context.Context) error {
	t.res = &Result{Name: t.Name, delta: map[string]float64{}, staleDelta: map[string]float64{}}
	id, err := pki.LoadIdentity(t.Identity)
	if err != nil {
		return err
	}
	tc, err := id.ClientTLS()
	if err != nil {
		return err
	}
	t.http = &http.Client{Timeout: 60 * time.Second,
		Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}}
	if t.PKI != "" {
		etc, err := etcdTLS(t.PKI)
		if err != nil {
			return err
		}
		t.mtls = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: etc}}
		if t.Member != "" {
			if t.etcd, err = dial(t.PKI, t.Member); err != nil {
				return err
			}
		}
	}
	v, err := t.create(ctx, "metabench-read-"+t.Name)
	if err != nil {
		return fmt.Errorf("create the read volume: %w", err)
	}
	t.vol = v
	return nil
}

func (t *Target) close(ctx context.Context) {
	if t.vol != "" {
		t.call(ctx, "DELETE", "/v1/volumes/"+t.vol, nil, false)
	}
	if t.etcd != nil {
		t.etcd.Delete(ctx, rawPrefix, clientv3.WithPrefix())
		t.etcd.Close()
	}
}

func (t *Target) fail(err error) {
	if t.res.Errors == 0 {
		t.res.FirstError = err.Error()
	}
	t.res.Errors++
}

// call sends one request; it returns the body of a 2xx answer and
// whether the answer says it came from the local copy.
func (t *Target) call(ctx context.Context, method, path string, in any, stale bool) ([]byte, bool, error) {
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, t.API+path, body)
	if err != nil {
		return nil, false, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if stale {
		req.Header.Set(headerConsistency, "stale")
	}
	resp, err := t.http.Do(req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, false, err
	}
	if resp.StatusCode >= 300 {
		return nil, false, fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return data, resp.Header.Get(headerRead) == "local", nil
}

var seq int

// The read consistency headers (docs/api.md; internal/api, not imported so
// that metaload builds while the server's packages are being edited).
const (
	headerConsistency = "Basalt-Consistency"
	headerRead        = "Basalt-Read"
)

func (t *Target) create(ctx context.Context, name string) (string, error) {
	data, _, err := t.call(ctx, "POST", "/v1/volumes", map[string]string{"name": name, "size": "1MiB"}, false)
	if err != nil {
		return "", err
	}
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return "", err
	}
	return v.ID, nil
}

// pair creates and deletes a volume.
func (t *Target) pair(ctx context.Context, record bool) {
	seq++
	start := time.Now()
	id, err := t.create(ctx, fmt.Sprintf("metabench-%s-%d", t.Name, seq))
	if err != nil {
		t.fail(err)
		return
	}
	mid := time.Now()
	if _, _, err := t.call(ctx, "DELETE", "/v1/volumes/"+id, nil, false); err != nil {
		t.fail(err)
		return
	}
	end := time.Now()
	if record {
		t.res.create = append(t.res.create, mid.Sub(start))
		t.res.del = append(t.res.del, end.Sub(mid))
		t.res.write = append(t.res.write, end.Sub(start))
	}
}

func (t *Target) get(ctx context.Context, stale, record bool) {
	start := time.Now()
	_, local, err := t.call(ctx, "GET", "/v1/volumes/"+t.vol, nil, stale)
	took := time.Since(start)
	if err != nil {
		t.fail(err)
		return
	}
	if !record {
		return
	}
	if stale {
		t.res.rstale = append(t.res.rstale, took)
		if local {
			t.res.StaleLocal++
		}
	} else {
		t.res.rlin = append(t.res.rlin, took)
		if local {
			t.res.LinearLocal++
		}
	}
}

const rawPrefix = "/metabench/"

func (t *Target) rawOps(ctx context.Context, n int) {
	key := rawPrefix + t.Name
	val := strings.Repeat("x", 512) // about a volume record's size
	timed := func(into *[]time.Duration, f func() error) {
		start := time.Now()
		if err := f(); err != nil {
			t.fail(fmt.Errorf("raw etcd: %w", err))
			return
		}
		*into = append(*into, time.Since(start))
	}
	for range n {
		timed(&t.res.rput, func() error { _, err := t.etcd.Put(ctx, key, val); return err })
		timed(&t.res.rgl, func() error { _, err := t.etcd.Get(ctx, key); return err })
		timed(&t.res.rgs, func() error { _, err := t.etcd.Get(ctx, key, clientv3.WithSerializable()); return err })
	}
	for range max(1, n/5) {
		timed(&t.res.rpair, func() error { return t.pairShape(ctx, false) })
		timed(&t.res.rpairS, func() error { return t.pairShape(ctx, true) })
	}
}

// pairShape replays, on keys of its own, the etcd requests basalt makes
// for one volume create + delete (2 Raft proposals: the record written
// available, the record deleted; the transactions' reads, the delete's
// look at the lock queue and the collection's lists of snapshots and
// volumes), one at a time, through the node's own member. serial makes every read
// serializable (answered by the member alone; the STM commits still
// compare the mod revisions of what they read): what the pair would cost
// if no read waited for the leader.
func (t *Target) pairShape(ctx context.Context, serial bool) error {
	k := func(s string) string { return rawPrefix + t.Name + "/" + s }
	name, prov, vol := k("name"), k("provisioned"), k("volume")
	val := strings.Repeat("x", 512)
	var gopts []clientv3.OpOption
	iso := concurrency.SerializableSnapshot
	if serial {
		gopts, iso = []clientv3.OpOption{clientv3.WithSerializable()}, concurrency.RepeatableReads
	}
	get := func(key string, o ...clientv3.OpOption) error {
		_, err := t.etcd.Get(ctx, key, append(o, gopts...)...)
		return err
	}
	stm := func(f func(concurrency.STM)) error {
		_, err := concurrency.NewSTM(t.etcd, func(s concurrency.STM) error { f(s); return nil },
			concurrency.WithIsolation(iso), concurrency.WithAbortContext(ctx))
		return err
	}
	steps := []func() error{
		// create (the caller is authenticated from the node's user mirror;
		// the stack is built before the one transaction)
		func() error { // the record, its name, capacity
			return stm(func(s concurrency.STM) { s.Get(name); s.Get(prov); s.Put(name, val); s.Put(prov, "1"); s.Put(vol, val) })
		},
		// delete (the volume resolved inside its transaction)
		func() error { // the record, its name, capacity; the lock queue must be empty
			if err := get(k("lock/"), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
				return err
			}
			return stm(func(s concurrency.STM) { s.Get(vol); s.Get(prov); s.Del(vol); s.Del(name); s.Put(prov, "0") })
		},
		func() error { return get(k("snapshots/"), clientv3.WithPrefix()) }, // the collection lists snapshots
		func() error { return get(k("volumes/"), clientv3.WithPrefix()) },   // and volumes (sweepStacks)
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// The metrics read around the writes, summed over members; "max:" ones
// keep the largest member's value.
var wanted = []string{
	"etcd_disk_wal_fsync_duration_seconds_sum",
	"etcd_disk_wal_fsync_duration_seconds_count",
	"etcd_disk_backend_commit_duration_seconds_sum",
	"etcd_disk_backend_commit_duration_seconds_count",
	"etcd_network_peer_sent_bytes_total",
}

// metrics reads every member's counters (nil if any member fails).
func (t *Target) metrics(ctx context.Context) map[string]float64 {
	if t.mtls == nil || len(t.Etcd) == 0 {
		return nil
	}
	out := map[string]float64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	ok := true
	for i, u := range t.Etcd {
		wg.Go(func() {
			at := u
			if i < len(t.Metrics) {
				at = t.Metrics[i]
			}
			m, err := t.scrape(ctx, at)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				ok = false
				return
			}
			for k, v := range m {
				if u != t.Member && (k == "range" || k == "txn") {
					out["remote:"+k] += v
				}
				if k == "etcd_server_proposals_committed_total" {
					out["max:"+k] = math.Max(out["max:"+k], v)
					continue
				}
				out[k] += v
			}
		})
	}
	wg.Wait()
	if !ok {
		return nil
	}
	for _, pid := range t.PIDs {
		out["cpu_s"] += cpuSeconds(pid)
	}
	return out
}

// cpuSeconds is a process's user + system time (0 if unreadable).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64) // utime, field 14
	k, _ := strconv.ParseFloat(f[12], 64) // stime, field 15
	return (u + k) / 100                  // USER_HZ
}

func (t *Target) scrape(ctx context.Context, u string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", u+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := t.mtls.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		name, val := line[:i], line[i+1:]
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		base := name
		if j := strings.IndexByte(name, '{'); j >= 0 {
			base = name[:j]
		}
		switch {
		case slices.Contains(wanted, base), base == "etcd_server_proposals_committed_total":
			m[base] += v
		case base == "grpc_server_handled_total" && strings.Contains(name, `grpc_method="Range"`):
			m["range"] += v
		case base == "grpc_server_handled_total" && strings.Contains(name, `grpc_method="Txn"`):
			m["txn"] += v
		}
	}
	return m, sc.Err()
}

func (r *Result) cost() *Cost {
	d, n := r.delta, float64(r.pairs)
	per := func(k string) float64 { return d[k] / n }
	mean := func(sum, count string) float64 {
		if d[count] == 0 {
			return 0
		}
		return d[sum] / d[count] * 1000
	}
	own := 0.0
	if all := d["range"] + d["txn"]; all > 0 {
		own = 1 - (d["remote:range"]+d["remote:txn"])/all
	}
	return &Cost{
		Proposals:   per("max:etcd_server_proposals_committed_total"),
		RangeRPCs:   per("range"),
		TxnRPCs:     per("txn"),
		WALFsyncs:   per("etcd_disk_wal_fsync_duration_seconds_count"),
		WALFsyncMs:  mean("etcd_disk_wal_fsync_duration_seconds_sum", "etcd_disk_wal_fsync_duration_seconds_count"),
		BackendMs:   mean("etcd_disk_backend_commit_duration_seconds_sum", "etcd_disk_backend_commit_duration_seconds_count"),
		PeerBytesKB: per("etcd_network_peer_sent_bytes_total") / 1024,
		OwnMember:   own,
		CPUms:       per("cpu_s") * 1000,
	}
}

func summarize(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	pct := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return ms(s[max(0, min(i, len(s)-1))])
	}
	return Stats{N: len(s), P50: pct(0.50), P99: pct(0.99), Mean: ms(sum) / float64(len(s)), Min: ms(s[0]), Max: ms(s[len(s)-1])}
}
