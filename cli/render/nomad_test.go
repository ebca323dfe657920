package render_test

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/spec"
)

// nomadBin finds the Nomad binary the way scripts/lib.sh does: NOMAD_BIN,
// else the cached build of the pinned version.
func nomadBin() string {
	if b := os.Getenv("NOMAD_BIN"); b != "" {
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
	return filepath.Join(cache, "nomad-1.6.3", "nomad")
}

// agent is the server agent the first test that needs one started, or why
// there is none; TestMain stops it.
var agent struct {
	once      sync.Once
	bin, addr string
	stop      func()
	err       error
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if agent.stop != nil {
		agent.stop()
	}
	os.Exit(code)
}

// needAgent returns the address of a Nomad server agent, starting it on
// first use. It fails the test when the binary is missing, and skips it
// under -short.
func needAgent(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a Nomad agent (-short)")
	}
	agent.once.Do(func() {
		agent.bin = nomadBin()
		if _, err := os.Stat(agent.bin); err != nil {
			agent.err = fmt.Errorf("nomad binary %s missing: run scripts/install-agents.sh (or set NOMAD_BIN); -short skips the tests that need it", agent.bin)
			return
		}
		agent.addr, agent.stop, agent.err = startNomadServer(agent.bin)
	})
	if agent.err != nil {
		t.Fatal(agent.err)
	}
	return agent.addr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startNomadServer runs a server-only Nomad agent on free ports and returns
// its address. `nomad job validate` without an agent only checks what the
// CLI can check locally (not the priority range, nor that the namespace
// exists); with one the server's admission checks run too. The gpujob
// driver is unknown to it: validate does not check drivers.
func startNomadServer(bin string) (addr string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "gpujob-render-nomad-")
	if err != nil {
		return "", nil, err
	}
	var ports [3]int
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return "", nil, err
		}
	}
	cfg := fmt.Sprintf(`data_dir  = %q
bind_addr = "127.0.0.1"
log_level = "WARN"
ports {
  http = %d
  rpc  = %d
  serf = %d
}
advertise {
  http = "127.0.0.1"
  rpc  = "127.0.0.1"
  serf = "127.0.0.1"
}
server {
  enabled          = true
  bootstrap_expect = 1
}
client {
  enabled = false
}
`, filepath.Join(dir, "data"), ports[0], ports[1], ports[2])
	cfgPath := filepath.Join(dir, "server.hcl")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return "", nil, err
	}
	logPath := filepath.Join(dir, "nomad.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "agent", "-config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return "", nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		_ = os.RemoveAll(dir)
	}
	addr = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logPath)
			_ = os.RemoveAll(dir)
			return "", nil, fmt.Errorf("nomad agent exited: %v\n%s", err, log)
		default:
		}
		resp, err := http.Get(addr + "/v1/status/leader")
		if err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && strings.Contains(b.String(), ":") {
				return addr, stop, nil
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			stop()
			return "", nil, fmt.Errorf("nomad agent at %s has no leader after 60s\n%s", addr, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNomadJobValidate runs the real `nomad job validate` (v1.6.3) on every
// golden jobspec, against a server agent so the server-side checks run too.
func TestNomadJobValidate(t *testing.T) {
	addr := needAgent(t)
	bin := agent.bin
	client, err := api.NewClient(&api.Config{Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	// The namespaces and node pools the examples use must exist.
	for _, p := range examples(t) {
		tr, diags := spec.ParseFile(p, spec.Options{})
		if diags.HasErrors() {
			t.Fatalf("%s: %s", p, spec.Format(diags, nil))
		}
		if tr.Namespace != "" {
			if _, err := client.Namespaces().Register(&api.Namespace{Name: tr.Namespace}, nil); err != nil {
				t.Fatalf("namespace %s: %v", tr.Namespace, err)
			}
		}
		if tr.NodePool != "" {
			if _, err := client.NodePools().Register(&api.NodePool{Name: tr.NodePool}, nil); err != nil {
				t.Fatalf("node pool %s: %v", tr.NodePool, err)
			}
		}
	}
	goldens := []string{}
	for _, p := range examples(t) {
		goldens = append(goldens, goldenPath(p))
	}
	// The jobs a sweep becomes (cli/command/sweep's golden files).
	sweeps, err := filepath.Glob(filepath.Join(renderedDir, "sweep-*.nomad.hcl"))
	if err != nil || len(sweeps) == 0 {
		t.Fatalf("no sweep jobspecs in %s (%v): go test ./cli/command/sweep -run TestGolden -update", renderedDir, err)
	}
	goldens = append(goldens, sweeps...)
	for _, p := range serviceExamples(t) {
		goldens = append(goldens, goldenPath(p))
	}
	for _, golden := range goldens {
		t.Run(filepath.Base(golden), func(t *testing.T) {
			cmd := exec.Command(bin, "job", "validate", "-no-color", golden)
			cmd.Env = append(os.Environ(), "NOMAD_ADDR="+addr)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("nomad job validate %s: %v\n%s", golden, err, out)
			}
			if !strings.Contains(string(out), "Job validation successful") || strings.Contains(string(out), "not validated") {
				t.Fatalf("nomad job validate %s:\n%s", golden, out)
			}
		})
	}
	// The agent is really checking: an out-of-range priority is refused.
	t.Run("agent-rejects-bad-job", func(t *testing.T) {
		src, err := os.ReadFile(goldenPath(examples(t)[0]))
		if err != nil {
			t.Fatal(err)
		}
		bad := strings.Replace(string(src), `type        = "batch"`, "type        = \"batch\"\n  priority    = 500", 1)
		path := filepath.Join(t.TempDir(), "bad.nomad.hcl")
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "job", "validate", "-no-color", path)
		cmd.Env = append(os.Environ(), "NOMAD_ADDR="+addr)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "priority") {
			t.Fatalf("want a priority error from the agent, got err=%v\n%s", err, out)
		}
	})
}
