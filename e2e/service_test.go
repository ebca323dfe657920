package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// The serving tests share one gateway on the dev cluster, run as the Nomad
// job `gpujob gateway render` prints.
var gatewayOnce struct {
	once sync.Once
	url  string
	err  error
}

// gateway starts the gateway job on c (once) and returns its URL.
func (c *cluster) gateway(t *testing.T) string {
	t.Helper()
	gatewayOnce.once.Do(func() {
		port, err := freeTCPPort()
		if err != nil {
			gatewayOnce.err = err
			return
		}
		hcl, errOut, code := c.gpujob(t, time.Minute, "gateway", "render", "--binary", c.env["GPUJOB_CONTROLLER_BINARY"], "--port", strconv.Itoa(port))
		if code != 0 {
			gatewayOnce.err = fmt.Errorf("gateway render: %s", errOut)
			return
		}
		job, err := c.nomad.Jobs().ParseHCL(hcl, true)
		if err != nil {
			gatewayOnce.err = err
			return
		}
		if _, _, err := c.nomad.Jobs().Register(job, nil); err != nil {
			gatewayOnce.err = err
			return
		}
		gatewayOnce.url = fmt.Sprintf("http://127.0.0.1:%d", port)
		deadline := time.Now().Add(90 * time.Second)
		for time.Now().Before(deadline) {
			resp, err := http.Get(gatewayOnce.url + "/-/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		gatewayOnce.err = fmt.Errorf("the gateway at %s never became healthy", gatewayOnce.url)
	})
	if gatewayOnce.err != nil {
		t.Fatal(gatewayOnce.err)
	}
	return gatewayOnce.url
}

func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// serviceSpec writes a service spec of serve.py (an untrained model on CPU)
// named name at version, with extra serve.py arguments, and returns its path.
func (c *cluster) serviceSpec(t *testing.T, name, version string, replicas int, extraArgs ...string) string {
	t.Helper()
	serve := filepath.Join(c.env["GPUJOB_DEV_WORKLOADS"], "serve.py")
	args := append([]string{serve, "--no-checkpoint"}, extraArgs...)
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = strconv.Quote(a)
	}
	src := fmt.Sprintf(`service %q {
  gpus_per_replica = 0
  command          = "/usr/bin/python3"
  args             = [%s]
  version          = %q
  env = {
    OMP_NUM_THREADS = "1"
  }
  replicas {
    initial = %d
    min     = %d
  }
  health {
    interval      = "1s"
    timeout       = "1s"
    initial_delay = "10s"
  }
  update {
    canary           = 1
    auto_promote     = true
    auto_revert      = true
    min_healthy_time = "2s"
  }
  route {
    rate_limit {
      rps   = 10
      burst = 20
    }
  }
  resources {
    cpu    = 300
    memory = 400
  }
}
`, name, strings.Join(quoted, ", "), version, replicas, replicas)
	p := filepath.Join(t.TempDir(), name+".hcl")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// deployService deploys spec and fails the test unless the deployment
// succeeds; it stops the service when the test ends.
func (c *cluster) deployService(t *testing.T, name, spec string) string {
	t.Helper()
	out, errOut, code := c.gpujob(t, 3*time.Minute, "service", "deploy", "--gateway", c.gateway(t), spec)
	if code != 0 {
		t.Fatalf("service deploy exited %d:\n%s\n%s", code, out, errOut)
	}
	t.Cleanup(func() {
		c.gpujob(t, time.Minute, "service", "stop", "--purge", name)
	})
	return out
}

// token creates a bearer token for the service.
func (c *cluster) serviceToken(t *testing.T, service string, extra ...string) string {
	t.Helper()
	out, errOut, code := c.gpujob(t, time.Minute, append([]string{"token", "create", "--service", service}, extra...)...)
	if code != 0 {
		t.Fatalf("token create: %s", errOut)
	}
	return strings.TrimSpace(out)
}

// reqResult is one request's outcome.
type reqResult struct {
	at      time.Time
	code    int // 0: no HTTP answer
	err     error
	version string
	replica string
}

// predict sends one /predict through the gateway.
func predict(client *http.Client, url, token string) reqResult {
	r := reqResult{at: time.Now()}
	req, _ := http.NewRequest(http.MethodPost, url+"/predict", strings.NewReader(`{"text":"a great film"}`))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	r.code = resp.StatusCode
	var body struct {
		Version string `json:"version"`
		Replica string `json:"replica"`
	}
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &body)
	r.version, r.replica = body.Version, body.Replica
	return r
}

// load sends rps requests a second (each on its own goroutine, so a slow
// answer does not slow the rate) until stop is closed, and returns every
// outcome.
func load(url, token string, rps int, stop <-chan struct{}) []reqResult {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var mu sync.Mutex
	var out []reqResult
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rps))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			wg.Wait()
			return out
		case <-tick.C:
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := predict(client, url, token)
				mu.Lock()
				out = append(out, r)
				mu.Unlock()
			}()
		}
	}
}

// failures are the results that are not 2xx, described.
func failures(rs []reqResult) []string {
	var out []string
	for _, r := range rs {
		if r.err != nil || r.code < 200 || r.code > 299 {
			out = append(out, fmt.Sprintf("%s: code %d err %v", r.at.Format("15:04:05.000"), r.code, r.err))
		}
	}
	return out
}

// Scenarios 1, 4 and 6 of the serving issue: two replicas behind the gateway
// with tokens and a rate limit, a replica killed under load, a token revoked.
func TestServiceGatewayAuthRateLimitKillAndRevoke(t *testing.T) {
	c := needCluster(t)
	gw := c.gateway(t)
	const name = "svc-auth"
	out := c.deployService(t, name, c.serviceSpec(t, name, "v1", 2))
	if !strings.Contains(out, "is live at "+gw+"/"+name) {
		t.Errorf("deploy output:\n%s", out)
	}
	url := gw + "/" + name
	// The route's limit is 10/s: the load below needs a token of its own.
	tok := c.serviceToken(t, name, "--rps", "1000", "--burst", "1000")
	client := &http.Client{Timeout: 10 * time.Second}

	// With a token: 200s, from both replicas.
	replicas := map[string]bool{}
	for i := 0; i < 20 && len(replicas) < 2; i++ {
		r := predict(client, url, tok)
		if r.code != 200 || r.version != "v1" {
			t.Fatalf("with a token: %+v", r)
		}
		replicas[r.replica] = true
	}
	if len(replicas) != 2 {
		t.Errorf("20 requests reached %d replica(s), want both", len(replicas))
	}
	// Without, or with a bad one: 401.
	for _, bad := range []string{"", "gjt_not-a-token", tok + "x"} {
		if r := predict(client, url, bad); r.code != http.StatusUnauthorized {
			t.Errorf("token %q: code %d, want 401", bad, r.code)
		}
	}

	// The rate limit, per token: a fresh token's bucket is full (burst 20)
	// and refills at 10/s, so 50 req/s for 2 s lets 20 + 10*2 = 40 through.
	limited := c.serviceToken(t, name, "--name", "limited")
	stop := make(chan struct{})
	time.AfterFunc(2*time.Second, func() { close(stop) })
	rs := load(url, limited, 50, stop)
	ok, tooMany := 0, 0
	var retryAfter bool
	for _, r := range rs {
		switch r.code {
		case 200:
			ok++
		case 429:
			tooMany++
		default:
			t.Errorf("rate-limited load: %+v", r)
		}
	}
	if ok < 38 || ok > 42 || ok+tooMany != len(rs) {
		t.Errorf("rate limit 10/s burst 20, 50 req/s for 2 s: %d passed, %d got 429 of %d; want 40±2 passed", ok, tooMany, len(rs))
	}
	req, _ := http.NewRequest(http.MethodPost, url+"/predict", strings.NewReader(`{"text":"x"}`))
	req.Header.Set("Authorization", "Bearer "+limited)
	if resp, err := client.Do(req); err == nil {
		retryAfter = resp.StatusCode == 429 && resp.Header.Get("Retry-After") != ""
		resp.Body.Close()
	}
	if !retryAfter {
		t.Error("a 429 without Retry-After")
	}
	t.Logf("rate limit: %d of %d passed at 50 req/s for 2 s", ok, len(rs))

	// kill -9 one replica under load: the failed requests are at most the
	// ones it had in flight, and it leaves the pool within a second.
	victim, pid := replicaProcess(t, c, name)
	stop = make(chan struct{})
	done := make(chan []reqResult)
	go func() { done <- load(url, tok, 50, stop) }()
	time.Sleep(time.Second)
	killedAt := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := waitEndpoints(t, gw, name, 1, 10*time.Second)
	time.Sleep(2 * time.Second)
	close(stop)
	rs = <-done
	fails := failures(rs)
	var after []reqResult
	for _, r := range rs {
		if r.at.After(killedAt.Add(time.Second)) {
			after = append(after, r)
		}
	}
	t.Logf("kill -9 of %s: pool down to 1 endpoint after %s; %d of %d requests failed", victim, gone.Sub(killedAt).Round(time.Millisecond), len(fails), len(rs))
	if d := gone.Sub(killedAt); d > time.Second {
		t.Errorf("the killed replica left the pool after %s, want under 1 s", d)
	}
	// At 50 req/s and a few ms each, a replica has at most a couple in flight.
	if len(fails) > 2 {
		t.Errorf("%d requests failed when one replica was killed (more than it could have had in flight):\n%s", len(fails), strings.Join(fails, "\n"))
	}
	if len(failures(after)) > 0 {
		t.Errorf("requests failed more than 1 s after the kill: %v", failures(after))
	}

	// A revoked token is refused within a second.
	if r := predict(client, url, tok); r.code != 200 {
		t.Fatalf("before revoke: %+v", r)
	}
	list, _, _ := c.gpujob(t, time.Minute, "token", "list", "--service", name, "-json")
	var toks []struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(list), &toks); err != nil || len(toks) != 2 {
		t.Fatalf("token list: %v\n%s", err, list)
	}
	var id string
	for _, tk := range toks {
		if tk.Name != "limited" {
			id = tk.ID
		}
	}
	if _, errOut, code := c.gpujob(t, time.Minute, "token", "revoke", "--service", name, id); code != 0 {
		t.Fatalf("revoke: %s", errOut)
	}
	revoked := time.Now()
	for {
		r := predict(client, url, tok)
		if r.code == http.StatusUnauthorized {
			t.Logf("revoked token refused %s after the CLI returned", time.Since(revoked).Round(time.Millisecond))
			break
		}
		if time.Since(revoked) > time.Second {
			t.Fatalf("a revoked token still gets %d after 1 s", r.code)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// service status: replicas by version and health, the traffic.
	st, errOut, code := c.gpujob(t, time.Minute, "service", "status", "--gateway", gw, "-json", name)
	if code != 0 {
		t.Fatalf("status: %s", errOut)
	}
	var status struct {
		Healthy  int `json:"healthy"`
		Versions []struct {
			Version string `json:"version"`
		} `json:"versions"`
		Traffic *struct {
			Requests int64   `json:"requests"`
			P99      float64 `json:"p99_ms"`
		} `json:"traffic"`
	}
	if err := json.Unmarshal([]byte(st), &status); err != nil {
		t.Fatalf("%v\n%s", err, st)
	}
	if status.Traffic == nil || status.Traffic.Requests < 100 || status.Traffic.P99 <= 0 || len(status.Versions) != 1 || status.Versions[0].Version != "v1" {
		t.Errorf("status:\n%s", st)
	}
}

// replicaProcess finds the serve.py process of one running replica of the
// service: its allocation ID and PID.
func replicaProcess(t *testing.T, c *cluster, service string) (string, int) {
	t.Helper()
	allocs, _, err := c.nomad.Jobs().Allocations(service, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range allocs {
		if a.ClientStatus != api.AllocClientStatusRunning {
			continue
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/environ")
		for _, p := range procs {
			env, err := os.ReadFile(p)
			if err != nil || !bytes.Contains(env, []byte("NOMAD_ALLOC_ID="+a.ID+"\x00")) {
				continue
			}
			cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
			if !bytes.Contains(cmdline, []byte("serve.py")) {
				continue
			}
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return a.ID, pid
		}
	}
	t.Fatalf("no serve.py process of %s found", service)
	return "", 0
}

// waitEndpoints waits until the gateway's pool for service has n healthy
// endpoints (its metrics) and returns when it saw it.
func waitEndpoints(t *testing.T, gw, service string, n int, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if endpoints(gw, service) == n {
			return time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the gateway's pool of %s never had %d endpoint(s) (has %d)", service, n, endpoints(gw, service))
	return time.Time{}
}

// endpoints sums gpujob_gateway_endpoints for the service.
func endpoints(gw, service string) int {
	resp, err := http.Get(gw + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	total := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "gpujob_gateway_endpoints{") && strings.Contains(line, `service="`+service+`"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += int(v)
		}
	}
	return total
}

// Scenarios 2 and 3: a rolling update under constant load answers every
// request, and so does an update that never becomes healthy, which Nomad
// reverts.
func TestServiceRollingUpdateAndRevertWithoutErrors(t *testing.T) {
	c := needCluster(t)
	gw := c.gateway(t)
	const name = "svc-roll"
	c.deployService(t, name, c.serviceSpec(t, name, "v1", 2))
	url := gw + "/" + name
	tok := c.serviceToken(t, name, "--rps", "1000", "--burst", "1000")

	update := func(version string, wantExit int, extra ...string) []reqResult {
		stop := make(chan struct{})
		done := make(chan []reqResult)
		go func() { done <- load(url, tok, 50, stop) }()
		time.Sleep(time.Second)
		out, errOut, code := c.gpujob(t, 4*time.Minute, "service", "deploy", "--gateway", gw, c.serviceSpec(t, name, version, 2, extra...))
		time.Sleep(time.Second)
		close(stop)
		rs := <-done
		if code != wantExit {
			t.Fatalf("deploy %s exited %d, want %d:\n%s\n%s", version, code, wantExit, out, errOut)
		}
		t.Logf("deploy %s (exit %d):\n%s%s", version, code, out, errOut)
		return rs
	}

	rs := update("v2", 0)
	if f := failures(rs); len(f) > 0 {
		t.Errorf("rolling update v1 → v2: %d of %d requests failed:\n%s", len(f), len(rs), strings.Join(f, "\n"))
	}
	client := &http.Client{Timeout: 10 * time.Second}
	for i := 0; i < 10; i++ {
		if r := predict(client, url, tok); r.code != 200 || r.version != "v2" {
			t.Fatalf("after the promotion: %+v, want v2", r)
		}
	}
	t.Logf("v1 → v2: %d requests, 0 failed", len(rs))

	// v3 never becomes healthy: Nomad fails the deployment and reverts to v2.
	rs = update("v3", 1, "--fail-health")
	if f := failures(rs); len(f) > 0 {
		t.Errorf("update to an unhealthy v3: %d of %d requests failed:\n%s", len(f), len(rs), strings.Join(f, "\n"))
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		job, _, err := c.nomad.Jobs().Info(name, nil)
		if err == nil && job.Meta["gpujob_version"] == "v2" {
			d, _, _ := c.nomad.Jobs().LatestDeployment(name, nil)
			if d != nil && d.JobVersion == *job.Version && d.Status == api.DeploymentStatusSuccessful {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job never went back to v2")
		}
		time.Sleep(time.Second)
	}
	for i := 0; i < 10; i++ {
		if r := predict(client, url, tok); r.code != 200 || r.version != "v2" {
			t.Fatalf("after the revert: %+v, want v2", r)
		}
	}
}
