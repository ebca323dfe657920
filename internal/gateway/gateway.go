// Package gateway is the data plane of `gpujob gateway`: the HTTP front door
// of gpujob's model services. It learns the services' routes and bearer
// tokens from one blocking watch of Consul KV (servekv's layout), keeps the
// healthy replicas of each service from a blocking Consul health watch per
// route, and proxies each request to one of them: authenticated, rate
// limited per token, balanced least-outstanding, held while a service has no
// replica (a scale from zero) and counted in Prometheus metrics of its own.
//
// The file layout follows the concerns: routes.go (the KV watch and the
// routing table), pool.go (the health watch), balance.go, proxy.go, auth.go,
// ratelimit.go, queue.go (holding while empty) and metrics.go.
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpujob/gpujob/internal/servekv"
)

// Config is a gateway's wiring and its limits. Every limit has a default
// (the Default* constants), taken when the field is 0.
type Config struct {
	Consul *consulapi.Client
	// Nomad vouches for the replicas: a Consul instance gets a route's
	// requests only when it is a running allocation of the route's job
	// (admit.go). Required.
	Nomad Nomad
	// Prefix is the services' KV prefix; "" = servekv.DefaultPrefix.
	Prefix string
	// ID is this gateway's ID, reported in Load.
	ID string
	// Logf receives one line per route or pool change and per (throttled)
	// watch error, never one per request; nil discards.
	Logf func(format string, args ...any)
	// OnQueued is called for each request held because its service has no
	// healthy replica, so that the autoscaler can scale it from zero at
	// once. It is called on the request's goroutine and must not block (a
	// non-blocking channel send); nil = none.
	OnQueued func(namespace, service string)
	// MaxBodyBytes bounds the request body of a route that sets no
	// max_body_bytes of its own (bodies are buffered so that a request a
	// replica refused can be retried on another); a larger body is
	// answered 413.
	MaxBodyBytes int64
	// EjectFor is how long a replica that refused a connection is skipped.
	EjectFor time.Duration

	// MaxInflight bounds the routed requests the gateway serves at once,
	// those held for a replica and those still sending their body
	// included; past it a request is answered 503 with Retry-After.
	MaxInflight int
	// MaxBufferedBytes bounds the request bodies held in memory at once,
	// held requests' included; an eighth of it is kept for bodies of at
	// most 64 KiB, and no body may be larger than the rest. Past it a
	// request is answered 503 with Retry-After.
	MaxBufferedBytes int64
	// BodyMinRate (bytes a second) and BodyGrace bound how slowly a body
	// may arrive: no pause over BodyGrace, and on average BodyMinRate
	// after a first BodyGrace; a slower one is answered 408 and cut off.
	BodyMinRate int64
	BodyGrace   time.Duration
	// MaxLimiters bounds the table of rate limiters (one per token, or per
	// client address on routes with a rate limit and no auth); past it,
	// new clients share one limiter per route.
	MaxLimiters int

	// The public listener's http.Server (Server): how long a client may
	// take to send its headers (a slowloris), how long a keep-alive
	// connection may idle, how large the headers may be, and how long a
	// client may leave an answer unread before it is cut off.
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int
	WriteIdleTimeout  time.Duration
}

// Defaults of Config and of the routes' optional fields.
const (
	DefaultMaxBodyBytes = 10 << 20
	DefaultEjectFor     = 5 * time.Second
	// DefaultQueueLimit and DefaultQueueTimeout apply to a route whose
	// QueueLimit or QueueTimeout is 0.
	DefaultQueueLimit   = 100
	DefaultQueueTimeout = 30 * time.Second

	DefaultMaxInflight       = 1024
	DefaultMaxBufferedBytes  = 64 << 20
	DefaultBodyMinRate       = 64 << 10
	DefaultBodyGrace         = 10 * time.Second
	DefaultMaxLimiters       = 65536
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultWriteIdleTimeout  = 30 * time.Second
)

// withDefaults fills in cfg's zero fields and refuses negative ones.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = servekv.DefaultPrefix
	}
	for _, f := range []struct {
		name string
		v    *int64
		def  int64
	}{
		{"MaxBodyBytes", &cfg.MaxBodyBytes, DefaultMaxBodyBytes},
		{"MaxBufferedBytes", &cfg.MaxBufferedBytes, DefaultMaxBufferedBytes},
		{"BodyMinRate", &cfg.BodyMinRate, DefaultBodyMinRate},
	} {
		if *f.v < 0 {
			return cfg, fmt.Errorf("gateway: %s is negative (%d)", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"EjectFor", &cfg.EjectFor, DefaultEjectFor},
		{"BodyGrace", &cfg.BodyGrace, DefaultBodyGrace},
		{"ReadHeaderTimeout", &cfg.ReadHeaderTimeout, DefaultReadHeaderTimeout},
		{"IdleTimeout", &cfg.IdleTimeout, DefaultIdleTimeout},
		{"WriteIdleTimeout", &cfg.WriteIdleTimeout, DefaultWriteIdleTimeout},
	} {
		if *f.v < 0 {
			return cfg, fmt.Errorf("gateway: %s is negative (%s)", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{
		{"MaxInflight", &cfg.MaxInflight, DefaultMaxInflight},
		{"MaxLimiters", &cfg.MaxLimiters, DefaultMaxLimiters},
		{"MaxHeaderBytes", &cfg.MaxHeaderBytes, DefaultMaxHeaderBytes},
	} {
		if *f.v < 0 {
			return cfg, fmt.Errorf("gateway: %s is negative (%d)", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if cfg.MaxBufferedBytes < 8*bodyChunk {
		return cfg, fmt.Errorf("gateway: MaxBufferedBytes %d is under %d, too little to buffer any body", cfg.MaxBufferedBytes, 8*bodyChunk)
	}
	return cfg, nil
}

// Paths the gateway answers itself instead of routing: the health check
// on the public listener, the metrics (and StatsPath) on the admin one
// (AdminHandler).
const (
	MetricsPath = "/metrics"
	HealthPath  = "/-/healthz"
)

// Gateway routes HTTP requests to the healthy replicas of gpujob services.
// It is an http.Handler; Run keeps its view of Consul current.
type Gateway struct {
	cfg       Config
	prefix    string
	logf      func(format string, args ...any)
	transport *http.Transport
	metrics   *metrics
	limiters  *limiterSet
	cap       *capacity

	// table is the routing table, replaced whole on every change of the
	// services' KV tree; nil until the first list is loaded (not Ready).
	table atomic.Pointer[table]

	// mu guards services, which only the routes watch changes but Load and
	// the metrics collector read.
	mu       sync.Mutex
	services map[string]*service

	metricsHandler http.Handler
	running        atomic.Bool
}

// New checks cfg and returns a Gateway; nothing runs until Run.
func New(cfg Config) (*Gateway, error) {
	if cfg.Consul == nil {
		return nil, errors.New("gateway: no Consul client")
	}
	if cfg.Nomad == nil {
		return nil, errors.New("gateway: no Nomad client: it admits a replica only when Nomad says it is one of the route's job")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	g := &Gateway{
		cfg:       cfg,
		prefix:    cfg.Prefix,
		logf:      logf,
		transport: newTransport(),
		limiters:  newLimiterSet(cfg.MaxLimiters),
		cap:       newCapacity(cfg.MaxInflight, cfg.MaxBufferedBytes),
		services:  map[string]*service{},
	}
	g.metrics = newMetrics(g)
	g.metricsHandler = g.MetricsHandler()
	return g, nil
}

// Run watches the routes, tokens and replicas until ctx ends; it returns
// nil then. Watch errors are retried (with the last good state kept), so
// Run only returns early when called twice.
func (g *Gateway) Run(ctx context.Context) error {
	if !g.running.CompareAndSwap(false, true) {
		return errors.New("gateway: Run called twice")
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		g.limiters.sweepEvery(ctx, time.Minute)
	}()
	g.watchRoutes(ctx)
	// The routes watch has ended: stop every pool's watch with it.
	g.mu.Lock()
	for _, s := range g.services {
		if p := s.pool.Load(); p != nil {
			p.stop()
		}
	}
	g.mu.Unlock()
	wg.Wait()
	g.transport.CloseIdleConnections()
	return nil
}

// Ready reports whether the first route list has been loaded.
func (g *Gateway) Ready() bool { return g.table.Load() != nil }

// Load is a snapshot of the requests in flight to, and held for, each
// routed service (the autoscaler's input). Every routed service appears,
// idle ones with 0, so that a scale down sees them.
func (g *Gateway) Load() servekv.Load {
	l := servekv.Load{Gateway: g.cfg.ID, Inflight: map[string]int{}, Queued: map[string]int{}, Updated: time.Now()}
	for _, s := range g.serviceList() {
		l.Inflight[s.key] = int(s.inflight.Load())
		l.Queued[s.key] = int(s.queued.Load())
	}
	return l
}

// Registry is the gateway's own Prometheus registry (served on /metrics).
func (g *Gateway) Registry() *prometheus.Registry { return g.metrics.reg }

// MetricsHandler serves the registry in Prometheus' formats.
func (g *Gateway) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(g.metrics.reg, promhttp.HandlerOpts{})
}

func (g *Gateway) serviceList() []*service {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*service, 0, len(g.services))
	for _, s := range g.services {
		out = append(out, s)
	}
	return out
}

// ServeHTTP answers /-/healthz itself and routes every other request; the
// metrics and stats are the admin listener's (AdminHandler), not the
// public's, since they name every tenant's services and traffic.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody {
		body := &eofReader{ReadCloser: r.Body}
		r.Body = body
		defer dropUnreadBody(w, body)
	}
	switch r.URL.Path {
	case HealthPath:
		g.serveHealth(w)
		return
	case MetricsPath, StatsPath:
		writeError(w, http.StatusNotFound, r.URL.Path+" is served on the gateway's admin listener (--admin-listen), not here")
		return
	}
	if r.Method == http.MethodConnect {
		// Replicas serve HTTP, not tunnels.
		writeError(w, http.StatusMethodNotAllowed, "CONNECT is not proxied")
		return
	}
	tbl := g.table.Load()
	if tbl == nil {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "gateway starting: routes not loaded yet")
		return
	}
	e := tbl.match(r.Host, r.URL.Path)
	if e == nil {
		writeError(w, http.StatusNotFound, "no service routes "+r.URL.Path)
		return
	}
	g.serveRoute(w, r, e)
}

func (g *Gateway) serveHealth(w http.ResponseWriter) {
	if !g.Ready() {
		writeError(w, http.StatusServiceUnavailable, "routes not loaded yet")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
}

// outcome is what one routed request is counted as.
type outcome struct {
	code    int
	version string // the replica's; "" when none was chosen
}

// serveRoute runs a routed request through auth, rate limit, the hold and
// the proxy, and counts it whichever way it ends (a deferred count, since an
// aborted stream panics with http.ErrAbortHandler).
func (g *Gateway) serveRoute(w http.ResponseWriter, r *http.Request, e *routeEntry) {
	start := time.Now()
	out := outcome{code: statusClientClosed}
	defer func() {
		d := time.Since(start)
		g.metrics.observe(e.svc, out, d)
		e.svc.window.add(start.Add(d), d, out.code)
	}()

	if !g.cap.enter() {
		out.code = g.shed(w, shedInflight, false)
		return
	}
	defer g.cap.leave()
	tok, ok := g.authenticate(w, r, e)
	if !ok {
		out.code = http.StatusUnauthorized
		return
	}
	if !g.allow(w, r, e, tok) {
		out.code = http.StatusTooManyRequests
		return
	}
	body, code := g.readBody(w, r, e)
	if code != 0 {
		out.code = code
		return
	}
	if body != nil {
		// Held requests keep their body, and count in the capacity, until
		// they are answered.
		defer g.cap.release(body.reserved)
	}
	if code := g.hold(w, r, e); code != 0 {
		out.code = code
		return
	}
	g.proxy(w, r, e, body, &out)
}

// statusClientClosed counts requests whose client went away before an
// answer (nginx's convention; never sent).
const statusClientClosed = 499

// eofReader records whether a request body was read to its end.
type eofReader struct {
	io.ReadCloser
	eof bool
}

func (r *eofReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err == io.EOF {
		r.eof = true
	}
	return n, err
}

// dropUnreadBody ends the connection of a request answered before its
// body was read (refused, shed, too slow): net/http would otherwise read up
// to 256 KiB more of it after the handler, with no deadline, to keep the
// connection alive, and a client that sends nothing more would hold the
// connection for ever. A read deadline in the past fails that read, and the
// server closes the connection.
func dropUnreadBody(w http.ResponseWriter, b *eofReader) {
	if !b.eof {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	}
}

// writeError answers with a JSON error body.
func writeError(w http.ResponseWriter, code int, msg string) {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// clientIP is the host of the request's RemoteAddr (the peer of this
// connection: X-Forwarded-For is the client's to forge).
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
