package server

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/basalt-storage/basalt/internal/metrics"
	"github.com/basalt-storage/basalt/internal/nbd"
	"github.com/basalt-storage/basalt/internal/volume"
	"github.com/gofiber/fiber/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// serveMetrics serves the node's series on the --metrics listener (plain
// HTTP: it says nothing a user's request could not, but it names volumes,
// so it listens on loopback unless told otherwise).
func (n *Node) serveMetrics() {
	ln := n.ports.metrics
	n.ports.metrics = nil
	if ln == nil {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", n.metrics.Handler())
	n.metricsHTTP = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := n.metricsHTTP.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("metrics server stopped", "err", err)
		}
	}()
	n.log.Info("metrics serving", "addr", ln.Addr().String())
}

// registerNodeMetrics registers the node-wide series: what the node is,
// whether its metadata store has a quorum, and whether its store answers.
func (n *Node) registerNodeMetrics() {
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metrics.Namespace, Name: "node_info",
		Help:        "Always 1; its labels name this node and its version.",
		ConstLabels: prometheus.Labels{"node": n.cfg.Name, "version": Version},
	})
	info.Set(1)
	n.metrics.MustRegister(info,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: metrics.Namespace, Subsystem: "meta", Name: "quorum_lost",
			Help: "1 while this node finds no quorum of the metadata cluster answering (writes fail, reads come from the local copy).",
		}, func() float64 {
			if n.meta != nil && n.meta.QuorumLost() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: metrics.Namespace, Subsystem: "store", Name: "healthy",
			Help: "1 while the store passes its check (marker in place, a file written and synced) within 5 s (as `basalt status`); 0 when it fails or stalls.",
		}, func() float64 {
			if n.store != nil && n.store.Probe(storeProbeTimeout) == nil {
				return 1
			}
			return 0
		}))
}

// s3Metrics counts the gateway's requests by method and status.
type s3Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	in, out  prometheus.Counter
}

func newS3Metrics(r *metrics.Registry) *s3Metrics {
	m := &s3Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "s3", Name: "requests_total",
			Help: "S3 requests answered, by HTTP method and status code.",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metrics.Namespace, Subsystem: "s3", Name: "request_duration_seconds",
			Help:    "Time from a request's arrival to the end of its handler (a body sent from a file may still be on its way), by HTTP method.",
			Buckets: metrics.LatencyBuckets(),
		}, []string{"method"}),
		in: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "s3", Name: "received_bytes_total",
			Help: "Request body bytes, as their Content-Length declares.",
		}),
		out: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "s3", Name: "sent_bytes_total",
			Help: "Response body bytes, as their Content-Length declares.",
		}),
	}
	r.MustRegister(m.requests, m.duration, m.in, m.out)
	return m
}

// middleware counts each request once its handler has run.
func (m *s3Metrics) middleware() fiber.Handler {
	return func(c fiber.Ctx) error {
		start := time.Now()
		err := c.Next()
		method := metrics.Method(c.Method())
		code := c.Response().StatusCode()
		var fe *fiber.Error
		if errors.As(err, &fe) {
			code = fe.Code
		}
		m.requests.WithLabelValues(method, strconv.Itoa(code)).Inc()
		m.duration.WithLabelValues(method).Observe(time.Since(start).Seconds())
		if n := c.Request().Header.ContentLength(); n > 0 {
			m.in.Add(float64(n))
		}
		if n := c.Response().Header.ContentLength(); n > 0 {
			m.out.Add(float64(n))
		}
		return err
	}
}

// nbdCollector renders the per-volume NBD counts of the node's exports
// (those open, and those closed a short while ago: volume.Exports.EachStats):
// requests, failures and bytes per volume and command, and latency per
// command over those volumes (a histogram per volume would multiply the
// series by its buckets). Commands a volume has not seen are left out.
// The server's own counts go with them: connections in the handshake and
// those refused for want of a handshake slot (nbd.Server.MaxHandshakes).
type nbdCollector struct {
	exports                   *volume.Exports
	srv                       *nbd.Server
	requests, errors, bytes   *prometheus.Desc
	latency, connectedVolumes *prometheus.Desc
	handshakes, refused       *prometheus.Desc
}

func newNBDCollector(e *volume.Exports, srv *nbd.Server) *nbdCollector {
	name := func(n string) string { return prometheus.BuildFQName(metrics.Namespace, "nbd", n) }
	perVolume := []string{"volume", "op"}
	return &nbdCollector{
		exports:  e,
		srv:      srv,
		requests: prometheus.NewDesc(name("requests_total"), "NBD requests answered, by volume and command.", perVolume, nil),
		errors:   prometheus.NewDesc(name("errors_total"), "NBD requests answered with an error, by volume and command.", perVolume, nil),
		bytes:    prometheus.NewDesc(name("bytes_total"), "Bytes the NBD requests covered (read, written, trimmed, zeroed), by volume and command.", perVolume, nil),
		latency: prometheus.NewDesc(name("request_duration_seconds"),
			"NBD request latency, from its header read to its reply written, by command, over every volume open here.", []string{"op"}, nil),
		connectedVolumes: prometheus.NewDesc(name("open_volumes"), "Volumes with an NBD connection open on this node.", nil, nil),
		handshakes:       prometheus.NewDesc(name("handshakes"), "NBD connections in the handshake now (not yet past their export name).", nil, nil),
		refused: prometheus.NewDesc(name("handshakes_refused_total"),
			"NBD connections closed before the greeting: every handshake slot was taken (--nbd-max-handshakes).", nil, nil),
	}
}

func (c *nbdCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.requests, c.errors, c.bytes, c.latency, c.connectedVolumes, c.handshakes, c.refused} {
		ch <- d
	}
}

func (c *nbdCollector) Collect(ch chan<- prometheus.Metric) {
	latency := map[string]*metrics.LatencySnapshot{}
	var ops []string
	vols := 0
	c.exports.EachStats(func(vol string, st *nbd.Stats, open bool) {
		if open {
			vols++
		}
		st.Each(func(op string, o *nbd.OpStats) {
			n := o.Requests.Load()
			if n == 0 {
				return
			}
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(n), vol, op)
			ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(o.Errors.Load()), vol, op)
			ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(o.Bytes.Load()), vol, op)
			l := latency[op]
			if l == nil {
				l = &metrics.LatencySnapshot{}
				latency[op] = l
				ops = append(ops, op)
			}
			l.Add(o.Latency.Snapshot())
		})
	})
	for _, op := range ops {
		ch <- latency[op].Metric(c.latency, op)
	}
	ch <- prometheus.MustNewConstMetric(c.connectedVolumes, prometheus.GaugeValue, float64(vols))
	ch <- prometheus.MustNewConstMetric(c.handshakes, prometheus.GaugeValue, float64(c.srv.Handshakes()))
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(c.srv.HandshakesRefused()))
}
