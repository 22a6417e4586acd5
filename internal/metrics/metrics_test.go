package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// A Latency renders as a cumulative histogram: each duration in the
// first bucket whose bound it does not exceed, the sum in seconds.
func TestLatency(t *testing.T) {
	var l Latency
	for _, d := range []time.Duration{10 * time.Microsecond, 25 * time.Microsecond, 3 * time.Millisecond, time.Minute} {
		l.Observe(d)
	}
	var m dto.Metric
	desc := prometheus.NewDesc("x", "x", []string{"op"}, nil)
	if err := l.Snapshot().Metric(desc, "read").Write(&m); err != nil {
		t.Fatal(err)
	}
	h := m.GetHistogram()
	if h.GetSampleCount() != 4 {
		t.Errorf("count %d, want 4", h.GetSampleCount())
	}
	if want := 60.003035; h.GetSampleSum() < want-1e-9 || h.GetSampleSum() > want+1e-9 {
		t.Errorf("sum %v, want %v", h.GetSampleSum(), want)
	}
	want := map[float64]uint64{25e-6: 2, 50e-6: 2, 2.5e-3: 2, 5e-3: 3, 10: 3}
	for _, b := range h.GetBucket() {
		if w, ok := want[b.GetUpperBound()]; ok && b.GetCumulativeCount() != w {
			t.Errorf("bucket le=%v: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), w)
		}
	}
	if len(h.GetBucket()) != len(latencyBounds) {
		t.Errorf("%d buckets, want %d", len(h.GetBucket()), len(latencyBounds))
	}
}

// The handler serves the node's series and the process's default ones.
func TestHandler(t *testing.T) {
	r := New()
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "test_total", Help: "a test"})
	r.MustRegister(c)
	c.Add(3)
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{"basalt_test_total 3", "go_goroutines"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func BenchmarkLatencyObserve(b *testing.B) {
	var l Latency
	for i := 0; i < b.N; i++ {
		l.Observe(time.Duration(i&0xffff) * time.Microsecond)
	}
}
