package gateway

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/servekv"
)

func TestPrefixMatchesSegmentWise(t *testing.T) {
	for _, c := range []struct {
		prefix, path string
		want         bool
	}{
		{"/svc", "/svc", true},
		{"/svc", "/svc/", true},
		{"/svc", "/svc/predict", true},
		{"/svc", "/svcx", false},
		{"/svc", "/sv", false},
		{"/svc", "/", false},
		{"/a/b", "/a/b/c", true},
		{"/a/b", "/a/bc", false},
		{"", "/anything", true},
	} {
		if got := prefixMatches(c.prefix, c.path); got != c.want {
			t.Errorf("prefixMatches(%q, %q) = %v, want %v", c.prefix, c.path, got, c.want)
		}
	}
}

func TestTableMatchLongestPrefixAndHost(t *testing.T) {
	entry := func(name, prefix, host string) *routeEntry {
		return &routeEntry{
			route:  &servekv.Route{PathPrefix: prefix, Host: host},
			prefix: normalizePrefix(prefix), host: normalizeHost(host),
			svc: &service{name: name, key: "ns/" + name},
		}
	}
	tbl := newTable([]*routeEntry{
		entry("root", "/", ""),
		entry("svc", "/svc/", ""),
		entry("deep", "/svc/deep", ""),
		entry("svc-on-host", "/svc", "API.Example.com"),
	})
	for _, c := range []struct{ host, path, want string }{
		{"gw:8080", "/svc/x", "svc"},
		{"gw", "/svc", "svc"},
		{"gw", "/svc/deep/x", "deep"},
		{"gw", "/svc/deeper", "svc"},
		{"api.example.com:443", "/svc/x", "svc-on-host"},
		{"API.EXAMPLE.COM", "/svc", "svc-on-host"},
		{"api.example.com", "/svc/deep", "deep"}, // longest prefix first
		{"gw", "/svcx", "root"},
		{"gw", "/", "root"},
	} {
		e := tbl.match(c.host, c.path)
		if e == nil || e.svc.name != c.want {
			got := "<nil>"
			if e != nil {
				got = e.svc.name
			}
			t.Errorf("match(%q, %q) = %s, want %s", c.host, c.path, got, c.want)
		}
	}
	if e := newTable([]*routeEntry{entry("svc", "/svc", "")}).match("gw", "/other"); e != nil {
		t.Errorf("/other matched %s", e.svc.name)
	}
}

func TestStripPrefixKeepsTheRest(t *testing.T) {
	for _, c := range []struct{ prefix, in, path, raw string }{
		{"/svc", "/svc/predict", "/predict", ""},
		{"/svc", "/svc", "/", ""},
		{"/svc", "/svc/", "/", ""},
		{"/svc", "/svc/a%2Fb", "/a/b", "/a%2Fb"},
		{"", "/x", "/x", ""},
	} {
		u, err := url.Parse(c.in)
		if err != nil {
			t.Fatal(err)
		}
		path, raw := stripPrefix(c.prefix, u)
		if path != c.path || raw != c.raw {
			t.Errorf("stripPrefix(%q, %q) = %q, %q; want %q, %q", c.prefix, c.in, path, raw, c.path, c.raw)
		}
	}
}

func newEndpoint(id string, inflight int64) *endpoint {
	e := &endpoint{id: id, addr: id + ":1", load: &endpointLoad{}}
	e.load.inflight.Store(inflight)
	return e
}

func TestP2CPrefersTheLessLoaded(t *testing.T) {
	now := time.Now()
	idle, busy := newEndpoint("idle", 0), newEndpoint("busy", 10)
	for range 1000 {
		if e := pick([]*endpoint{busy, idle}, nil, now); e != idle {
			t.Fatalf("picked %s over the idle endpoint", e.id)
		}
	}
	// Of three, the busiest loses every pair it is drawn in; the idlest
	// wins every pair it is in (2 of 3 pairs).
	a, b, c := newEndpoint("a", 0), newEndpoint("b", 5), newEndpoint("c", 10)
	counts := map[string]int{}
	const n = 3000
	for range n {
		counts[pick([]*endpoint{a, b, c}, nil, now).id]++
	}
	if counts["c"] != 0 {
		t.Errorf("the busiest endpoint was picked %d times", counts["c"])
	}
	if f := float64(counts["a"]) / n; f < 0.6 || f > 0.73 {
		t.Errorf("the idlest endpoint got %.2f of the picks, want about 2/3", f)
	}
	// Ties go either way.
	x, y := newEndpoint("x", 3), newEndpoint("y", 3)
	counts = map[string]int{}
	for range 1000 {
		counts[pick([]*endpoint{x, y}, nil, now).id]++
	}
	if counts["x"] < 400 || counts["y"] < 400 {
		t.Errorf("ties are not split at random: %v", counts)
	}
}

func TestPickSkipsTriedAndEjected(t *testing.T) {
	now := time.Now()
	a, b := newEndpoint("a", 0), newEndpoint("b", 100)
	a.eject(now.Add(time.Second))
	for range 100 {
		if e := pick([]*endpoint{a, b}, nil, now); e != b {
			t.Fatalf("picked the ejected endpoint")
		}
	}
	if e := pick([]*endpoint{a, b}, nil, now.Add(2*time.Second)); e != a {
		t.Errorf("the ejection did not end")
	}
	b.eject(now.Add(time.Second))
	if e := pick([]*endpoint{a, b}, nil, now); e == nil {
		t.Errorf("all ejected: picked none, want one anyway")
	}
	if e := pick([]*endpoint{a, b}, []string{"a"}, now); e != b {
		t.Errorf("picked a tried endpoint")
	}
	if e := pick([]*endpoint{a, b}, []string{"a", "b"}, now); e != nil {
		t.Errorf("picked %s with all tried", e.id)
	}
}

// passes sends n requests at hz per second from start through one key's
// bucket and counts those allowed.
func passes(s *limiterSet, key string, l servekv.Limit, start time.Time, hz, n int) (ok int, waits []time.Duration) {
	for i := range n {
		at := start.Add(time.Duration(i) * time.Second / time.Duration(hz))
		allowed, wait := s.allow(key, "scope", l, at)
		if allowed {
			ok++
		} else {
			waits = append(waits, wait)
		}
	}
	return ok, waits
}

func TestLimiterFigures(t *testing.T) {
	l := servekv.Limit{RPS: 10, Burst: 20}
	start := time.Unix(1_000_000, 0)
	// 50 req/s against 10/s with a burst of 20: the burst lasts 25
	// requests (0.5 s, refilling 5), then 10 pass a second: burst + rps·T.
	s := newLimiterSet(1000)
	if ok, waits := passes(s, "2s", l, start, 50, 100); ok < 39 || ok > 41 {
		t.Errorf("2 s at 50 req/s: %d passed, want 40±1 (burst 20 + 10/s · 2 s)", ok)
	} else {
		for _, w := range waits {
			if w <= 0 || w > 100*time.Millisecond || retryAfterSeconds(w) != 1 {
				t.Fatalf("a refusal's wait %s, want (0, 100ms], Retry-After 1", w)
			}
		}
	}
	if ok, _ := passes(s, "1s", l, start, 50, 50); ok < 29 || ok > 31 {
		t.Errorf("1 s at 50 req/s: %d passed, want 30±1", ok)
	}
	// A refused request takes nothing: at 10/s exactly, after the burst,
	// every request passes even though refused ones came before.
	at := start.Add(10 * time.Second)
	if ok, _ := passes(s, "1s", l, at, 10, 30); ok != 30 {
		t.Errorf("after refusals, 30 requests at the limit rate: %d passed", ok)
	}

	// A changed limit replaces the bucket.
	s = newLimiterSet(1000)
	one := servekv.Limit{RPS: 1, Burst: 1}
	if ok, _ := s.allow("k", "scope", one, start); !ok {
		t.Fatal("first request refused")
	}
	if ok, wait := s.allow("k", "scope", one, start); ok || retryAfterSeconds(wait) != 1 {
		t.Fatalf("second request at 1/s: allowed %v, wait %s", ok, wait)
	}
	if ok, _ := s.allow("k", "scope", servekv.Limit{RPS: 1, Burst: 5}, start); !ok {
		t.Fatal("the limit changed but the old bucket still applies")
	}
	slow := servekv.Limit{RPS: 0.1, Burst: 1}
	s.allow("slow", "scope", slow, start)
	if ok, wait := s.allow("slow", "scope", slow, start); ok || retryAfterSeconds(wait) != 10 {
		t.Fatalf("at 0.1/s: allowed %v, Retry-After %d, want 10", ok, retryAfterSeconds(wait))
	}
	// No RPS: unlimited, and no bucket kept.
	for range 100 {
		if ok, _ := s.allow("free", "scope", servekv.Limit{}, start); !ok {
			t.Fatal("a zero limit refused a request")
		}
	}
	rare := servekv.Limit{RPS: 0.01, Burst: 2} // refills in 200 s
	s.allow("rare", "scope", rare, start)
	if n := s.size(); n != 3 {
		t.Errorf("%d buckets, want 3", n)
	}
	s.sweep(start.Add(30 * time.Second))
	if n := s.size(); n != 3 {
		t.Errorf("after 30 s idle: %d buckets, want 3 (each lives at least a minute)", n)
	}
	s.sweep(start.Add(2 * time.Minute))
	if n := s.size(); n != 1 {
		t.Errorf("after 2 min idle: %d buckets, want 1 (the one that takes 200 s to refill)", n)
	}
	s.sweep(start.Add(4 * time.Minute))
	if n := s.size(); n != 0 {
		t.Errorf("after 4 min idle: %d buckets, want 0", n)
	}
}

func TestBearerSecret(t *testing.T) {
	for _, c := range []struct {
		h, secret string
		ok        bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer  abc ", "abc", true},
		{"Basic abc", "", false},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"", "", false},
	} {
		s, ok := bearerSecret(c.h)
		if s != c.secret || ok != c.ok {
			t.Errorf("bearerSecret(%q) = %q, %v", c.h, s, ok)
		}
	}
}

func TestOutboundHeader(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "http://gw.example/svc/x", nil)
	r.RemoteAddr = "10.1.2.3:5555"
	r.Header.Set("Authorization", "Bearer secret")
	r.Header.Set("Connection", "keep-alive, X-Hop")
	r.Header.Set("X-Hop", "1")
	r.Header.Set("Keep-Alive", "timeout=5")
	r.Header.Set("Te", "trailers, gzip")
	r.Header.Set("Expect", "100-continue")
	r.Header.Set("X-Forwarded-For", "192.0.2.1")
	r.Header.Set("X-Keep", "yes")
	h := outboundHeader(r, true)
	for _, gone := range []string{"Authorization", "Connection", "X-Hop", "Keep-Alive", "Expect"} {
		if v := h.Get(gone); v != "" {
			t.Errorf("%s forwarded: %q", gone, v)
		}
	}
	for k, want := range map[string]string{
		"X-Keep": "yes", "Te": "trailers", "X-Forwarded-For": "192.0.2.1, 10.1.2.3",
		"X-Forwarded-Host": "gw.example", "X-Forwarded-Proto": "http",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if r.Header.Get("Authorization") == "" {
		t.Error("the client's own request was changed")
	}
	if h := outboundHeader(r, false); h.Get("Authorization") != "Bearer secret" {
		t.Error("a route without Auth dropped the client's Authorization")
	}
}

func TestNotReadyBeforeTheFirstRoutes(t *testing.T) {
	g, err := New(Config{Consul: mustClient(t), Nomad: newFakeNomad()})
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]int{HealthPath: 503, "/svc": 503, MetricsPath: 404, StatsPath: 404} {
		w := httptest.NewRecorder()
		g.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != want {
			t.Errorf("%s before Run: %d, want %d", path, w.Code, want)
		}
	}
	admin := g.AdminHandler("")
	for path, want := range map[string]int{HealthPath: 503, MetricsPath: 200, StatsPath: 200, "/svc": 404} {
		w := httptest.NewRecorder()
		admin.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != want {
			t.Errorf("admin %s before Run: %d, want %d", path, w.Code, want)
		}
	}
	if _, err := New(Config{Nomad: newFakeNomad()}); err == nil {
		t.Error("New without a Consul client did not fail")
	}
	if _, err := New(Config{Consul: mustClient(t)}); err == nil || !strings.Contains(err.Error(), "Nomad") {
		t.Errorf("New without a Nomad client: %v", err)
	}
	if _, err := New(Config{Consul: mustClient(t), Nomad: newFakeNomad(), MaxInflight: -1}); err == nil || !strings.Contains(err.Error(), "MaxInflight") {
		t.Errorf("New with a negative MaxInflight: %v", err)
	}
}
