package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/basalt-storage/basalt/internal/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// apiMetrics counts the control API's requests by route pattern (bounded:
// the patterns of New, "" for a path no route matched), method and status.
type apiMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newAPIMetrics(r *metrics.Registry) *apiMetrics {
	m := &apiMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "api", Name: "requests_total",
			Help: "Control API requests answered, by route, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metrics.Namespace, Subsystem: "api", Name: "request_duration_seconds",
			Help:    "Control API request latency, by route and method.",
			Buckets: metrics.LatencyBuckets(),
		}, []string{"route", "method"}),
	}
	r.MustRegister(m.requests, m.duration)
	return m
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// serve runs h and counts the request under the route the mux matched.
func (m *apiMetrics) serve(w http.ResponseWriter, r *http.Request, h http.Handler) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	h.ServeHTTP(sw, r)
	if sw.code == 0 {
		sw.code = http.StatusOK
	}
	route := r.Pattern // set by the mux on r itself
	method := metrics.Method(r.Method)
	m.requests.WithLabelValues(route, method, strconv.Itoa(sw.code)).Inc()
	m.duration.WithLabelValues(route, method).Observe(time.Since(start).Seconds())
}
