package rendezvous

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/testagent"
)

// testAgent is the Consul agent this test binary started (nil in -short).
var testAgent struct {
	addr   string
	client *api.Client // shared by tests; counts requests
	count  *countingTransport
}

// countingTransport counts the HTTP requests made through it.
type countingTransport struct {
	base http.RoundTripper
	n    atomic.Int64
	// byKind counts requests per kind when set (benchmark diagnostics).
	mu     sync.Mutex
	byKind map[string]int
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.n.Add(1)
	c.mu.Lock()
	if c.byKind != nil {
		c.byKind[requestKind(req)]++
	}
	c.mu.Unlock()
	return c.base.RoundTrip(req)
}

// requestKind names a request for the benchmark's breakdown.
func requestKind(req *http.Request) string {
	p := req.URL.Path
	switch {
	case strings.HasPrefix(p, "/v1/session/create"):
		return "session-create"
	case strings.HasPrefix(p, "/v1/session/"):
		return "session-other"
	case strings.Contains(p, "/ctl/") && req.Method == http.MethodGet:
		return "ctl-watch"
	case strings.HasSuffix(p, "/m/") && req.Method == http.MethodGet:
		return "members-watch"
	case strings.Contains(p, "/m/live/") && req.Method == http.MethodPut:
		return "register"
	case strings.Contains(p, "/ctl/leader"):
		return "campaign"
	case strings.Contains(p, "/ctl/round") && req.Method == http.MethodPut:
		return "round-write"
	case strings.HasSuffix(p, "/roster"):
		return "roster-get"
	case p == "/v1/txn":
		return txnKind(req)
	}
	return req.Method + " other"
}

// txnKind names a transaction by what it writes: the coordinator lock
// (with round 1), a complete round (with its roster), or another round
// record.
func txnKind(req *http.Request) string {
	if req.GetBody == nil {
		return "txn"
	}
	body, err := req.GetBody()
	if err != nil {
		return "txn"
	}
	defer body.Close()
	b, _ := io.ReadAll(body)
	switch {
	case bytes.Contains(b, []byte(`"Verb":"lock"`)) && bytes.Contains(b, []byte(leaderKey)):
		return "campaign"
	case bytes.Contains(b, []byte(`"Verb":"set"`)) && bytes.Contains(b, []byte(rosterKey)):
		return "round-complete"
	}
	return "round-write"
}

func TestMain(m *testing.M) {
	flag.Parse()
	// A member process of the process benchmark, which -short never runs.
	if !testing.Short() && os.Getenv(memberEnv) != "" {
		os.Exit(runMember())
	}
	code := testagent.Main(m, "", func(a *testagent.Consul) (err error) {
		testAgent.addr = a.Addr
		// One transport for every in-process member, with room for as many
		// connections as members: the benchmark runs 1024 of them.
		// No gzip, as in the supervisor (consulClient).
		testAgent.count = &countingTransport{base: &http.Transport{
			MaxIdleConnsPerHost: 8192,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}}
		testAgent.client, err = api.NewClient(&api.Config{Address: testAgent.addr, HttpClient: &http.Client{Transport: testAgent.count}})
		return err
	})
	server.Stop()
	os.Exit(code)
}

// needConsul skips in -short mode, where TestMain started no agent.
func needConsul(t testing.TB) *api.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a Consul agent; skipped in -short mode")
	}
	return testAgent.client
}

// assertClean checks that no key of runID and no session of ours is left
// on the shared dev agent.
func assertClean(t *testing.T, runID string) {
	t.Helper()
	assertCleanOn(t, testAgent.client, runID)
}

// assertCleanOn checks that no key of runID and no session of ours is left.
func assertCleanOn(t *testing.T, c *api.Client, runID string) {
	t.Helper()
	keys, _, err := c.KV().Keys(DefaultPrefix+"/"+runID+"/", "", nil)
	if err != nil {
		t.Fatalf("list keys: %v", err)
	}
	if len(keys) > 0 {
		t.Errorf("keys left under %s: %v", runID, keys)
	}
	ss, _, err := c.Session().List(nil)
	if err != nil {
		t.Fatalf("list sessions: %v", err)
	}
	for _, s := range ss {
		if strings.HasPrefix(s.Name, "gpujob-rendezvous "+runID+" ") {
			t.Errorf("session left: %s %q", s.ID, s.Name)
		}
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// server is a real single Consul server with a data directory, for the
// outage tests, which stop and restart it; started by the first test that
// needs it (needServer).
var server = testagent.Lazy{Server: true, HCL: `session_ttl_min = "1s"`}

// serverTTL is the session TTL of the outage tests (the server accepts TTLs
// down to 1s, session_ttl_min): short, so that surviving an outage several
// TTLs long means something, but not so short that a loaded machine cannot
// renew within the 2×TTL Consul grants after its election (2 s was not
// enough with -race on two busy cores).
const serverTTL = 5 * time.Second

func needServer(t *testing.T) (*testagent.Consul, *api.Client) {
	t.Helper()
	return server.Need(t), server.Client(t)
}
