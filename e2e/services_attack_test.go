package e2e

// Adversarial tests of gpujob services (issue 23): what a hostile job, or a
// hostile holder of a namespace's Consul token, can make the gateway and
// the autoscaler do. Each attack runs against the dev cluster's real
// gateway and agents, and each test ends with an ordinary service that must
// still serve.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"
)

// impostorScript answers every request as the replica "impostor", on the
// task's ports http and forged.
const impostorScript = `import http.server, json, os, threading
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def _reply(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        b = json.dumps({"status": "ok", "version": "v1", "replica": "impostor"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    do_GET = do_POST = do_HEAD = _reply
    def log_message(self, *a):
        pass
for label in ("http", "forged"):
    s = http.server.ThreadingHTTPServer((os.environ["NOMAD_IP_" + label], int(os.environ["NOMAD_PORT_" + label])), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
threading.Event().wait()
`

// impostorJob is a hostile job of the same namespace that registers itself
// in Consul under the victim's service name with the victim's namespace and
// version tags, exactly as Nomad registers the victim's replicas.
func impostorJob(id, victim string) *api.Job {
	job := api.NewServiceJob(id, id, "global", 50)
	job.Datacenters = []string{"*"}
	task := api.NewTask("impostor", "raw_exec").
		SetConfig("command", "/usr/bin/python3").
		SetConfig("args", []string{"-c", impostorScript}).
		Require(&api.Resources{CPU: intp(100), MemoryMB: intp(64)})
	task.Services = []*api.Service{{
		Name: victim, PortLabel: "http", Provider: "consul",
		Tags: []string{"gpujob", "gpujob-ns=default", "gpujob-version=v1"},
		Checks: []api.ServiceCheck{{Name: "ready", Type: "http", Path: "/healthz",
			Interval: time.Second, Timeout: time.Second}},
	}}
	group := api.NewTaskGroup("g", 1).AddTask(task)
	group.Networks = []*api.NetworkResource{{DynamicPorts: []api.Port{{Label: "http"}, {Label: "forged"}}}}
	group.RestartPolicy = &api.RestartPolicy{Attempts: intp(0), Mode: strp("fail")}
	return job.AddTaskGroup(group)
}

// runningAlloc waits for a running allocation of job and returns it whole.
func (c *cluster) runningAlloc(t *testing.T, job string, timeout time.Duration) *api.Allocation {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		allocs, _, err := c.nomad.Jobs().Allocations(job, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range allocs {
			if a.ClientStatus == api.AllocClientStatusRunning && a.DesiredStatus == api.AllocDesiredStatusRun {
				full, _, err := c.nomad.Allocations().Info(a.ID, nil)
				if err != nil {
					t.Fatal(err)
				}
				return full
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no running allocation of %s after %s", job, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// allocPort is the host address of an allocation's port label.
func allocPort(t *testing.T, a *api.Allocation, label string) (string, int) {
	t.Helper()
	if a.AllocatedResources != nil {
		for _, p := range a.AllocatedResources.Shared.Ports {
			if p.Label == label {
				return p.HostIP, p.Value
			}
		}
	}
	t.Fatalf("allocation %s has no port %q", a.ID, label)
	return "", 0
}

// passingInstances counts the passing Consul instances of service with
// tag.
func passingInstances(cc *consul.Client, service, tag string) int {
	entries, _, err := cc.Health().Service(service, tag, true, nil)
	if err != nil {
		return -1
	}
	return len(entries)
}

// TestServicesAttackImpostorReplicaGetsNoTraffic: a job that registers
// itself in Consul with another service's name and namespace tag, and a
// Consul instance forged with the ID Nomad gives the victim's replica (on a
// node of its own, where Nomad's sync never looks), get none of that
// service's requests: the gateway admits only the addresses Nomad gave a
// running allocation of the route's job.
func TestServicesAttackImpostorReplicaGetsNoTraffic(t *testing.T) {
	c := needCluster(t)
	gw := c.gateway(t)
	const victim = "atk-victim"
	c.deployService(t, victim, c.serviceSpec(t, victim, "v1", 1))
	tok := c.serviceToken(t, victim, "--rps", "1000", "--burst", "1000")
	victimAlloc := c.runningAlloc(t, victim, time.Minute)

	// A hostile job of the same namespace, registered by Nomad under the
	// victim's Consul name and tags.
	c.register(t, impostorJob("atk-impostor", victim))
	imp := c.runningAlloc(t, "atk-impostor", time.Minute)
	// And one registered straight into Consul's catalog, on a node of its
	// own, with the very service ID Nomad gave the victim's replica and the
	// impostor's second port.
	cc := c.consulClient(t)
	host, port := allocPort(t, imp, "forged")
	forgedID := fmt.Sprintf("_nomad-task-%s-serve-%s-http", victimAlloc.ID, victim)
	const evilNode = "atk-evil-node"
	if _, err := cc.Catalog().Register(&consul.CatalogRegistration{
		Node: evilNode, Address: host,
		Service: &consul.AgentService{ID: forgedID, Service: victim, Address: host, Port: port,
			Tags: []string{"gpujob", "gpujob-ns=default", "gpujob-version=v1"}},
		Check: &consul.AgentCheck{Node: evilNode, CheckID: "atk-forged", Name: "ready", Status: consul.HealthPassing,
			ServiceID: forgedID},
	}, nil); err != nil {
		t.Fatalf("registering the forged instance: %v", err)
	}
	t.Cleanup(func() { _, _ = cc.Catalog().Deregister(&consul.CatalogDeregistration{Node: evilNode}, nil) })

	deadline := time.Now().Add(time.Minute)
	for passingInstances(cc, victim, "gpujob-ns=default") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("Consul never listed the victim and both impostors as passing (has %d)", passingInstances(cc, victim, "gpujob-ns=default"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Measure only once the gateway has seen all three: the victim in its
	// pool, the hostile job's instance refused as another job's
	// allocation, the forged one as a replica's ID at a foreign address.
	// Before that a clean run would prove nothing.
	admin := c.gatewayAdmin(t)
	want := map[string]int{"route": 0, "not_nomad": 0, "allocation": 1, "address": 1}
	deadline = time.Now().Add(30 * time.Second)
	for {
		refused := refusedInstances(admin, victim)
		n := endpoints(admin, victim)
		if n == 1 && fmt.Sprint(refused) == fmt.Sprint(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway never saw the victim and both impostors: %d endpoint(s) (want 1), refused instances by reason %v (want %v)", n, refused, want)
		}
		time.Sleep(100 * time.Millisecond)
	}

	client := &http.Client{Timeout: 10 * time.Second}
	stolen, served := 0, 0
	for i := 0; i < 60; i++ {
		r := predict(client, gw+"/"+victim, tok)
		switch {
		case r.replica == "impostor":
			stolen++
		case r.code == 200 && r.replica == victimAlloc.ID:
			served++
		default:
			t.Errorf("request %d: %+v", i, r)
		}
	}
	if stolen > 0 {
		t.Errorf("the impostors answered %d of 60 requests to %s (the victim %d)", stolen, victim, served)
	}
	if served == 0 {
		t.Errorf("the victim answered none of 60 requests")
	}
	t.Logf("60 requests with two impostors registered: victim %d, impostors %d", served, stolen)
	if n := endpoints(c.gatewayAdmin(t), victim); n != 1 {
		t.Errorf("the gateway's pool of %s has %d endpoint(s), want 1 (the victim's)", victim, n)
	}

	// The hostile job gone, the ordinary service still serves.
	c.purge("atk-impostor")
	for i := 0; i < 10; i++ {
		if r := predict(client, gw+"/"+victim, tok); r.code != 200 || r.replica != victimAlloc.ID {
			t.Fatalf("after the attack: %+v", r)
		}
	}
}

// bystanderJob is a plain service job (no gpujob service) with a scalable
// group "serve".
func bystanderJob(id string) *api.Job {
	job := api.NewServiceJob(id, id, "global", 50)
	job.Datacenters = []string{"*"}
	task := api.NewTask("t", "raw_exec").
		SetConfig("command", "/bin/sleep").
		SetConfig("args", []string{"3600"}).
		Require(&api.Resources{CPU: intp(50), MemoryMB: intp(32)})
	group := api.NewTaskGroup("serve", 1).AddTask(task)
	zero, two := int64(0), int64(2)
	group.Scaling = &api.ScalingPolicy{Min: &zero, Max: &two, Enabled: boolp(true)}
	return job.AddTaskGroup(group)
}

// TestServicesAttackRouteCannotScaleAnotherJob: a route written straight
// into Consul KV (what any holder of the namespace's services token can
// do) with an autoscale block naming a job that is not that service's is
// refused by the autoscaler, which logs why, and never scales the job.
// Afterwards an ordinary autoscaled service still scales and serves.
func TestServicesAttackRouteCannotScaleAnotherJob(t *testing.T) {
	c := needCluster(t)
	gw := c.gateway(t)
	const bystander = "atk-bystander"
	c.register(t, bystanderJob(bystander))
	c.runningAlloc(t, bystander, time.Minute)

	cc := c.consulClient(t)
	const hijack = "atk-hijack"
	key := "gpujob/services/default/" + hijack + "/route"
	route := map[string]any{
		"namespace": "default", "service": hijack, "consul_service": hijack, "tag": "gpujob-ns=default",
		"path_prefix": "/" + hijack, "auth": true, "timeout": "10s", "queue_limit": -1, "queue_timeout": "1s",
		"job_id": bystander, "group": "serve",
		"autoscale": map[string]any{"min": 0, "max": 2, "target_inflight": 1, "scale_up_delay": "0s", "scale_down_delay": "1s"},
	}
	b, _ := json.Marshal(route)
	if _, err := cc.KV().Put(&consul.KVPair{Key: key, Value: b}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = cc.KV().Delete(key, nil) })

	// Idle, the route would take the job to its min (0) after 1 s.
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if n := c.groupCount(t, bystander); n != 1 {
			t.Fatalf("the autoscaler scaled %s to %d on a route of another service", bystander, n)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if logs := c.gatewayLogs(t); !strings.Contains(logs, hijack) || !strings.Contains(logs, "not autoscaling") {
		t.Errorf("the gateway logged no refusal of the route %s; its log ends:\n%s", hijack, tail(logs, 20))
	}

	// An ordinary autoscaled service still scales from zero and serves.
	const name = "atk-ordinary-scale"
	spec := strings.Replace(string(mustRead(t, c.autoscaleSpec(t, name))), "initial = 1", "initial = 0", 1)
	path := filepath.Join(t.TempDir(), "ordinary.hcl")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	c.deployService(t, name, path)
	tok := c.serviceToken(t, name)
	if r := predict(&http.Client{Timeout: 2 * time.Minute}, gw+"/"+name, tok); r.code != 200 {
		t.Errorf("the ordinary service from zero: %+v", r)
	}
}

// gatewayLogs is the dev gateway's stderr (its allocation's log).
func (c *cluster) gatewayLogs(t *testing.T) string {
	t.Helper()
	allocs, _, err := c.nomad.Jobs().Allocations("gpujob-gateway", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range allocs {
		if a.ClientStatus != api.AllocClientStatusRunning {
			continue
		}
		full, _, err := c.nomad.Allocations().Info(a.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := c.nomad.AllocFS().Cat(full, "alloc/logs/gw.stderr.0", nil)
		if err != nil {
			t.Fatalf("reading the gateway's log: %v", err)
		}
		defer rc.Close()
		b, _ := io.ReadAll(rc)
		return string(b)
	}
	t.Fatal("no running gateway allocation")
	return ""
}

// gatewayAdmin is the dev gateway's admin URL (/metrics, /-/stats):
// GPUJOB_GATEWAY_ADMIN_ADDR, else loopback on the port after the
// gateway's (what gpujob gateway render gives it by default).
// refusedInstances is the gateway's gpujob_gateway_refused_instances of
// service by reason (nil when its metrics cannot be read).
func refusedInstances(admin, service string) map[string]int {
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "gpujob_gateway_refused_instances{") || !strings.Contains(line, `service="`+service+`"`) {
			continue
		}
		_, rest, ok := strings.Cut(line, `reason="`)
		reason, _, ok2 := strings.Cut(rest, `"`)
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if ok && ok2 && err == nil {
			out[reason] += int(v)
		}
	}
	return out
}

func (c *cluster) gatewayAdmin(t *testing.T) string {
	t.Helper()
	if a := c.env["GPUJOB_GATEWAY_ADMIN_ADDR"]; a != "" {
		return a
	}
	u, err := url.Parse(c.gateway(t))
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("the gateway's URL %s has no port", u)
	}
	return "http://127.0.0.1:" + strconv.Itoa(port+1)
}

// devGatewayPID is the process of the dev cluster's gateway (the one
// listening on its port).
func (c *cluster) devGatewayPID(t *testing.T) int {
	t.Helper()
	u, err := url.Parse(c.gateway(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("gateway\x00run\x00--listen\x00" + u.Host + "\x00")
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err == nil && bytes.Contains(cmdline, want) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	t.Fatalf("no gateway process listening on %s", u.Host)
	return 0
}

// rssMiB is a process's resident set in MiB (-1 when gone).
func rssMiB(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb / 1024
		}
	}
	return -1
}

// closedWithin reports whether the peer closed conn (or answered and
// closed) within d, draining what it sends.
func closedWithin(conn net.Conn, d time.Duration) bool {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

// TestServicesAttackFloodsLeaveTheGatewayServing: while an ordinary
// service takes 20 req/s, hostile clients open a slowloris, upload bodies
// that stall after 90 % of their 10 MiB, send a body over the limit with
// and without Content-Length, and flood headers. The ordinary requests all
// succeed, the gateway stays under 256 MiB of memory, the stalled uploads
// and the slowloris are cut off, and the oversized ones are refused.
func TestServicesAttackFloodsLeaveTheGatewayServing(t *testing.T) {
	c := needCluster(t)
	gw := c.gateway(t)
	const name = "atk-flood"
	c.deployService(t, name, c.serviceSpec(t, name, "v1", 1))
	tok := c.serviceToken(t, name, "--rps", "1000", "--burst", "1000")
	u, _ := url.Parse(gw)
	pid := c.devGatewayPID(t)
	rssBefore := rssMiB(pid)

	stop := make(chan struct{})
	legit := make(chan []reqResult)
	go func() { legit <- load(gw+"/"+name, tok, 20, stop) }()
	var peakRSS atomic.Int64
	rssDone := make(chan struct{})
	go func() {
		defer close(rssDone)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if r := int64(rssMiB(pid)); r > peakRSS.Load() {
					peakRSS.Store(r)
				}
			}
		}
	}()
	time.Sleep(time.Second)

	var wg sync.WaitGroup
	var mu sync.Mutex
	var problems []string
	problem := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	dial := func() net.Conn {
		conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
		if err != nil {
			problem("dial: %v", err)
			return nil
		}
		return conn
	}
	head := fmt.Sprintf("POST /%s/predict HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n", name, u.Host, tok)

	// A slowloris: 200 connections, a header line every second, never
	// done. The gateway must close them (its header timeout).
	var slowCut atomic.Int64
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn := dial()
			if conn == nil {
				return
			}
			defer conn.Close()
			start := time.Now()
			if _, err := io.WriteString(conn, "GET /"+name+"/predict HTTP/1.1\r\nHost: "+u.Host+"\r\n"); err != nil {
				return
			}
			for time.Since(start) < 30*time.Second {
				_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := io.WriteString(conn, "X-Slow: 1\r\n"); err != nil {
					slowCut.Add(1)
					return
				}
				if closedWithin(conn, time.Second) {
					slowCut.Add(1)
					return
				}
			}
		}()
	}

	// 60 uploads of a 10 MiB body (the route's limit) that stall after
	// 9 MiB. The gateway must cut them off (or refuse them at once) rather
	// than hold their buffers for ever.
	var stalledCut atomic.Int64
	const bodySize = 10 << 20
	for i := 0; i < 60; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn := dial()
			if conn == nil {
				return
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, head+"Content-Length: "+strconv.Itoa(bodySize)+"\r\n\r\n"); err != nil {
				return
			}
			chunk := bytes.Repeat([]byte("x"), 64<<10)
			_ = conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
			for sent := 0; sent < 9<<20; sent += len(chunk) {
				if _, err := conn.Write(chunk); err != nil {
					stalledCut.Add(1) // refused (and closed) before the body was in
					return
				}
			}
			if closedWithin(conn, 30*time.Second) {
				stalledCut.Add(1)
			}
		}()
	}

	// Bodies over the limit: with a Content-Length (refused before the body
	// is read) and chunked (refused once past it, or once past the room
	// left in the gateway's buffers).
	for i := 0; i < 10; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			conn := dial()
			if conn == nil {
				return
			}
			defer conn.Close()
			_, _ = io.WriteString(conn, head+"Content-Length: "+strconv.Itoa(100<<20)+"\r\n\r\n")
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
				problem("100 MiB Content-Length: %v %v", statusOf(resp), err)
			}
		}()
		go func() {
			defer wg.Done()
			pr, pw := io.Pipe()
			go func() {
				chunk := bytes.Repeat([]byte("y"), 64<<10)
				for sent := 0; sent < 12<<20; sent += len(chunk) {
					if _, err := pw.Write(chunk); err != nil {
						return
					}
				}
				pw.Close()
			}()
			req, _ := http.NewRequest(http.MethodPost, gw+"/"+name+"/predict", pr)
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
			pr.Close()
			if err == nil {
				resp.Body.Close()
			}
			// 413 once past the limit, or 503 sooner while the stalled
			// uploads hold the gateway's buffers.
			if err == nil && resp.StatusCode != http.StatusRequestEntityTooLarge && resp.StatusCode != http.StatusServiceUnavailable {
				problem("12 MiB chunked body: %d", resp.StatusCode)
			}
		}()
	}

	// A header flood: 100 connections, each with 2 MiB of headers.
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn := dial()
			if conn == nil {
				return
			}
			defer conn.Close()
			var b strings.Builder
			b.WriteString(head)
			line := "X-Flood: " + strings.Repeat("z", 8<<10) + "\r\n"
			for b.Len() < 2<<20 {
				b.WriteString(line)
			}
			b.WriteString("Content-Length: 0\r\n\r\n")
			_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.WriteString(conn, b.String())
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err == nil && resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
				problem("2 MiB of headers: %d", resp.StatusCode)
			}
		}()
	}

	attackDone := make(chan struct{})
	go func() { wg.Wait(); close(attackDone) }()
	select {
	case <-attackDone:
	case <-time.After(90 * time.Second):
		t.Errorf("the attackers were still connected after 90 s: the gateway holds them")
	}
	time.Sleep(time.Second)
	close(stop)
	rs := <-legit
	<-rssDone

	for _, p := range problems {
		t.Error(p)
	}
	fails := failures(rs)
	t.Logf("legitimate: %d of %d requests failed; slowloris cut %d/200, stalled uploads cut %d/60; gateway RSS %d MiB before, %d MiB at peak",
		len(fails), len(rs), slowCut.Load(), stalledCut.Load(), rssBefore, peakRSS.Load())
	if len(rs) < 100 || len(fails) > len(rs)/200 {
		t.Errorf("legitimate requests during the attack: %d of %d failed (want under 0.5 %%):\n%s", len(fails), len(rs), strings.Join(fails, "\n"))
	}
	if slowCut.Load() != 200 {
		t.Errorf("the gateway cut off %d of 200 slowloris connections within 30 s", slowCut.Load())
	}
	if stalledCut.Load() != 60 {
		t.Errorf("the gateway cut off %d of 60 stalled uploads within 30 s of their stall", stalledCut.Load())
	}
	if p := peakRSS.Load(); p > 256 {
		t.Errorf("the gateway's RSS peaked at %d MiB under the attack, over 256 MiB", p)
	}

	// Afterwards: the service serves as before.
	client := &http.Client{Timeout: 10 * time.Second}
	for i := 0; i < 10; i++ {
		if r := predict(client, gw+"/"+name, tok); r.code != 200 {
			t.Fatalf("after the attack: %+v", r)
		}
	}
}

func statusOf(resp *http.Response) string {
	if resp == nil {
		return "no answer"
	}
	return resp.Status
}
