// Package testagent starts the real agents the tests run against, built by
// scripts/install-agents.sh into the cache outside the checkout.
package testagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ConsulVersion is the Consul agent the tests use (scripts/lib.sh pins it).
const ConsulVersion = "1.15.6"

// ConsulBin is the Consul binary: CONSUL_BIN, else the cached build.
func ConsulBin() string {
	if b := os.Getenv("CONSUL_BIN"); b != "" {
		return b
	}
	return filepath.Join(cacheDir(), "consul-"+ConsulVersion, "consul")
}

// cacheDir mirrors gpujob_cache_dir in scripts/lib.sh.
func cacheDir() string {
	if d := os.Getenv("GPUJOB_CACHE_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "gpujob")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "gpujob")
}

// Consul is a Consul agent on loopback, on ports of its own: a dev agent
// (StartConsul, state in memory) or a real single server with a data
// directory (StartConsulServer), which can be stopped and started again on
// the same ports and data, as an agent restart in a deployment.
type Consul struct {
	// Addr is the HTTP API's host:port.
	Addr    string
	args    []string
	dir     string
	serfLAN int // to tell this agent from another answering on Addr

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// StartConsul starts a dev agent and waits until it has a leader. extraHCL is
// added to its config (e.g. limits).
func StartConsul(extraHCL string) (*Consul, error) {
	return startConsul(extraHCL, false)
}

// StartConsulServer starts a single Consul server (bootstrap_expect 1) with
// a data directory and waits until it has a leader and accepts sessions.
// Unlike the dev agent it keeps its state, keys and sessions over
// StopProcess and StartProcess. extraHCL is added to its config (e.g.
// session_ttl_min = "1s").
func StartConsulServer(extraHCL string) (*Consul, error) {
	return startConsul(extraHCL, true)
}

// portAttempts bounds startConsul's tries on fresh ports: a port found free
// can be taken before the agent binds it (by an outgoing connection's
// ephemeral port or another test's agent, with unit and e2e tests side by
// side), which Consul's own test server answers the same way.
const portAttempts = 5

func startConsul(extraHCL string, server bool) (*Consul, error) {
	bin := ConsulBin()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("no Consul agent at %s: run scripts/install-agents.sh consul (or set CONSUL_BIN)", bin)
	}
	var err error
	for attempt := 1; attempt <= portAttempts; attempt++ {
		var c *Consul
		c, err = startConsulOnFreePorts(extraHCL, server)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, errPortTaken) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%d tries: %w", portAttempts, err)
}

// errPortTaken marks a start that failed because a port was taken between
// freePorts and the agent's bind.
var errPortTaken = errors.New("a port was taken before consul bound it")

func startConsulOnFreePorts(extraHCL string, server bool) (*Consul, error) {
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "gpujob-consul-")
	if err != nil {
		return nil, err
	}
	mode := ""
	if server {
		// A real server: raft and the state store on disk. The node name
		// and ID are fixed so a restart is the same node.
		mode = fmt.Sprintf(`server           = true
bootstrap_expect = 1
data_dir         = %q
node_name        = "gpujob-test-server"
ui_config {
  enabled = false
}
# Raft's timeouts as in Consul's dev mode, not production's five times
# those: a restarted server elects itself in about 2 s instead of 10 s,
# which on two loaded cores was most of StartProcess's wait.
performance {
  raft_multiplier = 1
}
`, filepath.Join(dir, "data"))
	}
	cfg := fmt.Sprintf(`ports {
  http     = %d
  serf_lan = %d
  serf_wan = %d
  server   = %d
  dns      = -1
  grpc     = -1
  grpc_tls = -1
}
limits {
  http_max_conns_per_client = 10000
}
%s
%s
`, ports[0], ports[1], ports[2], ports[3], mode, extraHCL)
	if err := os.WriteFile(filepath.Join(dir, "consul.hcl"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	c := &Consul{Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), dir: dir, serfLAN: ports[1]}
	c.args = []string{"agent", "-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-log-level", "warn", "-config-file", filepath.Join(dir, "consul.hcl")}
	if !server {
		c.args = append([]string{"agent", "-dev"}, c.args[1:]...)
	}
	if err := c.StartProcess(); err != nil {
		taken := errors.Is(err, errPortTaken) || strings.Contains(c.logTail(), "address already in use")
		c.Stop()
		if taken {
			return nil, fmt.Errorf("%w: %v", errPortTaken, err)
		}
		return nil, err
	}
	return c, nil
}

// StartProcess starts the agent (again, after StopProcess) and waits until
// it has a leader and accepts sessions.
func (c *Consul) StartProcess() error {
	c.mu.Lock()
	if c.cmd != nil {
		c.mu.Unlock()
		return errors.New("consul is already running")
	}
	log, err := os.OpenFile(filepath.Join(c.dir, "consul.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	cmd := exec.Command(ConsulBin(), c.args...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so a test binary killed mid-run does not take
	// the terminal's signals to it, and Stop can end it cleanly.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		c.mu.Unlock()
		return fmt.Errorf("starting consul: %w", err)
	}
	done := make(chan struct{})
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	go func() { _ = cmd.Wait(); log.Close(); close(done) }()
	// A generous bound: it is only reached when something is wrong, and a
	// restarted server on a loaded machine (the race detector, other test
	// packages) has taken over 30 s to accept sessions again.
	return c.waitLeader(60*time.Second, done)
}

// StopProcess ends the agent (SIGTERM, as a service manager does; a server
// does not leave the cluster on it) and keeps its data and ports for
// StartProcess.
func (c *Consul) StopProcess() {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// waitLeader waits until the agent has a leader and can create a session
// (which needs its own node and serfHealth check registered, a moment after
// the election). The agent is not serving yet, so there is nothing to block
// on: a short retry is the only way.
func (c *Consul) waitLeader(limit time.Duration, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		if c.sessionWorks(ctx) {
			// Another agent answering on a port that was ours when freePorts
			// looked would pass the probe: make sure it is this one.
			if c.isThisAgent(ctx) {
				return nil
			}
			return fmt.Errorf("%w: another agent answers on %s", errPortTaken, c.Addr)
		}
		select {
		case <-exited:
			return fmt.Errorf("consul exited during start; log: %s", c.logTail())
		case <-ctx.Done():
			return fmt.Errorf("consul had no leader after %s; log: %s", limit, c.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sessionWorks creates and destroys a probe session.
func (c *Consul) sessionWorks(ctx context.Context) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+c.Addr+"/v1/session/create",
		strings.NewReader(`{"TTL":"10s","Behavior":"delete"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var created struct{ ID string }
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&created) != nil || created.ID == "" {
		return false
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodPut, "http://"+c.Addr+"/v1/session/destroy/"+created.ID, nil)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return true
}

// isThisAgent reports whether the agent on c.Addr gossips on c's serf LAN
// port.
func (c *Consul) isThisAgent(ctx context.Context) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.Addr+"/v1/agent/self", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var self struct{ Member struct{ Port int } }
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&self) != nil {
		return false
	}
	return self.Member.Port == c.serfLAN
}

func (c *Consul) logTail() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "consul.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Stop ends the agent and removes its files.
func (c *Consul) Stop() {
	c.StopProcess()
	os.RemoveAll(c.dir)
}

// freePorts reserves n distinct free TCP ports on loopback.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
