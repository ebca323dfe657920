package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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

// gateway returns the URL of the gateway dev-up started on c (make dev's),
// once it answers.
func (c *cluster) gateway(t *testing.T) string {
	t.Helper()
	url := c.env["GPUJOB_GATEWAY_ADDR"]
	if url == "" {
		t.Fatal("the cluster runs no gateway (GPUJOB_GATEWAY_ADDR is not in its env file)")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url + "/-/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway at %s does not answer: %v", url, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
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
    # Room for torch's import beside another lane's training on two
    # cores: a replica not serving by then is restarted, and a deploy
    # whose replica is not healthy 10 s after it fails.
    initial_delay = "15s"
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
	tok := strings.TrimSpace(out)
	waitTokenAccepted(t, &http.Client{Timeout: time.Minute}, c.gateway(t), service, tok)
	return tok
}

// waitTokenAccepted waits until the gateway at gw accepts tok for service
// and returns that first accepted request's result. The gateways learn of a
// new token through their blocking query on the tokens, milliseconds after
// `token create` on an idle machine and longer on a loaded one (five
// requests sent at once after create all got 401 in a run beside other
// work); a 401 spends none of the token's rate limit.
func waitTokenAccepted(t *testing.T, client *http.Client, gw, service, tok string) reqResult {
	t.Helper()
	start := time.Now()
	for {
		r := predict(client, gw+"/"+service, tok)
		if r.code != http.StatusUnauthorized {
			t.Logf("the gateway accepted the new token of %s after %s", service, time.Since(start).Round(time.Millisecond))
			return r
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the gateway still refuses a new token of %s after 10 s", service)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// reqResult is one request's outcome.
type reqResult struct {
	at      time.Time
	code    int // 0: no HTTP answer
	err     error
	version string
	replica string
	// retryAfter is the answer's Retry-After header.
	retryAfter string
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
	r.code, r.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
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
	// and refills at 10/s, so 50 req/s for 2 s lets 20 + 10*2 = 40 through
	// (less the one serviceToken spent to see the gateway take the token).
	limited := c.serviceToken(t, name, "--name", "limited")
	stop := make(chan struct{})
	time.AfterFunc(2*time.Second, func() { close(stop) })
	rs := load(url, limited, 50, stop)
	ok, tooMany := 0, 0
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
	if ok < 37 || ok > 41 || ok+tooMany != len(rs) {
		t.Errorf("rate limit 10/s burst 20, 50 req/s for 2 s: %d passed, %d got 429 of %d; want 39±2 passed", ok, tooMany, len(rs))
	}
	// Every 429 of the load says when to come back. (A request sent after
	// the load could find a token refilled at 10/s, and no 429.)
	for _, r := range rs {
		if r.code == http.StatusTooManyRequests && r.retryAfter == "" {
			t.Errorf("a 429 without Retry-After at %s", r.at.Format("15:04:05.000"))
			break
		}
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
	gone := waitEndpoints(t, c.gatewayAdmin(t), name, 1, 10*time.Second)
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
	st, errOut, code := c.gpujob(t, time.Minute, "service", "status", "--gateway", gw, "--gateway-admin", c.gatewayAdmin(t), "-json", name)
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
// endpoints (the metrics of its admin listener, admin) and returns when it
// saw it.
func waitEndpoints(t *testing.T, admin, service string, n int, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if endpoints(admin, service) == n {
			return time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the gateway's pool of %s never had %d endpoint(s) (has %d)", service, n, endpoints(admin, service))
	return time.Time{}
}

// endpoints sums gpujob_gateway_endpoints for the service, from the
// gateway's admin listener.
func endpoints(admin, service string) int {
	resp, err := http.Get(admin + "/metrics")
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

// autoscaleSpec is a service of slow answers (0.5 s each, so requests stay
// in flight) that scales between 0 and 3 replicas on 2 requests in flight
// each, down after 10 s.
func (c *cluster) autoscaleSpec(t *testing.T, name string) string {
	t.Helper()
	serve := filepath.Join(c.env["GPUJOB_DEV_WORKLOADS"], "serve.py")
	src := fmt.Sprintf(`service %q {
  gpus_per_replica = 0
  command          = "/usr/bin/python3"
  args             = [%q, "--no-checkpoint", "--service-time", "0.5"]
  version          = "v1"
  env = {
    OMP_NUM_THREADS = "1"
  }
  replicas {
    min     = 0
    max     = 3
    initial = 1
  }
  autoscale {
    target_inflight  = 2
    scale_down_delay = "10s"
  }
  health {
    interval      = "1s"
    timeout       = "1s"
    initial_delay = "10s"
  }
  update {
    min_healthy_time = "1s"
  }
  route {
    queue_timeout = "90s"
  }
  resources {
    cpu    = 200
    memory = 300
  }
}
`, name, serve)
	p := filepath.Join(t.TempDir(), name+".hcl")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// groupCount is the service job's replica count in Nomad.
func (c *cluster) groupCount(t *testing.T, job string) int {
	t.Helper()
	j, _, err := c.nomad.Jobs().Info(job, nil)
	if err != nil {
		t.Fatal(err)
	}
	return *j.TaskGroups[0].Count
}

// waitCount waits until the job's count is n, and returns how long it took.
func (c *cluster) waitCount(t *testing.T, job string, n int, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for c.groupCount(t, job) != n {
		if time.Since(start) > timeout {
			t.Fatalf("%s's count is %d after %s, want %d", job, c.groupCount(t, job), timeout, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// Scenario 5: the elected gateway scales a service up under concurrent
// requests and back down after the delay, to zero; from zero, 20 requests
// at once are held while the first replica starts, and all succeed.
func TestServiceAutoscalesUpDownAndFromZero(t *testing.T) {
	c := needCluster(t)
	gw := c.gateway(t)
	const name = "svc-scale"
	c.deployService(t, name, c.autoscaleSpec(t, name))
	url := gw + "/" + name
	tok := c.serviceToken(t, name)

	// 8 clients in a closed loop keep about 8 requests in flight: 4
	// replicas' worth at 2 each, so the autoscaler goes to its max, 3.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var rs []reqResult
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 2 * time.Minute}
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := predict(client, url, tok)
				mu.Lock()
				rs = append(rs, r)
				mu.Unlock()
			}
		}()
	}
	up := c.waitCount(t, name, 3, time.Minute)
	waitEndpoints(t, c.gatewayAdmin(t), name, 3, 2*time.Minute)
	close(stop)
	wg.Wait()
	if f := failures(rs); len(f) > 0 {
		t.Errorf("%d of %d requests failed while scaling up:\n%s", len(f), len(rs), strings.Join(f, "\n"))
	}
	t.Logf("scaled 1 → 3 replicas %s after the load began (%d requests)", up.Round(100*time.Millisecond), len(rs))

	// Idle: down to min (0) once the 10 s delay has passed, not before.
	idle := time.Now()
	time.Sleep(5 * time.Second)
	if n := c.groupCount(t, name); n != 3 {
		t.Errorf("scaled to %d within 5 s of idling; the delay is 10 s", n)
	}
	c.waitCount(t, name, 0, time.Minute)
	down := time.Since(idle)
	waitEndpoints(t, c.gatewayAdmin(t), name, 0, time.Minute)
	t.Logf("scaled 3 → 0 replicas %s after the load ended", down.Round(100*time.Millisecond))
	if down < 10*time.Second {
		t.Errorf("scaled down %s after the load ended, before the 10 s delay", down)
	}

	// From zero: 20 requests at once are held, the gateway scales to 1,
	// and every one is answered.
	start := time.Now()
	results := make(chan reqResult, 20)
	for i := 0; i < 20; i++ {
		go func() {
			results <- predict(&http.Client{Timeout: 2 * time.Minute}, url, tok)
		}()
	}
	var cold []reqResult
	for i := 0; i < 20; i++ {
		cold = append(cold, <-results)
	}
	if f := failures(cold); len(f) > 0 {
		t.Errorf("from zero replicas, %d of 20 concurrent requests failed:\n%s", len(f), strings.Join(f, "\n"))
	}
	t.Logf("from zero: 20 concurrent requests answered within %s", time.Since(start).Round(100*time.Millisecond))
}

// TestServiceWithACLsAndTLS: on the cluster with ACLs and mutual TLS, a
// user deploys a service with the submit policy's Nomad token and the
// services policy's Consul token; the gateway, which holds tokens of its own
// from its variable (in memory, as the user gpujob-gateway), routes to it and
// scales it from zero through its Task API socket.
func TestServiceWithACLsAndTLS(t *testing.T) {
	c := secureCluster(t)
	gw := c.gateway(t)
	env := append(c.cliEnv(c.secret("nomad-submit")),
		"CONSUL_HTTP_ADDR="+c.env["CONSUL_HTTP_ADDR"], "CONSUL_CACERT="+c.env["CONSUL_CACERT"],
		"CONSUL_CLIENT_CERT="+c.env["CONSUL_CLIENT_CERT"], "CONSUL_CLIENT_KEY="+c.env["CONSUL_CLIENT_KEY"],
		"CONSUL_HTTP_TOKEN="+c.secret("consul-services"))
	const name = "svc-secure"
	spec := strings.Replace(strings.Replace(string(mustRead(t, c.autoscaleSpec(t, name))),
		"initial = 1", "initial = 0", 1), "max     = 3", "max     = 1", 1)
	path := filepath.Join(t.TempDir(), "secure.hcl")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := c.gpujobEnv(t, env, 3*time.Minute, "service", "deploy", "--gateway", gw, path)
	if code != 0 {
		t.Fatalf("deploy with the user's tokens exited %d:\n%s\n%s", code, out, errOut)
	}
	t.Cleanup(func() { c.gpujobEnv(t, env, time.Minute, "service", "stop", "--purge", name) })
	tok, errOut, code := c.gpujobEnv(t, env, time.Minute, "token", "create", "--service", name)
	if code != 0 {
		t.Fatalf("token create: %s", errOut)
	}
	tok = strings.TrimSpace(tok)

	// From zero: the gateway's own Nomad token scales the service. The
	// first request the gateway lets through is held until a replica runs.
	if r := waitTokenAccepted(t, &http.Client{Timeout: 2 * time.Minute}, gw, name, tok); r.code != 200 {
		t.Errorf("first request from zero replicas: %+v", r)
	}
	results := make(chan reqResult, 5)
	for i := 0; i < 5; i++ {
		go func() { results <- predict(&http.Client{Timeout: 2 * time.Minute}, gw+"/"+name, tok) }()
	}
	for i := 0; i < 5; i++ {
		if r := <-results; r.code != 200 {
			t.Errorf("request %d after scaling from zero: %+v", i, r)
		}
	}
	if r := predict(&http.Client{Timeout: 10 * time.Second}, gw+"/"+name, ""); r.code != http.StatusUnauthorized {
		t.Errorf("without a token: %d", r.code)
	}

	// The gateway runs as its own user and holds its tokens in memory, not
	// in its environment or its job.
	pid := gatewayPID(t)
	st, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	if err != nil {
		t.Fatal(err)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid == 0 || uidName(uid) != "gpujob-gateway" {
		t.Errorf("the gateway runs as uid %d (%s), want gpujob-gateway", uid, uidName(uid))
	}
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	job, _, err := c.nomad.Jobs().Info("gpujob-gateway", nil)
	if err != nil {
		t.Fatal(err)
	}
	jobJSON, _ := json.Marshal(job)
	for name, secret := range c.secrets(t) {
		if bytes.Contains(environ, []byte(secret)) || bytes.Contains(jobJSON, []byte(secret)) {
			t.Errorf("the secret of %s is in the gateway's environment or job", name)
		}
	}
	// Its Nomad token scales jobs and reads them, nothing more.
	gwNomad := c.nomadClientWith(t, c.secret("nomad-gateway"))
	if _, _, err := gwNomad.Jobs().Register(gpuJob("not-allowed", 0, "true"), nil); !nomadDenied(err) {
		t.Errorf("the gateway's Nomad token registered a job: %v", err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// gatewayPID is the gateway process of the secure cluster (the only one
// whose environment names the gateways' variable).
func gatewayPID(t *testing.T) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(cmdline, []byte("gateway\x00run")) {
			continue
		}
		env, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "environ"))
		if bytes.Contains(env, []byte("GPUJOB_GATEWAY_SECRETS=")) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	t.Fatal("no gateway process with GPUJOB_GATEWAY_SECRETS found")
	return 0
}

func uidName(uid uint32) string {
	b, _ := os.ReadFile("/etc/passwd")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) > 2 && f[2] == strconv.Itoa(int(uid)) {
			return f[0]
		}
	}
	return "?"
}
