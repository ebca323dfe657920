package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/servekv"
	"github.com/gpujob/gpujob/internal/testagent"
)

// The tests that need Consul share one dev agent, started on first use;
// each test works under a KV prefix and Consul service names of its own, so
// they run in parallel.
var testConsul testagent.Lazy

func TestMain(m *testing.M) { os.Exit(testConsul.Main(m)) }

func consulClient(t *testing.T) *consulapi.Client {
	t.Helper()
	return testConsul.Client(t)
}

func randomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// harness is a running Gateway on a test's own KV prefix, served by an
// httptest server.
type harness struct {
	t      *testing.T
	c      *consulapi.Client
	g      *Gateway
	url    string // the gateway's base URL
	admin  string // its admin listener's
	prefix string
	id     string // makes the test's Consul service names unique
	ns     string

	logMu sync.Mutex
	logs  []string

	nomad *fakeNomad

	queued chan string // OnQueued's calls, "ns/svc"
}

func newHarness(t *testing.T, tweak ...func(*Config)) *harness {
	t.Helper()
	c := consulClient(t)
	h := &harness{t: t, c: c, id: randomID(), ns: "team-a", queued: make(chan string, 1000), nomad: newFakeNomad()}
	h.prefix = "gwtest/" + h.id
	cfg := Config{
		Consul: c,
		Nomad:  h.nomad,
		Prefix: h.prefix,
		ID:     "gw-" + h.id,
		Logf: func(format string, args ...any) {
			h.logMu.Lock()
			defer h.logMu.Unlock()
			h.logs = append(h.logs, fmt.Sprintf(format, args...))
		},
		OnQueued: func(ns, svc string) {
			select {
			case h.queued <- servekv.LoadName(ns, svc):
			default:
			}
		},
	}
	for _, f := range tweak {
		f(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.g = g
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	// The public listener as gpujob gateway run serves it: g.Server's
	// limits and timeouts.
	srv := httptest.NewUnstartedServer(g)
	srv.Config = g.Server()
	srv.Start()
	h.url = srv.URL
	adm := httptest.NewServer(g.AdminHandler(""))
	h.admin = adm.URL
	t.Cleanup(func() {
		srv.Close()
		adm.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return after its context ended")
		}
		_, _ = c.KV().DeleteTree(h.prefix+"/", nil)
	})
	h.eventually(5*time.Second, "the gateway is ready", g.Ready)
	return h
}

func (h *harness) logged() string {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	return strings.Join(h.logs, "\n")
}

// consulService is the test's Consul service name for a gpujob service.
func (h *harness) consulService(svc string) string { return "gwt-" + h.id + "-" + svc }

func (h *harness) tag() string { return "gpujob-ns=" + h.ns }

// jobID is the test's Nomad job of a gpujob service.
func (h *harness) jobID(svc string) string { return "job-" + h.id + "-" + svc }

// route writes svc's route, filling in the names, Consul service, tag and
// job (which it registers in the fake Nomad, claiming the route).
func (h *harness) route(svc string, r servekv.Route) servekv.Route {
	h.t.Helper()
	r.Namespace, r.Service = h.ns, svc
	if r.ConsulService == "" {
		r.ConsulService = h.consulService(svc)
	}
	if r.JobID == "" {
		r.JobID, r.Group = h.jobID(svc), "serve"
		h.nomad.serviceJob(h.ns, svc, r.JobID)
	}
	if r.Tag == "" {
		r.Tag = h.tag()
	}
	if r.PathPrefix == "" {
		r.PathPrefix = "/" + svc
	}
	b, err := json.Marshal(r)
	if err != nil {
		h.t.Fatal(err)
	}
	h.put(servekv.RouteKey(h.prefix, h.ns, svc), b)
	return r
}

func (h *harness) put(key string, value []byte) {
	h.t.Helper()
	if _, err := h.c.KV().Put(&consulapi.KVPair{Key: key, Value: value}, nil); err != nil {
		h.t.Fatalf("writing %s: %v", key, err)
	}
}

func (h *harness) del(key string) {
	h.t.Helper()
	if _, err := h.c.KV().Delete(key, nil); err != nil {
		h.t.Fatalf("deleting %s: %v", key, err)
	}
}

// token creates a token of svc and returns its secret and hash.
func (h *harness) token(svc string, limit *servekv.Limit) (secret, hash string) {
	h.t.Helper()
	secret, hash, id, err := servekv.NewSecret()
	if err != nil {
		h.t.Fatal(err)
	}
	b, _ := json.Marshal(servekv.Token{ID: id, Name: "test", Limit: limit, Created: time.Now()})
	h.put(servekv.TokenKey(h.prefix, h.ns, svc, hash), b)
	return secret, hash
}

// waitRoute waits until a request for path is routed to svc.
func (h *harness) waitRoute(svc, host, path string) {
	h.t.Helper()
	h.eventually(5*time.Second, "route to "+svc, func() bool {
		tbl := h.g.table.Load()
		e := tbl.match(host, path)
		return e != nil && e.svc.name == svc
	})
}

// replica runs a replica of svc at addr (host:port): a running allocation
// of its job in the fake Nomad, registered in Consul as Nomad does with a
// passing TTL check. It returns its service ID and check ID.
func (h *harness) replica(svc, addr, version string, extraTags ...string) (id, check string) {
	h.t.Helper()
	return h.replicaAs(svc, h.consulService(svc), addr, version, extraTags...)
}

// replicaAs is replica registered under the Consul service name
// consulService.
func (h *harness) replicaAs(svc, consulService, addr, version string, extraTags ...string) (id, check string) {
	h.t.Helper()
	alloc := h.nomad.runAlloc(h.ns, h.jobID(svc), "serve", addr)
	id = fmt.Sprintf("_nomad-task-%s-serve-%s-http", alloc, consulService)
	return id, h.register(consulService, id, addr, version, extraTags...)
}

// register puts an instance of the Consul service consulService, with the
// route's tags and a passing TTL check, and returns the check's ID.
func (h *harness) register(consulService, id, addr, version string, extraTags ...string) (check string) {
	h.t.Helper()
	host, portS, err := net.SplitHostPort(addr)
	if err != nil {
		h.t.Fatal(err)
	}
	port, _ := strconv.Atoi(portS)
	check = "chk-" + id
	tags := append([]string{h.tag(), versionTagPrefix + version}, extraTags...)
	err = h.c.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
		ID: id, Name: consulService, Address: host, Port: port, Tags: tags,
		Check: &consulapi.AgentServiceCheck{CheckID: check, TTL: "10m", Status: consulapi.HealthPassing},
	})
	if err != nil {
		h.t.Fatalf("registering %s: %v", id, err)
	}
	h.t.Cleanup(func() { _ = h.c.Agent().ServiceDeregister(id) })
	return check
}

// backend starts an httptest server and registers it as a replica of svc.
func (h *harness) backend(svc, version string, handler http.HandlerFunc) (id string, srv *httptest.Server) {
	h.t.Helper()
	srv = httptest.NewServer(handler)
	h.t.Cleanup(srv.Close)
	id, _ = h.replica(svc, strings.TrimPrefix(srv.URL, "http://"), version)
	return id, srv
}

// service is the gateway's state of svc (nil before its route loads).
func (h *harness) service(svc string) *service {
	return h.g.lookupService(servekv.LoadName(h.ns, svc))
}

// endpoints is svc's pool, nil when it has none.
func (h *harness) endpoints(svc string) []*endpoint {
	s := h.service(svc)
	if s == nil {
		return nil
	}
	return s.pool.Load().snapshot().eps
}

func (h *harness) waitEndpoints(svc string, n int) []*endpoint {
	h.t.Helper()
	var eps []*endpoint
	h.eventually(5*time.Second, fmt.Sprintf("%d endpoints of %s", n, svc), func() bool {
		eps = h.endpoints(svc)
		return len(eps) == n
	})
	return eps
}

// eventually polls cond (tests may poll; the gateway may not).
func (h *harness) eventually(limit time.Duration, what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type result struct {
	code   int
	header http.Header
	body   string
}

// do sends a request to the gateway; mod may set headers or the Host.
func (h *harness) do(method, path string, body io.Reader, mod ...func(*http.Request)) result {
	h.t.Helper()
	return h.doAt(h.url, method, path, body, mod...)
}

// attempt sends a request and returns the transport's error rather than
// failing the test: a gateway that refuses an upload before reading it
// closes the connection, and a client still writing may see the reset
// before the answer.
func (h *harness) attempt(method, path string, body io.Reader) (result, error) {
	req, err := http.NewRequest(method, h.url+path, body)
	if err != nil {
		return result{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{code: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// doAt sends a request to base (the gateway's public or admin URL).
func (h *harness) doAt(base, method, path string, body io.Reader, mod ...func(*http.Request)) result {
	h.t.Helper()
	req, err := http.NewRequest(method, base+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, f := range mod {
		f(req)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (h *harness) get(path string, mod ...func(*http.Request)) result {
	h.t.Helper()
	return h.do(http.MethodGet, path, nil, mod...)
}

func withBearer(secret string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+secret) }
}

func withHost(host string) func(*http.Request) {
	return func(r *http.Request) { r.Host = host }
}

// errorOf is the "error" of a JSON error body.
func errorOf(t *testing.T, body string) string {
	t.Helper()
	var e struct{ Error string }
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not a JSON error body: %q", body)
	}
	return e.Error
}

// echo answers with the path and query it got.
func echo(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		u := url.URL{Path: r.URL.Path, RawQuery: r.URL.RawQuery}
		fmt.Fprintf(w, "%s %s", name, u.String())
	}
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// mustClient is a Consul client that is never called (unit tests).
func mustClient(t *testing.T) *consulapi.Client {
	t.Helper()
	c, err := consulapi.NewClient(&consulapi.Config{Address: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startOwnConsul starts a dev agent for one test that stops it.
func startOwnConsul() (*testagent.Consul, error) { return testagent.StartConsul("") }
