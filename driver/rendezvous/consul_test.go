package rendezvous

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
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
		return "txn-complete"
	}
	return req.Method + " other"
}

// consulBin finds the pinned Consul build the way scripts/lib.sh does.
func consulBin() string {
	if b := os.Getenv("CONSUL_BIN"); b != "" {
		return b
	}
	cache := os.Getenv("GPUJOB_CACHE_DIR")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, _ := os.UserHomeDir()
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "gpujob")
	}
	return filepath.Join(cache, "consul-1.15.6", "consul")
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	stop, err := startAgent()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rendezvous tests:", err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// startAgent runs `consul agent -dev` on free ports, configured for many
// in-process members sharing one client IP.
func startAgent() (func(), error) {
	bin := consulBin()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("consul agent binary %s not found: run `scripts/install-agents.sh consul` (or set CONSUL_BIN), or use -short to skip the Consul tests", bin)
	}
	ports, err := freePorts(4)
	if err != nil {
		return nil, fmt.Errorf("pick ports: %w", err)
	}
	hcl := fmt.Sprintf(`ports { http = %d, dns = -1, grpc = -1, grpc_tls = -1, serf_lan = %d, serf_wan = %d, server = %d }
limits { http_max_conns_per_client = 8192 }
log_level = "warn"`, ports[0], ports[1], ports[2], ports[3])
	dir, err := os.MkdirTemp("", "rendezvous-consul-")
	if err != nil {
		return nil, err
	}
	cfgFile := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(cfgFile, []byte(hcl), 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1", "-config-file", cfgFile)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		os.RemoveAll(dir)
	}

	testAgent.addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	testAgent.count = &countingTransport{base: &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: 8192,
		IdleConnTimeout:     90 * time.Second,
	}}
	testAgent.client, err = api.NewClient(&api.Config{Address: testAgent.addr, HttpClient: &http.Client{Transport: testAgent.count}})
	if err != nil {
		stop()
		return nil, err
	}
	// Wait for the dev server to elect itself (test setup, not library
	// code: a bounded readiness wait is fine here).
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "agent.log"))
			stop()
			return nil, fmt.Errorf("consul agent exited early:\n%s", log)
		default:
		}
		if leader, err := testAgent.client.Status().Leader(); err == nil && leader != "" {
			// The KV store also needs the agent's own node registered
			// for sessions (serfHealth).
			if _, _, err := testAgent.client.Session().Create(&api.SessionEntry{TTL: "10s", Behavior: "delete"}, nil); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "agent.log"))
			stop()
			return nil, fmt.Errorf("consul agent not ready after 60s:\n%s", log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Remove the probe session(s).
	if ss, _, err := testAgent.client.Session().List(nil); err == nil {
		for _, s := range ss {
			testAgent.client.Session().Destroy(s.ID, nil)
		}
	}
	return stop, nil
}

// needConsul skips in -short mode, where TestMain started no agent.
func needConsul(t testing.TB) *api.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a Consul agent; skipped in -short mode")
	}
	return testAgent.client
}

// assertClean checks that no key of runID and no session of ours is left.
func assertClean(t *testing.T, runID string) {
	t.Helper()
	c := testAgent.client
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
