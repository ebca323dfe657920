package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"
)

// Attacks between the tenants of one cluster, on the ACL and TLS cluster
// (issue 23): what a user of one Nomad namespace, or a job's code, can make
// gpujob's shared components do to another namespace. Each is written in the
// words of the attack, and each ends with the ordinary path still working.

// consulPolicyToken renders gpujob's policy name for namespace ns with the
// CLI (gpujob acl policy, as an operator does), creates it in Consul under
// policyName and returns a token of it; both are deleted when the test ends.
func (c *cluster) consulPolicyToken(t *testing.T, name, ns, policyName string) string {
	t.Helper()
	rules, errOut, code := c.gpujobEnv(t, c.cliEnv(""), time.Minute, "acl", "policy", name, "--namespace", ns)
	if code != 0 {
		t.Fatalf("gpujob acl policy %s --namespace %s exited %d: %s", name, ns, code, errOut)
	}
	acl := c.consulClient(t).ACL()
	p, _, err := acl.PolicyCreate(&consul.ACLPolicy{Name: policyName, Rules: rules}, nil)
	if err != nil {
		t.Fatalf("Consul refuses the policy gpujob acl policy %s printed: %v\n%s", name, err, rules)
	}
	tok, _, err := acl.TokenCreate(&consul.ACLToken{Description: "e2e " + policyName, Policies: []*consul.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = acl.TokenDelete(tok.AccessorID, nil)
		_, _ = acl.PolicyDelete(p.ID, nil)
	})
	return tok.SecretID
}

// A user of one namespace cannot write another namespace's sweep records
// (the trial template its controller registers with its own token), routes
// or service tokens; Consul refuses. The namespace "default"'s user tokens
// of the dev cluster (rendered by gpujob acl policy) and those an operator
// renders for another namespace hold alike, also for a namespace whose name
// starts with the user's ("e2e-team" and "e2e-team-b"). Each still writes
// its own namespace's, and reads every namespace's routes (path claims are
// cluster-wide) but no other namespace's sweeps.
func TestTenancyNamespacesHoldInConsul(t *testing.T) {
	c := secureCluster(t)
	m := c.consulClient(t)
	const victim = "e2e-victim"
	seeded := map[string]string{
		"sweep":  "gpujob/sweeps/default/" + victim + "/spec",
		"route":  "gpujob/services/default/" + victim + "/route",
		"token":  "gpujob/services/default/" + victim + "/tokens/" + strings.Repeat("ab", 32),
		"team-b": "gpujob/sweeps/e2e-team-b/" + victim + "/spec",
	}
	for _, k := range seeded {
		if _, err := m.KV().Put(&consul.KVPair{Key: k, Value: []byte(`{"seeded": true}`)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, p := range []string{"gpujob/sweeps/default/" + victim + "/", "gpujob/services/default/" + victim + "/",
			"gpujob/sweeps/e2e-team-b/", "gpujob/sweeps/e2e-team/", "gpujob/services/e2e-team/"} {
			_, _ = m.KV().DeleteTree(p, nil)
		}
	})
	// The dev cluster's users of the namespace "default" first, then
	// tokens an operator renders for the namespace "e2e-team".
	defaultSweeps, defaultServices := c.secret("consul-sweeps"), c.secret("consul-services")
	c.checkConsulAccess(t, []consulAccess{
		{"default's sweeps token", defaultSweeps, "write", "gpujob/sweeps/e2e-team/" + victim + "/spec", false},
		{"default's sweeps token", defaultSweeps, "write", seeded["team-b"], false},
		{"default's services token", defaultServices, "write", "gpujob/services/e2e-team/" + victim + "/route", false},
		{"default's sweeps token", defaultSweeps, "write", "gpujob/rendezvous/default/x", false},
		{"default's sweeps token", defaultSweeps, "write", "gpujob/sweeps/default/" + victim + "/state", true},
		{"default's services token", defaultServices, "write", "gpujob/services/default/" + victim + "/route", true},
	})
	teamSweeps := c.consulPolicyToken(t, "consul-sweeps", "e2e-team", "e2e-sweeps-e2e-team")
	teamServices := c.consulPolicyToken(t, "consul-services", "e2e-team", "e2e-services-e2e-team")
	c.checkConsulAccess(t, []consulAccess{
		// Another namespace's records: the attack.
		{"e2e-team's sweeps token", teamSweeps, "write", seeded["sweep"], false},
		{"e2e-team's sweeps token", teamSweeps, "delete", seeded["sweep"], false},
		{"e2e-team's sweeps token", teamSweeps, "write", seeded["team-b"], false},
		{"e2e-team's sweeps token", teamSweeps, "read", seeded["sweep"], false},
		{"e2e-team's services token", teamServices, "write", seeded["route"], false},
		{"e2e-team's services token", teamServices, "write", seeded["token"], false},
		{"e2e-team's services token", teamServices, "delete", seeded["route"], false},
		{"e2e-team's services token", teamServices, "write", "gpujob/services/default/another/tokens/" + strings.Repeat("cd", 32), false},
		// Their own: what they are for.
		{"e2e-team's sweeps token", teamSweeps, "write", "gpujob/sweeps/e2e-team/mine/spec", true},
		{"e2e-team's services token", teamServices, "write", "gpujob/services/e2e-team/mine/route", true},
		{"e2e-team's services token", teamServices, "read", seeded["route"], true},
	})
	// The seeded records of the victim are as they were.
	for what, k := range seeded {
		if what == "route" {
			continue // default's own token rewrote it above
		}
		p, _, err := m.KV().Get(k, nil)
		if err != nil || p == nil || string(p.Value) != `{"seeded": true}` {
			t.Errorf("the victim's %s %s changed: %v %v", what, k, p, err)
		}
	}
}

// consulAccess is one request of a token: op (read, write, delete) on key.
type consulAccess struct {
	who, token, op, key string
	allowed             bool
}

// checkConsulAccess tries each access with its token: Consul must refuse
// what is not allowed (403) and grant what is.
func (c *cluster) checkConsulAccess(t *testing.T, checks []consulAccess) {
	t.Helper()
	for _, a := range checks {
		kv := c.consulClientWith(t, a.token).KV()
		var err error
		switch a.op {
		case "write":
			_, err = kv.Put(&consul.KVPair{Key: a.key, Value: []byte(`{"by": "` + a.who + `"}`)}, nil)
		case "delete":
			_, err = kv.Delete(a.key, nil)
		case "read":
			_, _, err = kv.Get(a.key, nil)
		}
		switch {
		case a.allowed && err != nil:
			t.Errorf("%s cannot %s %s: %v", a.who, a.op, a.key, err)
		case !a.allowed && !isDenied(err):
			t.Errorf("%s could %s another namespace's %s (%v)", a.who, a.op, a.key, err)
		}
	}
}

// A template written into a sweep's record that is not what gpujob sweep
// submit wrote — here by the holder of the task driver's Consul token, which
// writes every trial's metrics and so every sweep's tree: the sweep's mark
// removed and the trial's command replaced — is refused by the sweep's
// controller, which registers nothing from it (with its own Nomad token)
// and fails the sweep saying why. Afterwards an ordinary sweep completes
// (TestSweepWithACLsAndTLS).
func TestTenancyControllerRefusesATamperedTemplate(t *testing.T) {
	c := secureCluster(t)
	c.nodeGPUs(t, c.gpusPerClient())
	secrets := c.secrets(t)
	const name = "e2e-tenancy-tamper"
	admin := c.secureSweepEnv(secrets["nomad-management"], secrets["consul-management"])
	src, err := os.ReadFile(filepath.Join(c.repo, "jobspecs", "examples", "sweep-toy.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(src), `sweep "toy-lr"`, fmt.Sprintf("sweep %q", name), 1)
	text = strings.Replace(text, "parallel          = 4", "parallel          = 1", 1)
	spec := filepath.Join(t.TempDir(), "sweep.hcl")
	if err := os.WriteFile(spec, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	// Where the tampered trial would leave its mark (it runs as nobody).
	markDir, err := os.MkdirTemp("", "gj-e2e-mark-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(markDir) })
	if err := os.Chmod(markDir, 0o777); err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(markDir, "pwned")
	t.Cleanup(func() { c.gpujobEnv(t, admin, 3*time.Minute, "sweep", "stop", "--purge", name) })

	toy := filepath.Join(c.env["GPUJOB_DEV_WORKLOADS"], "sweep_toy.py")
	out, errOut, code := c.gpujobEnv(t, admin, 2*time.Minute, "sweep", "submit", "--detach", "-var", "workload="+toy,
		"-var", "max_trials=3", "-var", `args=["--steps","300","--report-every","10","--sleep-per-step","0.1"]`, spec)
	if code != 0 {
		t.Fatalf("sweep submit exited %d: %s%s", code, out, errOut)
	}
	if err := waitFor(time.Minute, func() bool { _, _, err := c.nomad.Jobs().Info(name+"-trial-001", nil); return err == nil }); err != nil {
		t.Fatalf("the first trial was never registered: %v", err)
	}

	// The attack: rewrite the record's template with the driver's token.
	key := "gpujob/sweeps/default/" + name + "/spec"
	pair, _, err := c.consulClient(t).KV().Get(key, nil)
	if err != nil || pair == nil {
		t.Fatalf("the sweep's record: %v %v", pair, err)
	}
	var rec map[string]any
	if err := json.Unmarshal(pair.Value, &rec); err != nil {
		t.Fatal(err)
	}
	tmpl, _ := rec["template"].(map[string]any)
	meta, _ := tmpl["Meta"].(map[string]any)
	if tmpl == nil || meta == nil {
		t.Fatalf("the record has no template with meta: %s", pair.Value)
	}
	delete(meta, "gpujob_sweep")
	replaced := 0
	for _, g := range tmpl["TaskGroups"].([]any) {
		for _, task := range g.(map[string]any)["Tasks"].([]any) {
			task := task.(map[string]any)
			if task["Driver"] == "gpujob" {
				cfg := task["Config"].(map[string]any)
				cfg["command"], cfg["args"] = "/bin/sh", []any{"-c", "echo pwned > " + mark}
				replaced++
			}
		}
	}
	if replaced == 0 {
		t.Fatalf("no gpujob task in the template: %s", pair.Value)
	}
	forged, _ := json.Marshal(rec)
	if _, err := c.consulClientWith(t, secrets["consul-driver"]).KV().Put(&consul.KVPair{Key: key, Value: forged}, nil); err != nil {
		t.Fatalf("the driver's token could not write the record (the attack needs it to): %v", err)
	}

	// The controller reads its record when it starts: kill it, Nomad
	// restarts it. (Its process runs before Nomad's allocation says so.)
	var pids []int
	if err := waitFor(30*time.Second, func() bool {
		allocs, err := c.allocsOf(name + "-controller")
		if err != nil {
			return false
		}
		pids = nil
		for _, a := range allocs {
			for _, p := range processes(a.ID) {
				if strings.Contains(strings.Join(p.args, " "), "sweep controller") {
					pids = append(pids, p.pid)
				}
			}
		}
		return len(pids) == 1
	}); err != nil {
		t.Fatalf("want the one controller process, found %v", pids)
	}
	if err := kill9(pids[0]); err != nil {
		t.Fatal(err)
	}

	userEnv := c.secureSweepEnv(secrets["nomad-submit"], secrets["consul-sweeps"])
	var doc sweepDoc
	if err := waitFor(90*time.Second, func() bool {
		out, _, code := c.gpujobEnv(t, userEnv, time.Minute, "sweep", "status", "-json", name)
		return code == 0 && json.Unmarshal([]byte(out), &doc) == nil && doc.Status != "running"
	}); err != nil {
		t.Fatalf("the sweep still runs on the tampered record: %+v", doc)
	}
	if doc.Status != "failed" || !strings.Contains(doc.Reason, "refused the sweep's record") {
		t.Errorf("the sweep is %s (%s), want failed by the controller's refusal", doc.Status, doc.Reason)
	}
	t.Logf("the sweep's reason: %s", doc.Reason)
	// Nothing of the tampered template ran or was registered.
	time.Sleep(3 * time.Second)
	if _, err := os.Stat(mark); err == nil {
		t.Errorf("the tampered trial ran: %s exists", mark)
	}
	jobs, _, err := c.nomad.Jobs().PrefixList(name + "-trial-")
	if err != nil {
		t.Fatal(err)
	}
	for _, stub := range jobs {
		j, _, err := c.nomad.Jobs().Info(stub.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if j.Meta["gpujob_sweep"] != name {
			t.Errorf("trial job %s registered from the tampered template (meta %v)", stub.ID, j.Meta)
		}
	}
}

// A trial whose rank 0 prints a gpujob-result line every millisecond, then
// 3000 huge gpujob-result and gpujob-metric lines (8.6 KiB each, alternating)
// in a tight loop, makes a
// bounded number of Consul writes: measured as Raft log entries against a
// trial of the same shape that prints one result, with the write interval,
// the results' allowance and the byte budget of internal/sweep/report as
// the bound. The trial still ends on its own, its last result in the
// record, and the record counts what the budgets held back.
func TestTenancyTrialFloodMakesBoundedConsulWrites(t *testing.T) {
	c := secureCluster(t)
	const seconds = 12
	quiet := fmt.Sprintf(`import time
print('gpujob-result: {"accuracy": 0.5, "steps": 1}', flush=True)
time.sleep(%d)
`, seconds)
	flood := fmt.Sprintf(`import sys, time
out = sys.stdout
t0, step = time.time(), 0
while time.time() - t0 < %d / 2:
    step += 1
    out.write('gpujob-result: {"accuracy": %%f, "steps": %%d}\n' %% (step / 1e7, step))
    out.flush()
    time.sleep(0.001)
names = ['v' * 120 + '%%03d' %% i for i in range(64)]
for _ in range(3000):
    step += 1
    vals = ', '.join('"%%s": %%d.5' %% (n, step) for n in names)
    kind = 'result' if step %% 2 else 'metric'
    out.write('gpujob-%%s: {"step": %%d, "steps": %%d, "accuracy": 0.5, %%s}\n' %% (kind, step, step, vals))
step += 1
out.write('gpujob-result: {"accuracy": 0.99, "steps": %%d}\n' %% step)
out.flush()
time.sleep(max(0, t0 + %d - time.time()))
print("flood-done", step, file=sys.stderr, flush=True)
`, seconds, seconds)

	// The reporter's writes within its budgets: its takeover, three
	// results at once, one a second, the last; and slack for the
	// cluster's own writes, which differ between the two runs.
	const slack = 20
	check := func(what string, quiet, flood, budget int64) {
		t.Logf("Raft log entries %s: quiet trial %d, flooding trial %d (allowed: %d + %d + %d)", what, quiet, flood, quiet, budget, slack)
		if flood > quiet+budget+slack {
			t.Errorf("the flooding trial made %d Raft writes %s, the quiet one %d: over the budget of %d (+%d)", flood, what, quiet, budget, slack)
		}
	}
	const firstHalf = "in its first half (a result a millisecond)"
	quietHalf, quietWrites, _ := c.trialRaftWrites(t, "e2e-tenancy-quiet", quiet, seconds/2, 2*time.Minute, nil)
	_, floodWrites, floodAlloc := c.trialRaftWrites(t, "e2e-tenancy-flood", flood, seconds/2, 2*time.Minute, func(half int64) {
		check(firstHalf, quietHalf, half, 1+3+seconds/2+2)
	})
	check("over its life", quietWrites, floodWrites, 1+3+seconds+2+1)

	var done int
	if _, err := fmt.Sscanf(lastLineWith(c.taskLog(t, floodAlloc, "train", "stderr"), "flood-done"), "flood-done %d", &done); err != nil {
		t.Fatalf("the flooding rank did not finish: %v", err)
	}
	pair, _, err := c.consulClient(t).KV().Get("gpujob/sweeps/default/e2e-tenancy-flood/trials/trial-001/metrics", nil)
	if err != nil || pair == nil {
		t.Fatalf("the trial's record: %v %v", pair, err)
	}
	var rec struct {
		Points []struct {
			Step  int  `json:"step"`
			Final bool `json:"final"`
		} `json:"points"`
		Reporting map[string]int64 `json:"reporting"`
	}
	if err := json.Unmarshal(pair.Value, &rec); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Points); n == 0 || rec.Points[n-1].Step != done || !rec.Points[n-1].Final {
		t.Errorf("the record's last point is not the last result (step %d): %d points", done, n)
	}
	r := rec.Reporting
	if r["points"] < int64(done) || r["results_deferred"] == 0 || r["byte_budget_waits"] == 0 || r["writes"] > floodWrites {
		t.Errorf("the record's reporting counters %v: want every line counted, results deferred and byte-budget waits", r)
	}
	t.Logf("%d lines reported; the record says %v", done, r)
}

// trialRaftWrites runs a one-member trial job whose rank runs the Python
// script, until it ends (complete), and returns the Consul Raft log entries
// made from its registration to half seconds after it runs (atHalf hears
// of them at once: a trial that never ends must not hide them), and to its
// end, and its allocation.
func (c *cluster) trialRaftWrites(t *testing.T, id, script string, half int, limit time.Duration, atHalf func(int64)) (int64, int64, string) {
	t.Helper()
	job := api.NewBatchJob(id, id, "global", 50)
	job.Datacenters = []string{"*"}
	task := api.NewTask("train", "gpujob").
		SetConfig("command", "/usr/bin/python3").
		SetConfig("args", []string{"-u", "-c", script}).
		SetConfig("sweep", id).
		SetConfig("trial", "trial-001").
		Require(&api.Resources{CPU: intp(500), MemoryMB: intp(256)})
	group := api.NewTaskGroup("train", 1).AddTask(task)
	group.RestartPolicy = &api.RestartPolicy{Attempts: intp(0), Mode: strp("fail")}
	group.ReschedulePolicy = &api.ReschedulePolicy{Attempts: intp(0), Unlimited: boolp(false)}
	job.AddTaskGroup(group)
	m := c.consulClient(t)
	t.Cleanup(func() { _, _ = m.KV().DeleteTree("gpujob/sweeps/default/"+id+"/", nil) })
	before := raftIndex(t, m)
	c.register(t, job)
	c.waitAllocs(t, ctx(t, limit), id, "the trial to run",
		allIn(api.AllocClientStatusRunning, api.AllocClientStatusComplete, api.AllocClientStatusFailed))
	time.Sleep(time.Duration(half) * time.Second)
	mid := raftIndex(t, m)
	if atHalf != nil {
		atHalf(mid - before)
	}
	allocs := c.waitAllocs(t, ctx(t, limit), id, "the trial to end", allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed))
	after := raftIndex(t, m)
	if a := allocs[0]; a.ClientStatus != api.AllocClientStatusComplete {
		t.Fatalf("trial %s %s:\n%s", id, a.ClientStatus, c.taskLog(t, a.ID, "train", "stderr"))
	}
	return mid - before, after - before, allocs[0].ID
}

// raftIndex is the Consul server's last Raft log index.
func raftIndex(t *testing.T, c *consul.Client) int64 {
	t.Helper()
	self, err := c.Agent().Self()
	if err != nil {
		t.Fatal(err)
	}
	raft, _ := self["Stats"]["raft"].(map[string]any)
	n, err := strconv.ParseInt(fmt.Sprint(raft["last_log_index"]), 10, 64)
	if err != nil {
		t.Fatalf("the agent's raft stats: %v (%v)", raft, err)
	}
	return n
}

func lastLineWith(text, prefix string) string {
	last := ""
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			last = l
		}
	}
	return last
}

// The exporter runs on the cluster with ACLs and mutual TLS, the gateways'
// way: read-only Nomad and Consul tokens of its own (dev-up made them, from
// gpujob acl policy nomad-exporter and consul-exporter) and the Consul TLS
// material in the Nomad variable nomad/jobs/gpujob-exporter, read with its
// workload identity through its Task API socket, as a user of its own. It
// serves the cluster's GPUs and sweeps; its tokens can change nothing.
func TestTenancyExporterServesWithACLsAndTLS(t *testing.T) {
	c := secureCluster(t)
	if _, err := user.Lookup("gpujob-exporter"); err != nil {
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "gpujob-exporter").CombinedOutput(); err != nil {
			t.Fatalf("useradd gpujob-exporter: %v\n%s", err, out)
		}
	}
	secrets := c.secrets(t)
	items := api.VariableItems{"nomad_token": secrets["nomad-exporter"], "consul_token": secrets["consul-exporter"]}
	for item, env := range map[string]string{"consul_ca_pem": "CONSUL_CACERT", "consul_cert_pem": "CONSUL_CLIENT_CERT", "consul_key_pem": "CONSUL_CLIENT_KEY"} {
		b, err := os.ReadFile(c.env[env])
		if err != nil {
			t.Fatal(err)
		}
		items[item] = string(b)
	}
	if items["nomad_token"] == "" || items["consul_token"] == "" {
		t.Fatalf("dev-up made no exporter tokens (secrets nomad-exporter, consul-exporter)")
	}
	const path = "nomad/jobs/gpujob-exporter"
	if _, _, err := c.nomad.Variables().Create(&api.Variable{Namespace: "default", Path: path, Items: items}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.nomad.Variables().Delete(path, nil) })
	// A sweep for the exporter to find in Consul.
	m := c.consulClient(t)
	state := `{"namespace":"default","sweep":"e2e-exp-sweep","status":"running","max_trials":3,"trials":[]}`
	if _, err := m.KV().Put(&consul.KVPair{Key: "gpujob/sweeps/default/e2e-exp-sweep/state", Value: []byte(state)}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = m.KV().DeleteTree("gpujob/sweeps/default/e2e-exp-sweep/", nil) })

	env := append(c.cliEnv(secrets["nomad-management"]), "CONSUL_HTTP_ADDR="+c.env["CONSUL_HTTP_ADDR"],
		"CONSUL_CACERT="+c.env["CONSUL_CACERT"], "CONSUL_CLIENT_CERT="+c.env["CONSUL_CLIENT_CERT"], "CONSUL_CLIENT_KEY="+c.env["CONSUL_CLIENT_KEY"])
	hcl, errOut, code := c.gpujobEnv(t, env, time.Minute, "exporter", "render", "--secrets", "--port", "0", "--binary", c.env["GPUJOB_CONTROLLER_BINARY"])
	if code != 0 {
		t.Fatalf("gpujob exporter render --secrets exited %d: %s", code, errOut)
	}
	for _, leak := range []string{secrets["nomad-exporter"], secrets["consul-exporter"], "BEGIN", c.env["CONSUL_CLIENT_KEY"]} {
		if strings.Contains(hcl, leak) {
			t.Errorf("the exporter's job holds a secret or a key file (%.12s…):\n%s", leak, hcl)
		}
	}
	job, err := c.nomad.Jobs().ParseHCL(hcl, true)
	if err != nil {
		t.Fatal(err)
	}
	c.register(t, job)

	var addr string
	if err := waitFor(90*time.Second, func() bool {
		entries, _, err := m.Health().Service("gpujob-exporter", "", true, nil)
		if err != nil || len(entries) == 0 {
			return false
		}
		addr = fmt.Sprintf("%s:%d", entries[0].Service.Address, entries[0].Service.Port)
		return true
	}); err != nil {
		allocs, _ := c.allocsOf(*job.ID)
		for _, a := range allocs {
			t.Logf("exporter %s %s: %s", a.ID, a.ClientStatus, c.taskLog(t, a.ID, "exp", "stderr"))
		}
		t.Fatalf("no healthy gpujob-exporter in Consul: %v", err)
	}
	var body string
	if err := waitFor(60*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == 200 && strings.Count(body, "DCGM_FI_DEV_GPU_UTIL{") == c.gpusPerClient() &&
			strings.Contains(body, `sweep="e2e-exp-sweep"`)
	}); err != nil {
		t.Fatalf("the exporter's metrics lack the cluster's %d GPUs or the sweep: %v\n%s", c.gpusPerClient(), err, tail(body, 40))
	}
	if !strings.Contains(body, "gpujob_exporter_up 1") {
		t.Errorf("gpujob_exporter_up is not 1:\n%s", tail(body, 40))
	}
	allocs, err := c.allocsOf(*job.ID)
	if err != nil || len(allocs) == 0 {
		t.Fatalf("the exporter's allocations: %v", err)
	}
	logs := c.taskLog(t, allocs[0].ID, "exp", "stderr")
	if !strings.Contains(logs, "credentials from the variable "+path) {
		t.Errorf("the exporter does not say it reads its credentials from %s:\n%s", path, logs)
	}
	noSecrets(t, "the exporter's log", logs+body, secrets)

	// Its tokens read, and change nothing.
	if _, err := c.consulClientWith(t, secrets["consul-exporter"]).KV().Put(&consul.KVPair{Key: "gpujob/sweeps/default/e2e-exp-sweep/state", Value: []byte("{}")}, nil); !isDenied(err) {
		t.Errorf("the exporter's Consul token wrote a sweep's state: %v", err)
	}
	en := c.nomadClientWith(t, secrets["nomad-exporter"])
	if _, _, err := en.Jobs().Deregister(*job.ID, false, nil); !nomadDenied(err) {
		t.Errorf("the exporter's Nomad token stopped a job: %v", err)
	}
	if _, _, err := en.Nodes().List(nil); err != nil {
		t.Errorf("the exporter's Nomad token cannot list nodes: %v", err)
	}
}
