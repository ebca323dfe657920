// Package e2e runs gpujob against real Nomad and Consul agents, started by
// the project's own scripts/dev-up.sh on loopback addresses. The tests run
// only with GPUJOB_E2E=1 (`make e2e` sets it); without it they skip.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"
)

// cluster is a dev cluster started by scripts/dev-up.sh.
type cluster struct {
	dir    string // GPUJOB_DEV_DIR
	env    map[string]string
	nomad  *api.Client
	repo   string
	opts   clusterOptions
	failed string // why the cluster could not start; tests fail with it
}

// clusterOptions say what dev-up starts.
type clusterOptions struct {
	clients       int  // Nomad clients
	gpus          int  // fake GPUs per client
	offset        int  // GPUJOB_DEV_PORT_OFFSET
	consulServers int  // GPUJOB_DEV_CONSUL_SERVERS (0: dev-up's default, one)
	acl, tls      bool // GPUJOB_DEV_ACL, GPUJOB_DEV_TLS
	docker        bool // GPUJOB_DEV_DOCKER: a dockerd and Nomad's docker driver
	gateway       bool // GPUJOB_DEV_GATEWAY: the gpujob gateway job (GPUJOB_GATEWAY_ADDR)
	exporter      bool // GPUJOB_DEV_EXPORTER: the gpujob exporter system job (GPUJOB_EXPORTER_ADDR)
	// driverExtra is HCL added to the task driver's plugin config
	// (GPUJOB_DEV_DRIVER_EXTRA).
	driverExtra string
	// serverExtra is HCL added to the Nomad server's server block
	// (GPUJOB_DEV_NOMAD_SERVER_EXTRA).
	serverExtra string
	// dynPorts is the first of the clients' dynamic task ports
	// (GPUJOB_DEV_DYN_PORTS; dynPortsPerClient per client). Every cluster
	// of the run gets a block of its own in 28000–32199: above every port
	// the clusters' agents use (their offsets put Nomad's and Consul's
	// ports up to 27600), and below Linux's ephemeral range (32768 up).
	// torch's rank 0 binds its MASTER_PORT on every address, so any socket
	// on that port fails it: seen in CI as "Address already in use" at
	// every restart, once on 33290 taken by an outgoing connection (when the
	// dynamic ports followed the offset into the ephemeral range), once on
	// 20502, the two-client cluster's Consul gRPC port.
	dynPorts int
}

// sched is the run's scheduler (e2e/lanes_test.go): the lanes, the dev
// cluster of each, and the shared clusters; nil when the e2e tests are off.
var sched *scheduler

// sharedCluster is a cluster some tests share beside dev: the first of its
// users that runs starts it, and it stops when the last of its users that
// this run selects (-run, -skip) ends, not at the end of the run, so that
// its agents' memory and CPU go back to the tests that follow. TestMain
// stops whatever is still up.
type sharedCluster struct {
	what string // for the failure: "the 3-server-Consul cluster"
	opts clusterOptions
	// users are the top-level tests that use it. A test that is not among
	// them fails: the cluster could be stopped before it runs.
	users []string

	mu      sync.Mutex
	c       *cluster
	pending map[string]bool // users yet to end while c is up
	joined  map[string]bool // users that have asked for c while it is up
}

// get returns the cluster, starting it if it is not up; the cluster stops
// when the last of its pending users ends.
func (s *sharedCluster) get(t *testing.T) *cluster {
	t.Helper()
	if sched == nil {
		t.Skip("e2e disabled: set GPUJOB_E2E=1")
	}
	name := t.Name()
	if strings.Contains(name, "/") {
		t.Fatalf("%s asks for %s from a subtest: ask in the top-level test, whose end the cluster counts", name, s.what)
	}
	if !isUser(s.users, name) {
		t.Fatalf("%s uses %s but is not among its users (e2e/cluster_test.go): add it there, "+
			"or the cluster may be stopped before it runs", name, s.what)
	}
	// One user at a time, in a lane of the run's (the cluster itself is
	// started below, by the first).
	sched.add(s.what, nil)
	sched.claim(t, s.what)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c == nil {
		// Up again for a second round (-count) or a test -run did not
		// seem to select: its users are pending again.
		s.c = running.start(s.opts)
		s.pending, s.joined = usersToRun(s.users), map[string]bool{}
	}
	c := s.c
	if !s.joined[name] {
		s.joined[name] = true
		s.pending[name] = true
		t.Cleanup(func() { s.leave(t, name) })
	}
	if c.failed != "" {
		t.Fatalf("%s did not start: %s", s.what, c.failed)
	}
	return c
}

// leave marks user name done and stops the cluster after the last one.
func (s *sharedCluster) leave(t *testing.T, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pending, name)
	if len(s.pending) > 0 || s.c == nil {
		return
	}
	c := s.c
	s.c = nil
	if err := running.stop(c); err != nil {
		t.Errorf("stopping %s after its last test: %v", s.what, err)
	}
}

// consulHA is the cluster of the tests that need a 3-server Consul (and a
// Consul client agent).
var consulHA = &sharedCluster{what: "the 3-server-Consul cluster",
	opts:  clusterOptions{clients: 1, gpus: fakeGPUsPerClient, offset: 16000, consulServers: 3, dynPorts: 30400},
	users: []string{"TestChaos", "TestFaultConsulLeaderKilled"}}

// pair is the cluster of the tests that lose a machine, and of the queue's
// gang test (a gang across machines): two clients of two GPUs each. Each test brings its lost client back (loseMachineFor). Its
// Nomad server gives a client 3 s of heartbeat TTL and 3 s of grace (Nomad:
// 10 s and 10 s, and a TTL of up to twice its minimum), so a lost machine is
// down in 6-9 s rather than 20-30: the tests wait on that.
var pair = &sharedCluster{what: "the two-client cluster",
	opts: clusterOptions{clients: 2, gpus: 2, offset: 12000, dynPorts: 28600,
		serverExtra: "  heartbeat_grace   = \"3s\"\n  min_heartbeat_ttl = \"3s\""},
	users: []string{"TestFaultNodeLost", "TestSweepNodeLost", "TestQueueGangHoldsNoGPUsIdle"}}

// pairCluster returns the shared two-client cluster.
func pairCluster(t *testing.T) *cluster { return pair.get(t) }

// haCluster returns the shared 3-server-Consul cluster.
func haCluster(t *testing.T) *cluster { return consulHA.get(t) }

const fakeGPUsPerClient = 4

// clientCPUMHz is the CPU every e2e client offers Nomad (dev-up's
// GPUJOB_DEV_CPU_MHZ), whatever the machine: Nomad's own fingerprint is
// cores × clock, and on a 2-core machine at 2.1 GHz (4,192 MHz) the dev
// cluster's gateway (500) and exporter (200) left room for three training
// members of 1,000 MHz, not the four GPUs' worth a test asks for: the
// fourth was never placed, on such machines only. The figure holds four
// members, the cluster's own jobs and a sweep controller with room to spare.
const clientCPUMHz = 8000

// dynPortsPerClient is each e2e client's count of dynamic task ports: seven
// clients' blocks fit between the agents' ports and the ephemeral range.
const dynPortsPerClient = 600

func TestMain(m *testing.M) {
	if dir := os.Getenv(teardownFixtureEnv); dir != "" {
		os.Exit(teardownFixture(m, dir))
	}
	if os.Getenv("GPUJOB_E2E") != "1" {
		fmt.Println("e2e: skipped; run `make e2e` (or set GPUJOB_E2E=1) to start a dev cluster and run them")
		os.Exit(m.Run())
	}
	flag.Parse() // for -run, -skip and -timeout (watchForTeardown, selected)
	lanes, err := e2eLanes()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	}
	// The lanes bound the tests that run at once, not go test's -parallel
	// (GOMAXPROCS by default): a test waiting for a busy shared cluster
	// would hold a -parallel slot while a dev cluster stood idle. An
	// explicit -parallel stays.
	if !flagGiven("test.parallel") {
		_ = flag.Set("test.parallel", "1000")
	}
	// The users the clusters and tests need, made now, one at a time:
	// useradd run by two lanes at once (a test's, a dev-up's) can find
	// /etc/passwd locked and fail.
	if err := makeUsers(e2eUsers); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	}
	sched = newScheduler(lanes)
	stopWatching := watchForTeardown(testTimeout(), teardownMargin(testTimeout()))
	// Lane 0's cluster first; the others come up while the first tests
	// run, and the tests waiting for a dev cluster take them once they are.
	sched.add(devKey(0), running.start(devLaneOptions(0)))
	for i := 1; i < lanes; i++ {
		go func() { sched.add(devKey(i), running.start(devLaneOptions(i))) }()
	}
	code := m.Run()
	stopWatching()
	if err := running.stopAll("the run is over"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		code = 1
	}
	os.Exit(code)
}

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Dir(wd)
}

// devClusterOptions are the dev clusters': one client of four GPUs, off
// the default ports, so `make dev` and the tests can run side by side; each
// lane's has ports of its own (devLaneOptions).
var devClusterOptions = clusterOptions{clients: 1, gpus: fakeGPUsPerClient, gateway: true, exporter: true,
	driverExtra: tenantsDriverConfig}

// flagGiven says whether the command line set flag name.
func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// startClusterOpts brings up a cluster as opts say; when ctx ends first,
// dev-up gets SIGTERM (and the cluster, failed, still has its dir for
// dev-down).
func startClusterOpts(ctx context.Context, opts clusterOptions) *cluster {
	clients, gpus, offset := opts.clients, opts.gpus, opts.offset
	c := &cluster{repo: repoRoot(), opts: opts}
	// A short name: the sweep controller's Task API socket lives under
	// the client's data_dir and its path must fit 107 bytes.
	dir, err := os.MkdirTemp("", "gj-e2e-")
	if err != nil {
		c.failed = err.Error()
		return c
	}
	// MkdirTemp makes it 0700: the tasks, which run as nobody, must reach
	// their task directories and checkpoints inside.
	if err := os.Chmod(dir, 0o755); err != nil {
		c.failed = err.Error()
		return c
	}
	c.dir = filepath.Join(dir, "dev")
	cmd := exec.CommandContext(ctx, filepath.Join(c.repo, "scripts", "dev-up.sh"))
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	// GPUJOB_E2E_PORT_SHIFT moves every test cluster's ports, so two e2e
	// runs (two checkouts) can share a machine.
	shift, err := envInt("GPUJOB_E2E_PORT_SHIFT", 0)
	if err != nil {
		c.failed = err.Error()
		return c
	}
	cmd.Env = append(os.Environ(),
		"GPUJOB_DEV_DIR="+c.dir,
		fmt.Sprintf("GPUJOB_DEV_PORT_OFFSET=%d", offset+shift),
		"GPUJOB_DEV_BACKEND=fake",
		fmt.Sprintf("GPUJOB_FAKE_GPUS=%d", gpus),
		fmt.Sprintf("GPUJOB_DEV_CLIENTS=%d", clients),
		fmt.Sprintf("GPUJOB_DEV_CPU_MHZ=%d", clientCPUMHz),
	)
	if opts.dynPorts > 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("GPUJOB_DEV_DYN_PORTS=%d", opts.dynPorts+shift),
			fmt.Sprintf("GPUJOB_DEV_DYN_PORTS_PER_CLIENT=%d", dynPortsPerClient))
	}
	if opts.driverExtra != "" {
		cmd.Env = append(cmd.Env, "GPUJOB_DEV_DRIVER_EXTRA="+opts.driverExtra)
	}
	if opts.serverExtra != "" {
		cmd.Env = append(cmd.Env, "GPUJOB_DEV_NOMAD_SERVER_EXTRA="+opts.serverExtra)
	}
	if opts.consulServers > 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("GPUJOB_DEV_CONSUL_SERVERS=%d", opts.consulServers))
	}
	if opts.acl {
		cmd.Env = append(cmd.Env, "GPUJOB_DEV_ACL=1")
	}
	if opts.tls {
		cmd.Env = append(cmd.Env, "GPUJOB_DEV_TLS=1")
	}
	if opts.docker {
		cmd.Env = append(cmd.Env, "GPUJOB_DEV_DOCKER=1")
	}
	// Only the clusters of the serving tests run a gateway.
	cmd.Env = append(cmd.Env, fmt.Sprintf("GPUJOB_DEV_GATEWAY=%d", map[bool]int{false: 0, true: 1}[opts.gateway]))
	// Only the package's own cluster runs the exporter (the monitoring test).
	cmd.Env = append(cmd.Env, fmt.Sprintf("GPUJOB_DEV_EXPORTER=%d", map[bool]int{false: 0, true: 1}[opts.exporter]))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		c.failed = fmt.Sprintf("scripts/dev-up.sh: %v\n%s", err, out.String())
		return c
	}
	fmt.Printf("e2e: dev cluster up in %s (%s)\n", time.Since(start).Round(time.Millisecond), c.dir)
	if c.env, err = readEnvFile(filepath.Join(c.dir, "env")); err != nil {
		c.failed = err.Error()
		return c
	}
	cfg := api.DefaultConfig()
	cfg.Address = c.env["NOMAD_ADDR"]
	// The tests' own client: the cluster's CA and client certificate with
	// TLS, the management token with ACLs (the CLI runs with the tokens a
	// test chooses).
	cfg.SecretID = c.secret("nomad-management")
	cfg.TLSConfig = &api.TLSConfig{CACert: c.env["NOMAD_CACERT"], ClientCert: c.env["NOMAD_CLIENT_CERT"], ClientKey: c.env["NOMAD_CLIENT_KEY"]}
	if c.nomad, err = api.NewClient(cfg); err != nil {
		c.failed = err.Error()
	}
	return c
}

// secret returns the secret of token name (scripts/dev-up.sh with
// GPUJOB_DEV_ACL=1: secrets/NAME.token), "" without ACLs.
func (c *cluster) secret(name string) string {
	dir := c.env["GPUJOB_DEV_SECRETS"]
	if dir == "" {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(dir, name+".token"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (c *cluster) stop() error {
	if c.dir == "" {
		return nil
	}
	cmd := exec.Command(filepath.Join(c.repo, "scripts", "dev-down.sh"))
	cmd.Env = append(os.Environ(), "GPUJOB_DEV_DIR="+c.dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("dev-down: %v\n%s", err, out)
	}
	if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
		return fmt.Errorf("dev-down left %s behind", c.dir)
	}
	return os.Remove(filepath.Dir(c.dir))
}

// readEnvFile parses the `export K=V` lines dev-up.sh writes.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the dev cluster's env file: %w", err)
	}
	defer f.Close()
	env := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimPrefix(strings.TrimSpace(s.Text()), "export ")
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(k, "#") {
			env[k] = strings.Trim(v, `"'`)
		}
	}
	return env, s.Err()
}

// script runs one of the repository's scripts against this cluster and
// returns its output; a failure is an error that carries the output.
func (c *cluster) script(name string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(c.repo, "scripts", name), args...)
	cmd.Env = append(os.Environ(), "GPUJOB_DEV_DIR="+c.dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("scripts/%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// consulClient is a Consul API client for the cluster's HTTP agent (over
// TLS, with the management token, where the cluster has them).
func (c *cluster) consulClient(t *testing.T) *consul.Client {
	t.Helper()
	return c.consulClientWith(t, c.secret("consul-management"))
}

// consulClientWith is consulClient with the given token.
func (c *cluster) consulClientWith(t *testing.T, token string) *consul.Client {
	t.Helper()
	cc, err := consul.NewClient(&consul.Config{
		Address: c.env["CONSUL_HTTP_ADDR"],
		Token:   token,
		TLSConfig: consul.TLSConfig{
			CAFile: c.env["CONSUL_CACERT"], CertFile: c.env["CONSUL_CLIENT_CERT"], KeyFile: c.env["CONSUL_CLIENT_KEY"],
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

// needCluster returns a dev cluster that the test has to itself until it
// ends (in a lane of the run, beside other tests); it skips without
// GPUJOB_E2E and fails when the cluster is down.
func needCluster(t *testing.T) *cluster {
	t.Helper()
	if sched == nil {
		t.Skip("e2e disabled: set GPUJOB_E2E=1")
	}
	keys := make([]string, len(devLanePorts))
	for i := range keys {
		keys[i] = devKey(i)
	}
	key, c := sched.claim(t, keys...)
	if c.failed != "" {
		t.Fatalf("%s did not start: %s", key, c.failed)
	}
	if why := running.closedReason(); why != "" {
		t.Fatalf("%s stopped: %s", key, why)
	}
	return c
}

// ctx returns a context that ends with the test or after d.
func ctx(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}
