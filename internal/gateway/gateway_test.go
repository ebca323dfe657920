package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/servekv"
)

func TestRoutesByPrefixAndHostAndStripsThePrefix(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var seen sync.Map // backend name -> last request's headers
	handler := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			seen.Store(name, r.Header.Clone())
			echo(name)(w, r)
		}
	}
	idA, _ := h.backend("a", "v1", handler("a"))
	h.backend("deep", "v1", handler("deep"))
	h.backend("hosted", "v1", handler("hosted"))
	h.route("a", servekv.Route{PathPrefix: "/svc"})
	h.route("deep", servekv.Route{PathPrefix: "/svc/deep/"})
	h.route("hosted", servekv.Route{PathPrefix: "/h", Host: "API.example.com"})
	h.waitRoute("a", "gw", "/svc")
	h.waitRoute("deep", "gw", "/svc/deep")
	h.waitRoute("hosted", "api.example.com", "/h")
	h.waitEndpoints("a", 1)
	h.waitEndpoints("deep", 1)
	h.waitEndpoints("hosted", 1)

	for _, c := range []struct {
		path, host string
		code       int
		body       string
	}{
		{"/svc", "", 200, "a /"},
		{"/svc/", "", 200, "a /"},
		{"/svc/predict?x=1&y=2", "", 200, "a /predict?x=1&y=2"},
		{"/svc/deep/x", "", 200, "deep /x"},
		{"/svc/deep", "", 200, "deep /"},
		{"/svc/deeper", "", 200, "a /deeper"},
		{"/h/x", "api.example.com:8080", 200, "hosted /x"},
		{"/h/x", "other.example.com", 404, ""},
		{"/svcx", "", 404, ""},
		{"/", "", 404, ""},
	} {
		var mod []func(*http.Request)
		if c.host != "" {
			mod = append(mod, withHost(c.host))
		}
		res := h.get(c.path, mod...)
		if res.code != c.code {
			t.Errorf("GET %s (Host %q): %d %s, want %d", c.path, c.host, res.code, res.body, c.code)
			continue
		}
		if c.code == 200 && res.body != c.body {
			t.Errorf("GET %s (Host %q): backend got %q, want %q", c.path, c.host, res.body, c.body)
		}
		if c.code == 404 {
			path, _, _ := strings.Cut(c.path, "?")
			if msg := errorOf(t, res.body); msg != "no service routes "+path {
				t.Errorf("GET %s: 404 says %q", c.path, msg)
			}
		}
	}
	if res := h.get("/svc/x"); res.header.Get(ReplicaHeader) != idA {
		t.Errorf("%s = %q, want %q", ReplicaHeader, res.header.Get(ReplicaHeader), idA)
	}
	v, _ := seen.Load("a")
	hdr := v.(http.Header)
	if hdr.Get("X-Forwarded-For") != "127.0.0.1" || hdr.Get("X-Forwarded-Proto") != "http" ||
		!strings.HasPrefix(hdr.Get("X-Forwarded-Host"), "127.0.0.1:") {
		t.Errorf("X-Forwarded headers: %v", hdr)
	}
}

func TestAuthRefusesWithoutReachingTheReplicaAndRevokesAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var hits atomic.Int64
	var sawAuth atomic.Value
	h.backend("m", "v1", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		sawAuth.Store(r.Header.Get("Authorization"))
		io.WriteString(w, "ok")
	})
	h.route("m", servekv.Route{Auth: true})
	secret, hash := h.token("m", nil)
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 1)
	h.eventually(5*time.Second, "the token", func() bool { _, ok := h.g.table.Load().match("", "/m").tokens[hash]; return ok })

	res := h.get("/m/x")
	if res.code != 401 || errorOf(t, res.body) != "missing bearer token" ||
		res.header.Get("WWW-Authenticate") != `Bearer realm="gpujob"` {
		t.Errorf("no token: %d %s %v", res.code, res.body, res.header)
	}
	res = h.get("/m/x", withBearer("gjt_not-a-token"))
	if res.code != 401 || errorOf(t, res.body) != "invalid token" {
		t.Errorf("wrong token: %d %s", res.code, res.body)
	}
	res = h.get("/m/x", func(r *http.Request) { r.Header.Set("Authorization", "Basic "+secret) })
	if res.code != 401 {
		t.Errorf("Basic scheme: %d", res.code)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("refused requests reached the replica %d times", n)
	}
	res = h.get("/m/x", withBearer(secret))
	if res.code != 200 || res.body != "ok" {
		t.Fatalf("good token: %d %s", res.code, res.body)
	}
	if a := sawAuth.Load().(string); a != "" {
		t.Errorf("the replica saw Authorization %q", a)
	}

	// Revoke: refused within a second of the delete.
	// Timed from before the delete: an upper bound that includes the write.
	start := time.Now()
	h.del(servekv.TokenKey(h.prefix, h.ns, "m", hash))
	for {
		res = h.get("/m/x", withBearer(secret))
		if res.code == 401 {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("a revoked token still passed after %s", time.Since(start))
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("revoked token refused %s after the delete", time.Since(start).Round(100*time.Microsecond))
	if strings.Contains(h.logged(), secret) {
		t.Error("the secret appears in the log")
	}
}

func TestRateLimitPerTokenAndPerIP(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.backend("m", "v1", echo("m"))
	h.backend("open", "v1", echo("open"))
	h.route("m", servekv.Route{Auth: true, RateLimit: &servekv.Limit{RPS: 10, Burst: 20}})
	h.route("open", servekv.Route{RateLimit: &servekv.Limit{RPS: 1, Burst: 2}})
	secret, hash := h.token("m", nil)
	strict, strictHash := h.token("m", &servekv.Limit{RPS: 1, Burst: 1})
	h.waitRoute("m", "", "/m")
	h.waitRoute("open", "", "/open")
	h.waitEndpoints("m", 1)
	h.waitEndpoints("open", 1)
	h.eventually(5*time.Second, "the tokens", func() bool {
		tk := h.g.table.Load().match("", "/m").tokens
		return len(tk) == 2 && tk[hash].ID != "" && tk[strictHash].ID != ""
	})

	// The token's own limit: 1 then refused.
	if res := h.get("/m", withBearer(strict)); res.code != 200 {
		t.Fatalf("strict token, first request: %d", res.code)
	}
	res := h.get("/m", withBearer(strict))
	if res.code != 429 || errorOf(t, res.body) != "rate limit exceeded" || res.header.Get("Retry-After") != "1" {
		t.Fatalf("strict token, second request: %d %s Retry-After %q", res.code, res.body, res.header.Get("Retry-After"))
	}
	// Per client IP without Auth: a burst of 2 at 1/s.
	var codes []int
	for range 3 {
		codes = append(codes, h.get("/open").code)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Errorf("per-IP limit 1/s burst 2, 3 requests: %v", codes)
	}

	// 50 req/s for 1 s at the route's 10/s, burst 20: burst + rps·T pass,
	// T being the time the requests actually spanned.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	ok, refused := 0, 0
	var first, last time.Time
	for i := range 50 {
		if i > 0 {
			<-tick.C
		}
		now := time.Now()
		if i == 0 {
			first = now
		}
		last = now
		switch res := h.get("/m", withBearer(secret)); res.code {
		case 200:
			ok++
		case 429:
			refused++
			if ra := res.header.Get("Retry-After"); ra != "1" {
				t.Errorf("Retry-After %q, want 1", ra)
			}
		default:
			t.Fatalf("unexpected %d %s", res.code, res.body)
		}
	}
	span := last.Sub(first)
	want := 20 + int(10*span.Seconds())
	t.Logf("50 requests over %s: %d passed, %d refused (want %d±2)", span.Round(time.Millisecond), ok, refused, want)
	if ok < want-2 || ok > want+2 {
		t.Errorf("%d passed, want %d±2", ok, want)
	}
}

func TestRetriesARefusedConnectionOnAnotherReplicaAndEjectsIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.EjectFor = time.Minute })
	liveID, _ := h.backend("m", "v1", echo("live"))
	deadID, _ := h.replica("m", deadAddr(t), "v1")
	h.route("m", servekv.Route{})
	h.waitRoute("m", "", "/m")
	eps := h.waitEndpoints("m", 2)
	var live, dead *endpoint
	for _, e := range eps {
		switch e.id {
		case liveID:
			live = e
		case deadID:
			dead = e
		}
	}
	// Load the live one, so that the balancer tries the dead one first.
	live.load.inflight.Store(5)
	res := h.do(http.MethodPost, "/m/x", strings.NewReader("payload"))
	live.load.inflight.Store(0)
	if res.code != 200 || res.body != "live /x" || res.header.Get(ReplicaHeader) != liveID {
		t.Fatalf("got %d %q from %q, want 200 from the live replica", res.code, res.body, res.header.Get(ReplicaHeader))
	}
	if !dead.ejected(time.Now()) {
		t.Fatal("the replica that refused the connection was not ejected")
	}
	if live.ejected(time.Now()) {
		t.Fatal("the live replica was ejected")
	}
	for range 20 {
		if res := h.get("/m/y"); res.code != 200 || res.header.Get(ReplicaHeader) != liveID {
			t.Fatalf("after the ejection: %d from %q", res.code, res.header.Get(ReplicaHeader))
		}
	}
	if n := dead.load.inflight.Load(); n != 0 {
		t.Errorf("the dead replica's in-flight count is %d", n)
	}
}

func TestAllReplicasRefusingIs502(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.replica("m", deadAddr(t), "v1")
	h.replica("m", deadAddr(t), "v1")
	h.route("m", servekv.Route{})
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 2)
	res := h.get("/m")
	if res.code != 502 || !strings.HasPrefix(errorOf(t, res.body), "replica _nomad-task-") {
		t.Fatalf("got %d %s, want 502 naming a replica", res.code, res.body)
	}
	for _, e := range h.endpoints("m") {
		if !e.ejected(time.Now()) {
			t.Errorf("%s not ejected", e.id)
		}
	}
}

func TestABrokenResponseIsNotRetried(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var hits atomic.Int64
	hangUp := func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.Copy(io.Discard, r.Body)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Le")
		buf.Flush()
		conn.Close()
	}
	h.backend("m", "v1", hangUp)
	h.backend("m", "v1", hangUp)
	h.route("m", servekv.Route{})
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 2)
	res := h.do(http.MethodPost, "/m", strings.NewReader("run once"))
	if res.code != 502 || !strings.HasPrefix(errorOf(t, res.body), "replica _nomad-task-") {
		t.Errorf("got %d %s, want 502", res.code, res.body)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("the request reached replicas %d times, want exactly once", n)
	}
	for _, e := range h.endpoints("m") {
		if e.ejected(time.Now()) {
			t.Errorf("%s ejected for a broken response", e.id)
		}
	}
}

func TestPoolDropsAReplicaAsSoonAsConsulDoes(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id1, _ := h.backend("m", "v1", echo("one"))
	_, srv2 := h.backend("m", "v2", echo("two"))
	h.route("m", servekv.Route{})
	h.waitRoute("m", "", "/m")
	eps := h.waitEndpoints("m", 2)
	keep := eps[0]
	if keep.id != id1 {
		keep = eps[1]
	}
	keep.load.inflight.Store(7)
	defer keep.load.inflight.Store(0)

	// The second replica's check goes critical.
	var check2, id2 string
	for _, e := range eps {
		if e.id != id1 {
			id2, check2 = e.id, "chk-"+e.id
		}
	}
	// Timed from before the update: an upper bound that includes the
	// agent's API call.
	start := time.Now()
	if err := h.c.Agent().UpdateTTL(check2, "dead", consulapi.HealthCritical); err != nil {
		t.Fatal(err)
	}
	h.eventually(time.Second, "the critical replica to leave the pool", func() bool { return len(h.endpoints("m")) == 1 })
	critical := time.Since(start)
	if got := h.endpoints("m")[0]; got != keep || got.load.inflight.Load() != 7 {
		t.Errorf("the remaining endpoint was replaced or lost its in-flight count")
	}
	for range 10 {
		if res := h.get("/m"); res.header.Get(ReplicaHeader) == id2 {
			t.Fatal("a request went to the critical replica")
		}
	}
	// It comes back when passing again, then is deregistered.
	if err := h.c.Agent().UpdateTTL(check2, "", consulapi.HealthPassing); err != nil {
		t.Fatal(err)
	}
	h.waitEndpoints("m", 2)
	start = time.Now()
	if err := h.c.Agent().ServiceDeregister(id2); err != nil {
		t.Fatal(err)
	}
	h.eventually(time.Second, "the deregistered replica to leave the pool", func() bool { return len(h.endpoints("m")) == 1 })
	t.Logf("critical replica left the pool in %s, deregistered one in %s",
		critical.Round(100*time.Microsecond), time.Since(start).Round(100*time.Microsecond))
	srv2.Close()
	if !strings.Contains(h.logged(), "pool team-a/m: 1 healthy endpoint(s) (v1: 1)") {
		t.Errorf("no log line for the pool change:\n%s", h.logged())
	}
}

func TestHoldsRequestsWhileTheServiceHasNoReplica(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.route("m", servekv.Route{QueueTimeout: servekv.Duration(10 * time.Second)})
	h.waitRoute("m", "", "/m")
	h.eventually(5*time.Second, "the empty pool loaded", func() bool { return h.service("m").pool.Load().snapshot().loaded })

	done := make(chan result, 1)
	start := time.Now()
	go func() { done <- h.do(http.MethodPost, "/m/x", strings.NewReader("held")) }()
	select {
	case name := <-h.queued:
		if name != "team-a/m" {
			t.Errorf("OnQueued(%q)", name)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnQueued was not called")
	}
	if q := h.g.Load().Queued["team-a/m"]; q != 1 {
		t.Errorf("Load().Queued = %d, want 1", q)
	}
	time.Sleep(300 * time.Millisecond)
	h.backend("m", "v1", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	})
	select {
	case res := <-done:
		if res.code != 200 || res.body != "held" {
			t.Fatalf("held request: %d %q", res.code, res.body)
		}
		t.Logf("held request answered after %s", time.Since(start).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the held request was not served when a replica appeared")
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Error("answered before a replica existed")
	}
	l := h.g.Load()
	if l.Queued["team-a/m"] != 0 || l.Inflight["team-a/m"] != 0 || l.Gateway != "gw-"+h.id {
		t.Errorf("Load after: %+v", l)
	}
}

func TestQueueFullAndQueueTimeoutAre503(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.route("m", servekv.Route{QueueLimit: 1, QueueTimeout: servekv.Duration(700 * time.Millisecond)})
	h.waitRoute("m", "", "/m")
	h.eventually(5*time.Second, "the empty pool loaded", func() bool { return h.service("m").pool.Load().snapshot().loaded })

	done := make(chan result, 1)
	start := time.Now()
	go func() { done <- h.get("/m") }()
	h.eventually(5*time.Second, "one held request", func() bool { return h.g.Load().Queued["team-a/m"] == 1 })
	t0 := time.Now()
	res := h.get("/m")
	if res.code != 503 || res.header.Get("Retry-After") != "1" ||
		!strings.HasPrefix(errorOf(t, res.body), "no healthy replica of team-a/m") {
		t.Errorf("queue full: %d %s Retry-After %q", res.code, res.body, res.header.Get("Retry-After"))
	}
	if el := time.Since(t0); el > 500*time.Millisecond {
		t.Errorf("a full queue answered after %s, not at once", el)
	}
	res = <-done
	if el := time.Since(start); res.code != 503 || res.header.Get("Retry-After") != "1" || el < 700*time.Millisecond {
		t.Errorf("queue timeout: %d %s after %s", res.code, res.body, el)
	}
	if q := h.g.Load().Queued["team-a/m"]; q != 0 {
		t.Errorf("%d still held", q)
	}
}

func TestRouteTimeoutIs504AndCancelsTheReplica(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cancelled := make(chan struct{}, 2)
	h.backend("m", "v3", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			cancelled <- struct{}{}
		case <-time.After(10 * time.Second):
		}
	})
	h.route("m", servekv.Route{Timeout: servekv.Duration(200 * time.Millisecond)})
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 1)
	start := time.Now()
	res := h.get("/m")
	if el := time.Since(start); res.code != 504 || el > 3*time.Second {
		t.Fatalf("got %d %s after %s, want 504 after 200ms", res.code, res.body, el)
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the replica's request was not cancelled")
	}

	// A client that goes away cancels the replica's request too.
	ctx, cancel := context.WithCancel(context.Background())
	h.route("m", servekv.Route{}) // no timeout
	h.eventually(5*time.Second, "the route without timeout", func() bool {
		return h.g.table.Load().match("", "/m").route.Timeout == 0
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.url+"/m", nil)
	go func() { time.Sleep(200 * time.Millisecond); cancel() }()
	if _, err := http.DefaultClient.Do(req); !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v", err)
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("a client's cancel did not reach the replica")
	}
	h.eventually(5*time.Second, "no request in flight", func() bool { return h.g.Load().Inflight["team-a/m"] == 0 })
}

func TestStreamsResponsesAsTheyCome(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// The replica writes the second chunk once the client has the first
	// (or after 2 s: a buffering gateway never delivers it before).
	var wroteSecond atomic.Bool
	gotFirst := make(chan struct{})
	h.backend("m", "v1", func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		w.Header().Set("Content-Type", "text/event-stream")
		for i, chunk := range []string{"data: one\n\n", "data: two\n\n", "data: three\n\n"} {
			switch i {
			case 1:
				select {
				case <-gotFirst:
				case <-time.After(2 * time.Second):
				}
				wroteSecond.Store(true)
			case 2:
				time.Sleep(200 * time.Millisecond)
			}
			io.WriteString(w, chunk)
			rc.Flush()
		}
	})
	h.route("m", servekv.Route{})
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 1)
	resp, err := http.Get(h.url + "/m/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	if wroteSecond.Load() {
		t.Fatal("the first chunk arrived only after the replica wrote the second: buffered")
	}
	close(gotFirst)
	rest, _ := io.ReadAll(br)
	if string(rest) != "\ndata: two\n\ndata: three\n\n" {
		t.Errorf("rest %q", rest)
	}
}

func TestMetricsCountRequestsByVersionAndCode(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.backend("m", "v7", echo("m"))
	h.route("m", servekv.Route{Auth: true})
	secret, hash := h.token("m", nil)
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 1)
	h.eventually(5*time.Second, "the token", func() bool { _, ok := h.g.table.Load().match("", "/m").tokens[hash]; return ok })
	for range 3 {
		if res := h.get("/m", withBearer(secret)); res.code != 200 {
			t.Fatal(res.code)
		}
	}
	h.get("/m")
	if res := h.get(MetricsPath); res.code != http.StatusNotFound {
		t.Errorf("/metrics on the public listener: %d, want 404 (the admin listener's)", res.code)
	}
	res := h.doAt(h.admin, http.MethodGet, MetricsPath, nil)
	if res.code != 200 {
		t.Fatal(res.code)
	}
	for _, want := range []string{
		`gpujob_gateway_requests_total{code="200",namespace="team-a",service="m",version="v7"} 3`,
		`gpujob_gateway_requests_total{code="401",namespace="team-a",service="m",version=""} 1`,
		`gpujob_gateway_request_duration_seconds_count{namespace="team-a",service="m"} 4`,
		`gpujob_gateway_endpoints{namespace="team-a",service="m",version="v7"} 1`,
		`gpujob_gateway_inflight{namespace="team-a",service="m"} 0`,
		`gpujob_gateway_queued{namespace="team-a",service="m"} 0`,
		`gpujob_gateway_request_duration_seconds_bucket{namespace="team-a",service="m",le="60"} 4`,
	} {
		if !strings.Contains(res.body, want+"\n") {
			t.Errorf("no %s in /metrics", want)
		}
	}
	if !regexp.MustCompile(`(?m)^gpujob_gateway_pool_updates_total\{namespace="team-a",service="m"\} [1-9]$`).MatchString(res.body) {
		t.Errorf("no pool update counted:\n%s", res.body)
	}
	if res := h.get(HealthPath); res.code != 200 {
		t.Errorf("healthz %d", res.code)
	}
}

func TestAMalformedRouteBreaksNoOther(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.backend("good", "v1", echo("good"))
	h.backend("later", "v1", echo("later"))
	h.route("good", servekv.Route{})
	h.put(servekv.RouteKey(h.prefix, h.ns, "bad"), []byte(`{"consul_service": `))
	h.put(servekv.RouteKey(h.prefix, h.ns, "nopath"), []byte(`{"consul_service":"x","path_prefix":"nope"}`))
	h.put(servekv.TokenKey(h.prefix, h.ns, "good", strings.Repeat("ab", 32)), []byte(`not json`))
	h.put(h.prefix+"/unrelated/key", []byte(`whatever`))
	h.waitRoute("good", "", "/good")
	h.waitEndpoints("good", 1)
	if res := h.get("/good/x"); res.code != 200 || res.body != "good /x" {
		t.Fatalf("good route: %d %s", res.code, res.body)
	}
	if res := h.get("/bad"); res.code != 404 {
		t.Errorf("malformed route: %d", res.code)
	}
	// A good route turned malformed keeps its last good version; routes
	// added after are still loaded.
	h.put(servekv.RouteKey(h.prefix, h.ns, "good"), []byte(`{]`))
	h.route("later", servekv.Route{})
	h.waitRoute("later", "", "/later")
	if res := h.get("/good/x"); res.code != 200 {
		t.Errorf("good route after being overwritten with garbage: %d", res.code)
	}
	logs := h.logged()
	for _, want := range []string{"skipping route at " + servekv.RouteKey(h.prefix, h.ns, "bad"),
		"skipping route at " + servekv.RouteKey(h.prefix, h.ns, "nopath"),
		"skipping route at " + servekv.RouteKey(h.prefix, h.ns, "good"), "skipping token at"} {
		if !strings.Contains(logs, want) {
			t.Errorf("no log %q in:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "not json") {
		t.Error("a token's value was logged")
	}
	// Deleting the route removes it.
	h.del(servekv.RouteKey(h.prefix, h.ns, "good"))
	h.eventually(5*time.Second, "the route's removal", func() bool { return h.g.table.Load().match("", "/good") == nil })
	if _, ok := h.g.Load().Inflight["team-a/good"]; ok {
		t.Error("a removed service is still in Load")
	}
}

func TestARouteMovedToAnotherConsulServiceFollows(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.backend("m", "v1", echo("old"))
	// A replica of the same job under another Consul name (a service
	// renamed in Consul).
	srv := httptest.NewServer(echo("new"))
	t.Cleanup(srv.Close)
	h.replicaAs("m", h.consulService("m2"), strings.TrimPrefix(srv.URL, "http://"), "v2")
	h.route("m", servekv.Route{})
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 1)
	if res := h.get("/m"); res.body != "old /" {
		t.Fatalf("before: %q", res.body)
	}
	h.route("m", servekv.Route{ConsulService: h.consulService("m2"), JobID: h.jobID("m"), Group: "serve"})
	h.eventually(5*time.Second, "the new pool", func() bool {
		eps := h.endpoints("m")
		return len(eps) == 1 && eps[0].version == "v2"
	})
	if res := h.get("/m"); res.body != "new /" {
		t.Fatalf("after: %q", res.body)
	}
}

func TestBodiesAreBoundedAndForwarded(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.MaxBodyBytes = 16 })
	var hits atomic.Int64
	h.backend("m", "v1", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		json.NewEncoder(w).Encode(map[string]any{"len": r.ContentLength, "body": string(b)})
	})
	h.route("m", servekv.Route{})
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 1)
	res := h.do(http.MethodPost, "/m", strings.NewReader("0123456789abcdef"))
	if res.code != 200 || res.body != `{"body":"0123456789abcdef","len":16}`+"\n" {
		t.Errorf("16 bytes: %d %s", res.code, res.body)
	}
	res = h.do(http.MethodPost, "/m", strings.NewReader("0123456789abcdefg"))
	if res.code != 413 {
		t.Errorf("17 bytes: %d", res.code)
	}
	// Without a Content-Length (chunked) too.
	res = h.do(http.MethodPost, "/m", io.MultiReader(strings.NewReader("0123456789"), strings.NewReader("abcdefg")))
	if res.code != 413 {
		t.Errorf("17 chunked bytes: %d", res.code)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("the replica got %d requests, want 1", n)
	}
}

// A Consul outage keeps the routes, tokens and pools: the gateway goes on
// serving what it knew.
func TestAConsulOutageKeepsTheLastGoodState(t *testing.T) {
	t.Parallel()
	consulClient(t) // the shared agent's binary is there
	if testing.Short() {
		t.Skip()
	}
	agent, err := startOwnConsul()
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Stop()
	c, err := consulapi.NewClient(&consulapi.Config{Address: agent.Addr})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(cfg *Config) { cfg.Consul = c })
	h.c = c
	h.backend("m", "v1", echo("m"))
	h.route("m", servekv.Route{Auth: true})
	secret, hash := h.token("m", nil)
	h.waitRoute("m", "", "/m")
	h.waitEndpoints("m", 1)
	h.eventually(5*time.Second, "the token", func() bool { _, ok := h.g.table.Load().match("", "/m").tokens[hash]; return ok })
	agent.StopProcess()
	// Both watches (routes and replicas) have failed and said so.
	h.eventually(5*time.Second, "the watch errors were not logged", func() bool {
		l := h.logged()
		return strings.Contains(l, "watching routes under") && strings.Contains(l, "watching the replicas of") &&
			strings.Count(l, "keeping the last good") >= 2
	})
	if res := h.get("/m", withBearer(secret)); res.code != 200 {
		t.Fatalf("during the outage: %d %s", res.code, res.body)
	}
	if len(h.endpoints("m")) != 1 {
		t.Fatal("the pool was emptied by the outage")
	}
}
