package testagent

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/hashicorp/consul/api"
)

// Main is the TestMain of a package whose tests all share one Consul dev
// agent, started before them: unless -short, it starts the agent (hcl is
// added to its config), hands it to use (which keeps what the tests need:
// its address, a client), runs the tests and stops the agent. It returns
// the exit code for os.Exit. A start or use that fails is reported on
// stderr and is exit code 1 with no test run: a missing agent binary must
// fail the package, never turn its tests into skips. With -short no agent
// is started and use is not called; the tests that need one skip.
func Main(m *testing.M, hcl string, use func(*Consul) error) int {
	// testing.Short panics before the flags are parsed, and m.Run has not
	// parsed them yet.
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() {
		return m.Run()
	}
	agent, err := StartConsul(hcl)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", filepath.Base(os.Args[0]), err)
		return 1
	}
	defer agent.Stop()
	if err := use(agent); err != nil {
		fmt.Fprintf(os.Stderr, "%s: using the Consul agent: %v\n", filepath.Base(os.Args[0]), err)
		return 1
	}
	return m.Run()
}

// Lazy is a Consul agent a package's tests share, started by the first
// test that needs it (Need, Client) rather than before all of them, so that
// a run of tests that need none (a -run selection, fuzz workers) starts
// none; Main stops it after the tests. Its zero value is a dev agent.
type Lazy struct {
	// HCL is added to the agent's config (e.g. session_ttl_min = "1s").
	HCL string
	// Server makes it a single server with a data directory
	// (StartConsulServer) instead of a dev agent, for tests that restart
	// it.
	Server bool

	once   sync.Once
	agent  *Consul
	client *api.Client
	err    error
}

// Start starts the agent on the first call and returns it, or why it could
// not start (the same error to every caller: a second attempt would take as
// long to fail).
func (l *Lazy) Start() (*Consul, error) {
	l.once.Do(func() {
		start := StartConsul
		if l.Server {
			start = StartConsulServer
		}
		if l.agent, l.err = start(l.HCL); l.err != nil {
			l.err = fmt.Errorf("starting the tests' Consul agent: %w", l.err)
			return
		}
		if l.client, l.err = api.NewClient(&api.Config{Address: l.agent.Addr}); l.err != nil {
			l.err = fmt.Errorf("a client of the tests' Consul agent: %w", l.err)
		}
	})
	return l.agent, l.err
}

// Need returns the agent, starting it on first use. It skips the test in
// -short mode and fails it when the agent cannot start.
func (l *Lazy) Need(t testing.TB) *Consul {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a Consul agent (-short)")
	}
	a, err := l.Start()
	if err != nil {
		t.Fatalf("needs a real Consul agent: %v", err)
	}
	return a
}

// Client is Need's agent's API client, one shared by every caller.
func (l *Lazy) Client(t testing.TB) *api.Client {
	t.Helper()
	l.Need(t)
	return l.client
}

// Stop stops the agent if one was started. Tests must have ended: it is for
// TestMain, after m.Run.
func (l *Lazy) Stop() {
	if l.agent != nil {
		l.agent.Stop()
	}
}

// Main runs the tests and then stops the agent if a test started it; it
// returns the exit code for os.Exit.
func (l *Lazy) Main(m *testing.M) int {
	defer l.Stop()
	return m.Run()
}
