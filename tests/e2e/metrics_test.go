package e2e

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestMetrics: with --metrics, a node serves Prometheus series of its own
// (control API, S3, NBD per volume, metadata quorum) beside the embedded
// etcd member's and the Go runtime's, and they count what real clients
// did: qemu-io over NBD, the aws cli over S3, the CLI over the API.
func TestMetrics(t *testing.T) {
	requireTools(t, "qemu-io", "aws")
	port := freePort(t)
	n := StartNode(t, NodeOptions{Args: []string{"--metrics", addr(port)}})
	admin := n.Admin()
	vol := admin.CreateVolume("--size", "16MiB", "--name", "m")
	a := admin.Attach("m", "hv1", "rw")
	qemuIOGood(t, "write", a.NBDURI, "write -P 0x5a 0 1M", "flush", "read -P 0x5a 0 64k")
	alice := n.S3User(admin.CreateUser("alice"))
	alice.AWSOK("s3", "mb", "s3://metrics-bucket")
	alice.AWSOK("s3api", "put-object", "--bucket", "metrics-bucket", "--key", "k", "--body", "/etc/hostname")

	body := scrape(t, port)
	want := []struct {
		series string
		min    float64
	}{
		{fmt.Sprintf(`basalt_nbd_requests_total{op="write",volume=%q}`, vol.ID), 1},
		{fmt.Sprintf(`basalt_nbd_bytes_total{op="write",volume=%q}`, vol.ID), 1 << 20},
		{fmt.Sprintf(`basalt_nbd_requests_total{op="flush",volume=%q}`, vol.ID), 1},
		{fmt.Sprintf(`basalt_nbd_bytes_total{op="read",volume=%q}`, vol.ID), 64 << 10},
		{`basalt_nbd_request_duration_seconds_count{op="write"}`, 1},
		{`basalt_s3_requests_total{code="200",method="PUT"}`, 2},
		{`basalt_api_requests_total{code="201",method="POST",route="POST /v1/volumes"}`, 1},
		{`basalt_api_request_duration_seconds_count{method="POST",route="POST /v1/volumes"}`, 1},
		{`basalt_node_info{node="node1"`, 1},
		{`etcd_server_has_leader`, 1},
		{`go_goroutines`, 1},
	}
	for _, w := range want {
		if v, ok := seriesValue(body, w.series); !ok || v < w.min {
			t.Errorf("%s: %v (found %v), want at least %v", w.series, v, ok, w.min)
		}
	}
	if v, ok := seriesValue(body, "basalt_meta_quorum_lost"); !ok || v != 0 {
		t.Errorf("basalt_meta_quorum_lost: %v (found %v), want 0", v, ok)
	}
	if v, ok := seriesValue(body, "basalt_store_healthy"); !ok || v != 1 {
		t.Errorf("basalt_store_healthy: %v (found %v), want 1", v, ok)
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", grepLines(body, "basalt_"))
	}
	// Once the volume's last connection is gone, its series go too.
	if v, _ := seriesValue(body, "basalt_nbd_open_volumes"); v != 0 {
		t.Errorf("basalt_nbd_open_volumes %v after qemu-io ended, want 0", v)
	}
	// qemu-io's handshake is over: its slot was given back.
	if v, ok := seriesValue(body, "basalt_nbd_handshakes"); !ok || v != 0 {
		t.Errorf("basalt_nbd_handshakes: %v (found %v) after qemu-io ended, want 0", v, ok)
	}
	if v, ok := seriesValue(body, "basalt_nbd_handshakes_refused_total"); !ok || v != 0 {
		t.Errorf("basalt_nbd_handshakes_refused_total: %v (found %v), want 0", v, ok)
	}
}

// scrape GETs /metrics from the node's --metrics port.
func scrape(t *testing.T, port int) string {
	t.Helper()
	resp, err := http.Get("http://" + addr(port) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

// seriesValue finds the sample of the first line that starts with series
// (a name, or a name and a prefix of its labels) and returns its value.
func seriesValue(body, series string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, series) {
			continue
		}
		rest := line[len(series):]
		if !strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{") && !strings.HasSuffix(series, `"`) {
			continue // a longer name
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		return v, err == nil
	}
	return 0, false
}

func grepLines(body, prefix string) string {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(prefix) + `.*$`)
	return strings.Join(re.FindAllString(body, -1), "\n")
}
