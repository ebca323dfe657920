package gateway

import (
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the gateway's Prometheus metrics, in a registry of its own.
// The gauges are read from the services' state when scraped (a collector),
// so that a service whose route went away, or whose pool was replaced,
// leaves no stale series behind.
type metrics struct {
	reg         *prometheus.Registry
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	poolUpdates *prometheus.CounterVec
	shed        *prometheus.CounterVec
}

func newMetrics(g *Gateway) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpujob_gateway_requests_total",
			Help: "Requests routed to a service, by the replica's version (\"\" when refused before one was chosen) and status code (499: the client went away).",
		}, []string{"namespace", "service", "version", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpujob_gateway_request_duration_seconds",
			Help: "Time from a routed request's arrival to the end of its answer, holding included.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
				1, 2.5, 5, 10, 20, 30, 60},
		}, []string{"namespace", "service"}),
		poolUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpujob_gateway_pool_updates_total",
			Help: "Changes of a service's set of healthy replicas seen by the gateway.",
		}, []string{"namespace", "service"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpujob_gateway_shed_total",
			Help: "Requests the gateway refused for want of room, by reason: inflight (503, --max-inflight), buffer (503, --max-buffered), slow_body (408, a body under --body-min-rate or paused over --body-grace).",
		}, []string{"reason"}),
	}
	for _, r := range []string{shedInflight, shedBuffer, shedSlowBody} {
		m.shed.WithLabelValues(r) // every reason from the start, at 0
	}
	m.reg.MustRegister(m.requests, m.duration, m.poolUpdates, m.shed, &stateCollector{g: g},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observe(s *service, o outcome, d time.Duration) {
	m.requests.WithLabelValues(s.ns, s.name, o.version, strconv.Itoa(o.code)).Inc()
	m.duration.WithLabelValues(s.ns, s.name).Observe(d.Seconds())
}

func (m *metrics) poolUpdated(s *service) { m.poolUpdates.WithLabelValues(s.ns, s.name).Inc() }

// forget drops a removed service's series.
func (m *metrics) forget(s *service) {
	l := prometheus.Labels{"namespace": s.ns, "service": s.name}
	m.requests.DeletePartialMatch(l)
	m.duration.DeletePartialMatch(l)
	m.poolUpdates.DeletePartialMatch(l)
}

var (
	inflightDesc = prometheus.NewDesc("gpujob_gateway_inflight",
		"Requests being proxied to a service's replicas.", []string{"namespace", "service"}, nil)
	queuedDesc = prometheus.NewDesc("gpujob_gateway_queued",
		"Requests held for want of a healthy replica of the service.", []string{"namespace", "service"}, nil)
	endpointsDesc = prometheus.NewDesc("gpujob_gateway_endpoints",
		"Healthy replicas of a service by version (version=\"\" 0 when it has none).", []string{"namespace", "service", "version"}, nil)
	refusedDesc = prometheus.NewDesc("gpujob_gateway_refused_instances",
		"Healthy Consul instances under a service's name and tag that Nomad does not vouch for as replicas of its job, and get no traffic, "+
			"by reason: route (the route's job is missing or does not claim the route), not_nomad (the ID names no Nomad allocation), "+
			"allocation (not a running allocation of the route's job), address (a replica's ID at an address Nomad did not give it: forged).",
		[]string{"namespace", "service", "reason"}, nil)
	allInflightDesc = prometheus.NewDesc("gpujob_gateway_requests_inflight",
		"Routed requests the gateway holds now, held and still uploading ones included (its --max-inflight bounds it).", nil, nil)
	bufferedDesc = prometheus.NewDesc("gpujob_gateway_buffered_bytes",
		"Bytes of request bodies the gateway has reserved now (its --max-buffered bounds it).", nil, nil)
	limitersDesc = prometheus.NewDesc("gpujob_gateway_rate_limiters",
		"Rate limiters the gateway keeps (its --max-limiters bounds them).", nil, nil)
)

// stateCollector reports the gauges of the routed services.
type stateCollector struct{ g *Gateway }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inflightDesc
	ch <- queuedDesc
	ch <- endpointsDesc
	ch <- refusedDesc
	ch <- allInflightDesc
	ch <- bufferedDesc
	ch <- limitersDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(allInflightDesc, prometheus.GaugeValue, float64(c.g.cap.inflight.Load()))
	ch <- prometheus.MustNewConstMetric(bufferedDesc, prometheus.GaugeValue, float64(c.g.cap.buffered.Load()))
	ch <- prometheus.MustNewConstMetric(limitersDesc, prometheus.GaugeValue, float64(c.g.limiters.size()))
	for _, s := range c.g.serviceList() {
		ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(s.inflight.Load()), s.ns, s.name)
		ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(s.queued.Load()), s.ns, s.name)
		byVersion := map[string]int{}
		var refused map[string]int
		if p := s.pool.Load(); p != nil {
			for _, e := range p.snapshot().eps {
				byVersion[e.version]++
			}
			refused = p.refusals()
		}
		// Every reason, 0 included, so that an alert on one reason (or a
		// test waiting for it) finds its series from the start.
		for _, r := range refusalReasons {
			ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.GaugeValue, float64(refused[r]), s.ns, s.name, r)
		}
		if len(byVersion) == 0 {
			byVersion[""] = 0
		}
		versions := make([]string, 0, len(byVersion))
		for v := range byVersion {
			versions = append(versions, v)
		}
		sort.Strings(versions)
		for _, v := range versions {
			ch <- prometheus.MustNewConstMetric(endpointsDesc, prometheus.GaugeValue, float64(byVersion[v]), s.ns, s.name, v)
		}
	}
}
