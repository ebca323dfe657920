// Command benchcmp benchmarks gpujob's gateway against HAProxy and against
// going direct to the replicas, interleaved in one run, and measures how
// fast the gateway's pool follows a replica's health in Consul.
//
// Everything runs on this machine, on loopback:
//
//   - a Consul dev agent (internal/testagent, the cached agent build);
//   - one backend process (this binary, -role backend) serving two replicas,
//     each a Go HTTP server that sleeps --service-time per request and answers
//     a small JSON body; both are registered in Consul with a passing TTL
//     check and the route's tag;
//   - the gateway (this binary, -role gateway): gateway.New, Run and an
//     http.Server as `gpujob gateway run` wires them, reading a servekv.Route
//     (auth on, no rate limit) and one token from Consul KV;
//   - HAProxy (Debian's haproxy 2.6), http mode, balance leastconn, the same
//     two replicas, keep-alive to them (http-reuse always), the same path
//     prefix strip and a bearer check;
//   - the load generator, in this process: --conns workers, each on its own
//     keep-alive connection, closed loop (a worker sends its next request when
//     the last one's answer is in), every latency recorded.
//
// Each round measures every arm once (direct, gateway, haproxy), in an order
// rotated by the round; --alt-gateway adds the gateway of another build as
// one more arm, --pin puts the proxies on CPUs of their own. Then the pool
// test flips one replica's TTL check to critical and back, under load, and
// times when the gateway's pool changes (its /metrics) and when it stops and
// starts sending the replica requests (seen by the replica itself), beside
// when Consul answers a blocking query of its own.
//
// It prints a markdown table and one JSON line (also written to --json).
// scripts/bench/gateway-compare.sh builds and runs it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/servekv"
	"github.com/gpujob/gpujob/internal/testagent"
)

// The names the benchmark's service goes by.
const (
	benchNS       = "bench"
	benchService  = "echo"
	consulService = "gpujob-bench-echo"
	routeTag      = "gpujob-ns=bench"
	routePrefix   = "/bench"
	requestPath   = "/bench/predict"
	versionTag    = "gpujob-version=v1"
	// replicaIDFmt and allocIDFmt name replica i as Nomad would register
	// the allocation of a job: the gateway admits only those (admission).
	replicaIDFmt   = "_nomad-task-" + allocIDFmt + "-replica-gpujob-bench-echo-http"
	allocIDFmt     = "00000000-0000-4000-8000-%012d"
	benchJob       = "bench-echo"
	benchGroup     = "replica"
	checkIDFmt     = "gpujob-bench-echo-r%d-ttl"
	defaultRounds  = 5
	requestBody    = `{"inputs":"The quick brown fox jumps over the lazy dog","parameters":{"max_new_tokens":1}}`
	armDirect      = "direct"
	armGateway     = "gateway"
	armHAProxy     = "haproxy"
	armGatewayAlt  = "gateway-alt"
	childReadyLine = "READY"
)

type options struct {
	// attack runs the attack benchmark (attack.go) instead of the
	// comparison.
	attack      bool
	ao          attackOptions
	gatewayBin  string
	rounds      int
	duration    time.Duration
	warmup      time.Duration
	conns       int
	serviceTime time.Duration
	poolReps    int
	poolConns   int
	haproxy     string
	nbthread    int
	jsonPath    string
	profileDir  string
	keep        bool
	altGateway  string
	pin         string // "LOAD:PROXY" CPU lists, "" = no pinning
	proxyCPUs   string
}

func main() {
	role := flag.String("role", "", "internal: run as a child (backend or gateway)")
	var o options
	flag.IntVar(&o.rounds, "rounds", defaultRounds, "rounds; each measures every arm once, in an order rotated by the round")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "measured time per arm and round")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "load before each arm's measured window (connections open, pools warm)")
	flag.IntVar(&o.conns, "conns", 64, "concurrent connections (closed-loop workers)")
	flag.DurationVar(&o.serviceTime, "service-time", 20*time.Millisecond, "each replica's time per request")
	flag.IntVar(&o.poolReps, "pool-reps", 5, "repetitions of the pool update test (0: skip it)")
	flag.IntVar(&o.poolConns, "pool-conns", 0, "workers through the gateway during the pool test (0: --conns)")
	flag.StringVar(&o.haproxy, "haproxy", "haproxy", "the HAProxy binary; \"none\" skips the HAProxy arm")
	flag.IntVar(&o.nbthread, "nbthread", 0, "HAProxy's nbthread; 0: the CPUs the proxies may use (the gateway's GOMAXPROCS is Go's default, the same count)")
	flag.StringVar(&o.pin, "pin", "", "`LOAD:PROXY` CPU lists for taskset, e.g. 0:1: this program, Consul and the replicas on LOAD, the gateway and HAProxy on PROXY (default: nothing pinned)")
	flag.StringVar(&o.jsonPath, "json", "", "also write the JSON line to this file")
	flag.StringVar(&o.profileDir, "profile", "", "write a CPU profile of the gateway during each gateway window into this directory (a diagnostic run: profiling costs the gateway CPU)")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (HAProxy config, child logs)")
	flag.StringVar(&o.altGateway, "alt-gateway", "", "a benchcmp `binary` built from another revision: its gateway is one more arm, gateway-alt (to measure a change of internal/gateway in the same run)")
	flag.StringVar(&o.gatewayBin, "gateway-bin", "", "a benchcmp `binary` of another revision whose gateway is the one measured (the attack benchmark of the gateway before a change)")
	flag.BoolVar(&o.attack, "attack", false, "run the attack benchmark instead: the gateway under slow uploads and a slowloris while legitimate load flows")
	flag.IntVar(&o.ao.legitRPS, "legit-rps", 50, "attack: legitimate requests a second")
	flag.IntVar(&o.ao.uploads, "attack-uploads", 300, "attack: concurrent slow uploads")
	flag.Int64Var(&o.ao.body, "attack-body", 10_000_000, "attack: each upload's Content-Length")
	flag.IntVar(&o.ao.slowloris, "attack-slowloris", 500, "attack: slowloris connections")
	flag.DurationVar(&o.ao.attackFor, "attack-for", 15*time.Second, "attack: how long it lasts")
	flag.DurationVar(&o.ao.before, "attack-before", 3*time.Second, "attack: legitimate load before it")
	flag.DurationVar(&o.ao.recovery, "attack-after", 10*time.Second, "attack: legitimate load after it (the recovery window)")
	flag.DurationVar(&o.ao.anchorFor, "anchor-for", 10*time.Second, "attack: the anchor's legitimate load, without attack")
	flag.IntVar(&o.ao.rssCapMiB, "rss-cap", 256, "attack: the gateway's RSS target, MiB")
	flag.DurationVar(&o.ao.recoverySLO, "recovery-slo", 5*time.Second, "attack: the recovery target after the attack ends")
	// The children's flags.
	var c childOptions
	flag.StringVar(&c.consul, "consul", "", "internal: Consul's address (gateway)")
	flag.StringVar(&c.names, "names", "r1,r2", "internal: the replicas' names (backend)")
	// The replicas the gateway child's Nomad vouches for come in the
	// environment, which a benchcmp of an older revision (-alt-gateway,
	// -gateway-bin) ignores, where a flag would fail it.
	c.replicas = os.Getenv("BENCHCMP_REPLICAS")
	flag.Parse()

	switch *role {
	case "backend":
		c.serviceTime = o.serviceTime
		runBackendRole(c)
		return
	case "gateway":
		runGatewayRole(c)
		return
	case "":
	default:
		fatalf("unknown -role %q", *role)
	}
	if o.attack {
		o.haproxy, o.altGateway, o.poolReps = "none", "", 0
		if o.ao.legitRPS < 1 || o.ao.uploads < 0 || o.ao.slowloris < 0 || o.ao.body < 1 || o.ao.attackFor <= 0 || o.ao.recovery < time.Second {
			fatalf("--legit-rps must be >= 1, --attack-uploads and --attack-slowloris >= 0, --attack-body >= 1, --attack-for > 0 and --attack-after >= 1s")
		}
	}
	if o.rounds < 1 || o.conns < 2 || o.duration <= 0 {
		fatalf("--rounds must be >= 1, --conns >= 2 and --duration > 0")
	}
	if o.poolConns <= 0 {
		o.poolConns = o.conns
	}
	if o.pin != "" {
		load, proxy, ok := strings.Cut(o.pin, ":")
		if !ok || cpuCount(load) == 0 || cpuCount(proxy) == 0 {
			fatalf("--pin wants LOAD:PROXY CPU lists (e.g. 0:1), got %q", o.pin)
		}
		o.proxyCPUs = proxy
		if os.Getenv("BENCHCMP_PINNED") == "" {
			// Again, on the load CPUs: whatever this starts inherits them.
			ts, err := exec.LookPath("taskset")
			if err != nil {
				fatalf("--pin needs taskset: %v", err)
			}
			self, err := os.Executable()
			if err != nil {
				fatalf("%v", err)
			}
			err = syscall.Exec(ts, append([]string{"taskset", "-c", load, self}, os.Args[1:]...),
				append(os.Environ(), "BENCHCMP_PINNED=1"))
			fatalf("exec taskset: %v", err)
		}
	}
	if o.nbthread <= 0 {
		o.nbthread = runtime.NumCPU()
		if o.proxyCPUs != "" {
			o.nbthread = cpuCount(o.proxyCPUs)
		}
	}
	if err := run(o); err != nil {
		fatalf("%v", err)
	}
}

type childOptions struct {
	consul      string
	names       string
	replicas    string
	serviceTime time.Duration
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchcmp: "+format+"\n", args...)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchcmp: %s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// env is the running set-up: the agent, the children and their addresses.
type env struct {
	o        options
	dir      string
	consul   *testagent.Consul
	client   *consulapi.Client
	secret   string
	backends []string // the replicas' host:port
	backCtl  string   // the backend process's control address
	gwAddr   string
	gwAdmin  string // its admin listener (/metrics)
	gwPprof  string
	gwProcs  int    // the gateway's GOMAXPROCS
	altAddr  string // the -alt-gateway's gateway
	haAddr   string // "" when HAProxy is skipped
	haVer    string
	haSkip   string // why HAProxy was skipped
	children []*child
}

func run(o options) (err error) {
	dir, err := os.MkdirTemp("", "gpujob-benchcmp-")
	if err != nil {
		return err
	}
	e := &env{o: o, dir: dir}
	var cleanupOnce sync.Once
	cleanup := func() {
		cleanupOnce.Do(func() {
			for i := len(e.children) - 1; i >= 0; i-- {
				e.children[i].stop()
			}
			if e.consul != nil {
				e.consul.Stop()
			}
			if !o.keep {
				os.RemoveAll(dir)
			} else {
				logf("kept %s", dir)
			}
		})
	}
	defer cleanup()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		logf("%s: stopping", s)
		cleanup()
		os.Exit(130)
	}()

	if err := e.setUp(); err != nil {
		if e.dir != "" {
			e.dumpLogs()
		}
		return err
	}
	if o.attack {
		return e.runAttackBench(o.ao)
	}
	res := &results{
		Config: resultConfig{
			Rounds: o.rounds, DurationS: o.duration.Seconds(), WarmupS: o.warmup.Seconds(), Conns: o.conns,
			ServiceTimeMs: ms(o.serviceTime), Replicas: len(e.backends), CPUs: onlineCPUs(),
			GatewayGOMAXPROCS: e.gwProcs, Pinned: o.pin, HAProxyNbthread: o.nbthread, HAProxyVersion: e.haVer,
			HAProxySkipped: e.haSkip, AltGateway: o.altGateway, GoVersion: runtime.Version(), Date: time.Now().UTC().Format(time.RFC3339),
		},
	}
	arms := []string{armDirect, armGateway}
	if e.haAddr != "" {
		arms = append(arms, armHAProxy)
	}
	if e.altAddr != "" {
		arms = append(arms, armGatewayAlt)
	}
	for r := 0; r < o.rounds; r++ {
		order := make([]string, len(arms))
		for i := range arms {
			order[i] = arms[(i+r)%len(arms)]
		}
		logf("round %d/%d: %s", r+1, o.rounds, strings.Join(order, ", "))
		for pos, arm := range order {
			ar, err := e.measureArm(arm, r)
			if err != nil {
				e.dumpLogs()
				return fmt.Errorf("round %d, %s: %w", r+1, arm, err)
			}
			ar.Round, ar.Position = r+1, pos+1
			logf("  %-11s %7.0f req/s  p50 %6.2f ms  p99 %6.2f ms  errors %d  proxy CPU %5.1f us/req (r/w syscalls %.2f/%.2f)  machine busy %3.0f%% (not ours %3.0f%%)",
				arm, ar.RPS, ar.P50Ms, ar.P99Ms, ar.Errors, ar.ProxyCPUUsPerReq, ar.ProxyReadsPerReq, ar.ProxyWritesPerReq, 100*ar.MachineBusy, 100*ar.OtherBusy)
			res.Runs = append(res.Runs, ar)
		}
	}
	if o.poolReps > 0 {
		logf("pool update: %d flips of replica r2's check, %d workers through the gateway", o.poolReps, o.poolConns)
		pr, err := e.measurePool()
		if err != nil {
			e.dumpLogs()
			return fmt.Errorf("pool update test: %w", err)
		}
		res.Pool = pr
	}
	res.summarize()
	fmt.Println(res.markdown())
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	if o.jsonPath != "" {
		if err := os.WriteFile(o.jsonPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// setUp starts Consul, the backends, the gateway and HAProxy, and waits
// until each routes to both replicas.
func (e *env) setUp() error {
	logf("starting a Consul dev agent (%s)", testagent.ConsulBin())
	var err error
	if e.consul, err = testagent.StartConsul(""); err != nil {
		return err
	}
	cfg := consulapi.DefaultConfig()
	cfg.Address = e.consul.Addr
	if e.client, err = consulapi.NewClient(cfg); err != nil {
		return err
	}

	back, err := e.startChild("backend", "-role", "backend", "-names", "r1,r2",
		"-service-time", e.o.serviceTime.String())
	if err != nil {
		return err
	}
	// READY <control> <r1> <r2>
	if len(back.ready) < 3 {
		return fmt.Errorf("backend said %q", strings.Join(back.ready, " "))
	}
	e.backCtl, e.backends = back.ready[0], back.ready[1:]
	logf("replicas on %s", strings.Join(e.backends, ", "))
	if err := e.register(); err != nil {
		return err
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	if e.o.gatewayBin != "" {
		self = e.o.gatewayBin
	}
	gw, err := e.startProxy("gateway", self, "-role", "gateway", "-consul", e.consul.Addr)
	if err != nil {
		return err
	}
	if len(gw.ready) < 3 {
		return fmt.Errorf("gateway said %q", strings.Join(gw.ready, " "))
	}
	e.gwAddr, e.gwPprof = gw.ready[0], gw.ready[1]
	e.gwProcs, _ = strconv.Atoi(gw.ready[2])
	e.gwAdmin = e.gwAddr // a gateway from before the admin listener
	if len(gw.ready) > 3 {
		e.gwAdmin = gw.ready[3]
	}
	logf("gateway on %s (pprof %s, GOMAXPROCS %d)", e.gwAddr, e.gwPprof, e.gwProcs)
	if err := e.waitBothReplicas(e.gwAddr, "gateway"); err != nil {
		return err
	}

	if e.o.altGateway != "" {
		alt, err := e.startProxy(armGatewayAlt, e.o.altGateway, "-role", "gateway", "-consul", e.consul.Addr)
		if err != nil {
			return err
		}
		if len(alt.ready) < 1 {
			return fmt.Errorf("%s said %q", armGatewayAlt, strings.Join(alt.ready, " "))
		}
		e.altAddr = alt.ready[0]
		logf("%s (%s) on %s", armGatewayAlt, e.o.altGateway, e.altAddr)
		if err := e.waitBothReplicas(e.altAddr, armGatewayAlt); err != nil {
			return err
		}
	}

	if err := e.startHAProxy(); err != nil {
		return err
	}
	if e.haAddr != "" {
		if err := e.waitBothReplicas(e.haAddr, "haproxy"); err != nil {
			return err
		}
	}
	return nil
}

// register writes the replicas into Consul's catalog and the route and a
// token into KV, as `gpujob service deploy` and `gpujob token create` do.
func (e *env) register() error {
	for i, addr := range e.backends {
		host, port, err := splitHostPort(addr)
		if err != nil {
			return err
		}
		err = e.client.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
			ID: fmt.Sprintf(replicaIDFmt, i+1), Name: consulService, Address: host, Port: port,
			Tags:  []string{routeTag, versionTag},
			Check: &consulapi.AgentServiceCheck{CheckID: fmt.Sprintf(checkIDFmt, i+1), TTL: "1h", Status: consulapi.HealthPassing},
		})
		if err != nil {
			return fmt.Errorf("registering replica %d: %w", i+1, err)
		}
	}
	route := servekv.Route{
		Namespace: benchNS, Service: benchService, ConsulService: consulService, Tag: routeTag,
		PathPrefix: routePrefix, Auth: true, Timeout: servekv.Duration(30 * time.Second),
		JobID: benchJob, Group: benchGroup,
	}
	rb, _ := json.Marshal(route)
	kv := e.client.KV()
	if _, err := kv.Put(&consulapi.KVPair{Key: servekv.RouteKey(servekv.DefaultPrefix, benchNS, benchService), Value: rb}, nil); err != nil {
		return fmt.Errorf("writing the route: %w", err)
	}
	secret, hash, id, err := servekv.NewSecret()
	if err != nil {
		return err
	}
	tb, _ := json.Marshal(servekv.Token{ID: id, Name: "bench", Created: time.Now()})
	if _, err := kv.Put(&consulapi.KVPair{Key: servekv.TokenKey(servekv.DefaultPrefix, benchNS, benchService, hash), Value: tb}, nil); err != nil {
		return fmt.Errorf("writing the token: %w", err)
	}
	e.secret = secret
	return nil
}

// waitBothReplicas sends requests through a proxy until both replicas have
// answered one (the route, the token and the pool are loaded).
func (e *env) waitBothReplicas(addr, name string) error {
	deadline := time.Now().Add(20 * time.Second)
	seen := map[string]bool{}
	var last string
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+requestPath, strings.NewReader(requestBody))
		req.Header.Set("Authorization", "Bearer "+e.secret)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			last = err.Error()
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var body struct{ Replica string }
			if resp.StatusCode == http.StatusOK && json.Unmarshal(b, &body) == nil && body.Replica != "" {
				seen[body.Replica] = true
				if len(seen) == len(e.backends) {
					return nil
				}
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not reach both replicas in 20 s (seen %v; last answer: %s)", name, seen, last)
}

// startProxy starts a gateway child, on the proxy CPUs when pinned, and
// waits for its READY line.
func (e *env) startProxy(name, bin string, args ...string) (*child, error) {
	bin, args = e.onProxyCPUs(bin, args)
	return e.startProcess(name, bin, args, true)
}

// onProxyCPUs wraps a command in taskset when pinned (taskset execs it:
// the PID is the proxy's).
func (e *env) onProxyCPUs(bin string, args []string) (string, []string) {
	if e.o.proxyCPUs == "" {
		return bin, args
	}
	return "taskset", append([]string{"-c", e.o.proxyCPUs, bin}, args...)
}

// onlineCPUs is the machine's CPU count (runtime.NumCPU is this process's,
// which --pin narrows).
func onlineCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if n := cpuCount(strings.TrimSpace(string(b))); err == nil && n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// cpuCount counts the CPUs of a taskset list ("1", "0,2", "0-3"); 0 when
// it does not parse.
func cpuCount(list string) int {
	n := 0
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0
		}
		if !isRange {
			n++
			continue
		}
		b, err := strconv.Atoi(hi)
		if err != nil || b < a {
			return 0
		}
		n += b - a + 1
	}
	return n
}

// child is a process this benchmark started.
type child struct {
	name  string
	cmd   *exec.Cmd
	log   string
	ready []string // the fields after READY on its first stdout line
	done  chan struct{}
}

// startChild runs this binary (or, for HAProxy, another) with args and
// waits for its READY line.
func (e *env) startChild(name string, args ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return e.startProcess(name, self, args, true)
}

func (e *env) startProcess(name, bin string, args []string, waitReady bool) (*child, error) {
	logPath := filepath.Join(e.dir, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "BENCHCMP_REPLICAS="+strings.Join(e.backends, ","))
	cmd.Stderr = lf
	var stdout io.ReadCloser
	if waitReady {
		if stdout, err = cmd.StdoutPipe(); err != nil {
			lf.Close()
			return nil, err
		}
	} else {
		cmd.Stdout = lf
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	e.children = append(e.children, c)
	readyCh := make(chan []string, 1)
	if waitReady {
		go func() {
			buf := make([]byte, 0, 256)
			one := make([]byte, 1)
			for {
				n, err := stdout.Read(one)
				if n == 1 {
					if one[0] == '\n' {
						break
					}
					buf = append(buf, one[0])
				}
				if err != nil {
					break
				}
			}
			readyCh <- strings.Fields(string(buf))
			_, _ = io.Copy(lf, stdout)
		}()
	}
	go func() { _ = cmd.Wait(); lf.Close(); close(c.done) }()
	if !waitReady {
		return c, nil
	}
	select {
	case f := <-readyCh:
		if len(f) == 0 || f[0] != childReadyLine {
			return nil, fmt.Errorf("%s did not start: %q; log: %s", name, strings.Join(f, " "), tail(logPath))
		}
		c.ready = f[1:]
		return c, nil
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("%s not ready after 30 s; log: %s", name, tail(logPath))
	}
}

// stop ends the child's process group: SIGTERM, then SIGKILL.
func (c *child) stop() {
	if c.cmd.Process == nil {
		return
	}
	pid := c.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-c.done
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (e *env) childNamed(name string) *child {
	for _, c := range e.children {
		if c.name == name {
			return c
		}
	}
	return nil
}

func (e *env) dumpLogs() {
	for _, c := range e.children {
		fmt.Fprintf(os.Stderr, "--- %s log (%s) ---\n%s\n", c.name, c.log, tail(c.log))
	}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// profile fetches a CPU profile of the gateway over d into the profile
// directory; it runs beside a measured window.
func (e *env) profile(ctx context.Context, round int, d time.Duration) error {
	if err := os.MkdirAll(e.o.profileDir, 0o755); err != nil {
		return err
	}
	secs := int(d.Round(time.Second) / time.Second)
	if secs < 1 {
		secs = 1
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", e.gwPprof, secs), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof: %s", resp.Status)
	}
	path := filepath.Join(e.o.profileDir, fmt.Sprintf("gateway-round%d.pprof", round+1))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
