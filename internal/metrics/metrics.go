// Package metrics is basalt's Prometheus instrumentation: a registry per
// node for the node's own series, served on --metrics together with the
// process-wide default registry (the Go runtime, the process, and the
// embedded etcd member, which registers its own series there).
//
// The data paths count in plain atomics, not in Prometheus vectors: an NBD
// request or an S3 GET pays an atomic add and, for its latency, a bucket
// search and two more (Latency) — no label lookup, no lock. Collectors
// registered on the node's registry turn those counts into series when a
// scraper asks. The control API, whose rate is low, uses vectors directly.
//
// Every series is named basalt_<subsystem>_<what>; docs/operations.md
// lists them.
//
// Callers: internal/server (the registry and the listener), internal/api,
// internal/volume (per-volume NBD series), internal/nbd (Latency).
package metrics

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every basalt series.
const Namespace = "basalt"

// Registry is one node's series.
type Registry struct {
	*prometheus.Registry
}

// New returns an empty registry.
func New() *Registry { return &Registry{prometheus.NewRegistry()} }

// Handler serves the node's series and the process-wide default ones.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(prometheus.Gatherers{r.Registry, prometheus.DefaultGatherer},
		promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// latencyBounds are Latency's bucket upper bounds, in seconds: from 25 µs
// (a page-cache read over loopback) to 10 s (a request stuck behind a
// failing device).
var latencyBounds = []float64{
	25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3,
	1, 2.5, 10,
}

// latencyNS are latencyBounds in nanoseconds, for Observe.
var latencyNS = func() []int64 {
	ns := make([]int64, len(latencyBounds))
	for i, b := range latencyBounds {
		ns[i] = int64(b * 1e9)
	}
	return ns
}()

// Latency is a histogram of durations kept in atomics. The zero value is
// ready. Concurrent Observe calls and a scrape may interleave: a scrape
// can see a count before its sum, which Prometheus tolerates as it does
// for its own histograms.
type Latency struct {
	counts [18]atomic.Uint64 // per bucket (not cumulative); the last is +Inf
	sumNS  atomic.Int64
}

// Observe records one duration.
func (l *Latency) Observe(d time.Duration) {
	ns := int64(d)
	i := 0
	for i < len(latencyNS) && ns > latencyNS[i] {
		i++
	}
	l.counts[i].Add(1)
	l.sumNS.Add(ns)
}

// Snapshot is l's counts now.
func (l *Latency) Snapshot() LatencySnapshot {
	var s LatencySnapshot
	for i := range l.counts {
		s.counts[i] = l.counts[i].Load()
	}
	s.sumNS = l.sumNS.Load()
	return s
}

// Count is how many durations l has observed.
func (l *Latency) Count() uint64 { s := l.Snapshot(); return s.Count() }

// SumNS is the sum of the durations l has observed, in nanoseconds.
func (l *Latency) SumNS() int64 { return l.sumNS.Load() }

// LatencySnapshot is a Latency's counts at one moment; snapshots of
// several add up (a histogram over many volumes).
type LatencySnapshot struct {
	counts [18]uint64
	sumNS  int64
}

// Add adds o's counts to s.
func (s *LatencySnapshot) Add(o LatencySnapshot) {
	for i := range s.counts {
		s.counts[i] += o.counts[i]
	}
	s.sumNS += o.sumNS
}

// Count is how many durations s holds.
func (s LatencySnapshot) Count() uint64 {
	var n uint64
	for _, c := range s.counts {
		n += c
	}
	return n
}

// Metric renders s as a histogram of desc with the given label values.
func (s LatencySnapshot) Metric(desc *prometheus.Desc, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(latencyBounds))
	var n uint64
	for i, b := range latencyBounds {
		n += s.counts[i]
		buckets[b] = n
	}
	n += s.counts[len(latencyBounds)]
	return prometheus.MustNewConstHistogram(desc, n, float64(s.sumNS)/1e9, buckets, labels...)
}

// LatencyBuckets are Latency's bucket bounds, in seconds, for the
// Prometheus histograms of the same quantities elsewhere.
func LatencyBuckets() []float64 { return append([]float64(nil), latencyBounds...) }

// Method is an HTTP method as a label value: the standard ones as they
// are, any other as "other", so that a client cannot mint series.
func Method(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete,
		http.MethodPatch, http.MethodOptions:
		return m
	}
	return "other"
}
