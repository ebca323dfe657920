package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"
)

// secure is the cluster of the security tests: ACLs (default deny) and
// mutual TLS for Nomad and Consul, as `make dev ACL=1 TLS=1` starts it, one
// client. The first such test starts it, the last stops it.
var secure = &sharedCluster{what: "the ACL and TLS cluster",
	opts: clusterOptions{clients: 1, gpus: fakeGPUsPerClient, offset: 19000, acl: true, tls: true, gateway: true,
		dynPorts: 31000},
	users: []string{"TestListenersStayOnLoopback", "TestSecurityTrainingWithACLsAndTLS", "TestSecurityRanksSeeNoTokens",
		"TestSecurityCLIWithoutTokenIsRefused", "TestSecurityForgedAndExpiredTokens", "TestSecurityDriverTokenIsConfinedToItsPrefix",
		"TestServiceWithACLsAndTLS", "TestSweepWithACLsAndTLS", "TestTenancyNamespacesHoldInConsul",
		"TestTenancyControllerRefusesATamperedTemplate", "TestTenancyTrialFloodMakesBoundedConsulWrites",
		"TestTenancyExporterServesWithACLsAndTLS", "TestQueueWithACLsAndTLS"}}

func secureCluster(t *testing.T) *cluster { return secure.get(t) }

// cliEnv is the CLI's environment for the secure cluster: what the env file
// of dev-up says for the address and TLS (nothing of the test's own NOMAD_*
// or CONSUL_*), and token as NOMAD_TOKEN unless it is empty.
func (c *cluster) cliEnv(token string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NOMAD_") && !strings.HasPrefix(kv, "CONSUL_") {
			env = append(env, kv)
		}
	}
	for _, k := range []string{"NOMAD_ADDR", "NOMAD_CACERT", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY"} {
		env = append(env, k+"="+c.env[k])
	}
	if token != "" {
		env = append(env, "NOMAD_TOKEN="+token)
	}
	return env
}

// cli runs the gpujob CLI against the secure cluster with token.
func (c *cluster) cli(t *testing.T, token string, timeout time.Duration, args ...string) (string, string, int) {
	t.Helper()
	return c.gpujobEnv(t, c.cliEnv(token), timeout, args...)
}

// secrets are every token secret of the cluster, by name, for the checks
// that none shows anywhere.
func (c *cluster) secrets(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(c.env["GPUJOB_DEV_SECRETS"], "*.token"))
	if err != nil || len(files) < 6 {
		t.Fatalf("the cluster's token files: %v (found %d)", err, len(files))
	}
	out := map[string]string{}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".token")
		if out[name] = c.secret(name); len(out[name]) < 16 {
			t.Fatalf("token %s is empty", name)
		}
	}
	return out
}

// noSecrets fails the test when text shows any of the cluster's secrets.
func noSecrets(t *testing.T, where, text string, secrets map[string]string) {
	t.Helper()
	for name, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("%s shows the secret of token %s", where, name)
		}
	}
}

// The demo's kind of job trains to completion with ACLs and mutual TLS on,
// submitted with the submit policy's token; the read-only token sees it and
// can change nothing; no secret shows in what the CLI or Nomad prints.
func TestSecurityTrainingWithACLsAndTLS(t *testing.T) {
	c := secureCluster(t)
	c.nodeGPUs(t, c.gpusPerClient())
	if !strings.HasPrefix(c.env["NOMAD_ADDR"], "https://") || !strings.HasPrefix(c.env["CONSUL_HTTP_ADDR"], "https://") {
		t.Fatalf("the env file does not say https: NOMAD_ADDR %q, CONSUL_HTTP_ADDR %q", c.env["NOMAD_ADDR"], c.env["CONSUL_HTTP_ADDR"])
	}
	secrets := c.secrets(t)
	submitTok, readTok := c.env["NOMAD_TOKEN"], secrets["nomad-readonly"]
	if submitTok != secrets["nomad-submit"] {
		t.Fatalf("the env file's NOMAD_TOKEN is not the gpujob-submit token")
	}
	const job = "e2e-cli-train"
	spec := filepath.Join(c.repo, "e2e", "testdata", "tiny-train.hcl")
	t.Cleanup(func() { c.purge(job) })

	out, errOut, code := c.cli(t, submitTok, 4*time.Minute, "submit", "--logs", "-var", c.workloadVar(), spec)
	if code != 0 {
		t.Fatalf("submit with the submit token exited %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"rendezvous round 1 complete: 2 member(s), world size 2", "complete in", "result: accuracy"} {
		if !strings.Contains(out, want) {
			t.Errorf("submit's progress lacks %q:\n%s", want, out)
		}
	}
	everything := out + errOut

	// The read-only token reads everything gpujob shows...
	status, errOut, code := c.cli(t, readTok, time.Minute, "status", "-json", job)
	if code != 0 {
		t.Fatalf("status with the read-only token exited %d: %s", code, errOut)
	}
	var st struct {
		State  string         `json:"state"`
		Result map[string]any `json:"result"`
	}
	if err := json.Unmarshal([]byte(status), &st); err != nil || st.State != "complete" || st.Result == nil {
		t.Errorf("status -json with the read-only token: state %q, result %v (%v):\n%s", st.State, st.Result, err, status)
	}
	everything += status
	for _, args := range [][]string{{"list"}, {"gpus", "-json"}, {"logs", "--rank", "1", job}} {
		out, errOut, code := c.cli(t, readTok, time.Minute, args...)
		if code != 0 {
			t.Errorf("%s with the read-only token exited %d: %s", strings.Join(args, " "), code, errOut)
		}
		everything += out + errOut
	}
	// ...and may change nothing.
	for _, args := range [][]string{{"submit", "-var", c.workloadVar(), spec}, {"stop", job}} {
		_, errOut, code := c.cli(t, readTok, time.Minute, args...)
		for _, want := range []string{`permission denied: this needs the submit-job capability in namespace "default"`,
			`to the token "nomad-readonly" (policies gpujob-readonly)`, "set NOMAD_TOKEN"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("%s with the read-only token: stderr lacks %q:\n%s", args[0], want, errOut)
			}
		}
		if code != 1 {
			t.Errorf("%s with the read-only token exited %d, want 1", args[0], code)
		}
		everything += errOut
	}
	if j, _, err := c.nomad.Jobs().Info(job, nil); err != nil || j.Stop != nil && *j.Stop {
		t.Errorf("the read-only token's stop reached the job: %v", err)
	}

	// No secret in task events, task logs, or anything printed above.
	allocs, _, err := c.nomad.Jobs().Allocations(job, true, nil)
	if err != nil || len(allocs) != 2 {
		t.Fatalf("allocations of %s: %d, %v", job, len(allocs), err)
	}
	var ids []string
	for _, stub := range allocs {
		ids = append(ids, stub.ID)
		a, _, err := c.nomad.Allocations().Info(stub.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		events, _ := json.Marshal(a.TaskStates)
		everything += string(events)
		everything += c.taskLog(t, a.ID, "train", "stdout") + c.taskLog(t, a.ID, "train", "stderr")
	}
	noSecrets(t, "the CLI's output, task events or task logs", everything, secrets)
	c.noSecretsOnDisk(t, secrets)

	// Nothing stays behind: processes, sessions, rendezvous keys.
	c.assertNoLeaks(t, job, ids...)
}

// The ranks get neither a Nomad nor a Consul token, even where Nomad puts
// one in the task's environment (a workload identity with env = true) or
// the job sets one: a raw_exec task beside them shows what the task
// environment held.
func TestSecurityRanksSeeNoTokens(t *testing.T) {
	c := secureCluster(t)
	secrets := c.secrets(t)
	const id = "e2e-security-env"
	job := api.NewBatchJob(id, id, "global", 50)
	job.Datacenters = []string{"*"}
	identity := &api.WorkloadIdentity{Env: true}
	env := map[string]string{"CONSUL_HTTP_TOKEN": "set-by-the-job"}
	rank := api.NewTask("rank", "gpujob").
		SetConfig("command", "/bin/sh").
		SetConfig("args", []string{"-c", "env; echo rank-done"}).
		Require(&api.Resources{CPU: intp(100), MemoryMB: intp(64)})
	rank.Identity, rank.Env = identity, env
	control := api.NewTask("control", "raw_exec").
		SetConfig("command", "/bin/sh").
		SetConfig("args", []string{"-c", "env; echo control-done"}).
		Require(&api.Resources{CPU: intp(100), MemoryMB: intp(64)})
	control.Identity, control.Env = identity, env
	group := api.NewTaskGroup("g", 1).AddTask(rank).AddTask(control)
	group.RestartPolicy = &api.RestartPolicy{Attempts: intp(0), Mode: strp("fail")}
	group.ReschedulePolicy = &api.ReschedulePolicy{Attempts: intp(0), Unlimited: boolp(false)}
	job.AddTaskGroup(group)
	c.register(t, job)

	allocs := c.waitAllocs(t, ctx(t, time.Minute), id, "both tasks to end", allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed))
	a := allocs[0]
	rankOut, controlOut := c.taskLog(t, a.ID, "rank", "stdout"), c.taskLog(t, a.ID, "control", "stdout")
	if a.ClientStatus != api.AllocClientStatusComplete {
		t.Fatalf("allocation ended %s; rank stderr:\n%s", a.ClientStatus, c.taskLog(t, a.ID, "rank", "stderr"))
	}
	// The control proves the task environment held both tokens.
	for _, want := range []string{"\nNOMAD_TOKEN=", "\nCONSUL_HTTP_TOKEN=set-by-the-job"} {
		if !strings.Contains("\n"+controlOut, want) {
			t.Fatalf("the raw_exec control lacks %q: the test no longer shows what it should\n%s", want, controlOut)
		}
	}
	if !strings.Contains(rankOut, "rank-done") || !strings.Contains(rankOut, "\nRANK=0") {
		t.Fatalf("the rank did not print its environment:\n%s", rankOut)
	}
	for _, k := range []string{"NOMAD_TOKEN", "CONSUL_HTTP_TOKEN"} {
		if strings.Contains("\n"+rankOut, "\n"+k+"=") {
			t.Errorf("the rank's environment has %s", k)
		}
	}
	noSecrets(t, "the rank's environment", rankOut, secrets)
	noSecrets(t, "the task environment", controlOut, secrets)
}

// Without a token the CLI is told, in plain words, which capability each
// command needs; nothing is registered.
func TestSecurityCLIWithoutTokenIsRefused(t *testing.T) {
	c := secureCluster(t)
	spec := filepath.Join(c.repo, "e2e", "testdata", "tiny-train.hcl")
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"submit", "-var", c.workloadVar(), spec}, []string{
			`gpujob submit needs the submit-job, read-job and read-logs capabilities in namespace "default" and node read`}},
		{[]string{"status", "e2e-cli-train"}, []string{`this needs the read-job capability in namespace "default"`}},
		{[]string{"list"}, []string{`this needs the list-jobs capability in namespace "default"`}},
		{[]string{"gpus"}, []string{"this needs node read"}},
		{[]string{"logs", "e2e-cli-train"}, []string{`this needs the read-job capability in namespace "default"`}},
	}
	for _, tc := range cases {
		out, errOut, code := c.cli(t, "", time.Minute, tc.args...)
		if code != 1 {
			t.Errorf("%s without a token exited %d, want 1\nstdout:\n%s\nstderr:\n%s", tc.args[0], code, out, errOut)
		}
		for _, want := range append(tc.want, "gpujob: permission denied: this needs", "anonymous token: NOMAD_TOKEN is not set",
			"set NOMAD_TOKEN to a token whose policy grants") {
			if !strings.Contains(errOut, want) {
				t.Errorf("%s without a token: stderr lacks %q:\n%s", tc.args[0], want, errOut)
			}
		}
	}
	c.noJobsRunning(t)
}

// A forged token and an expired one are refused with what is wrong with the
// token, and nothing stays registered.
func TestSecurityForgedAndExpiredTokens(t *testing.T) {
	c := secureCluster(t)
	spec := filepath.Join(c.repo, "e2e", "testdata", "tiny-train.hcl")
	submit := []string{"submit", "-var", c.workloadVar(), spec}

	forged := newUUID(t)
	for _, args := range [][]string{submit, {"list"}} {
		_, errOut, code := c.cli(t, forged, time.Minute, args...)
		if code != 1 || !strings.Contains(errOut, "does not know the ACL token") || strings.Contains(errOut, forged) {
			t.Errorf("%s with a forged token exited %d:\n%s", args[0], code, errOut)
		}
	}

	// A token of the submit policy that lives 3 s: it works, then it is
	// refused as expired.
	ttl := 3 * time.Second
	tok, _, err := c.nomad.ACLTokens().Create(&api.ACLToken{Name: "e2e-expiring", Type: "client",
		Policies: []string{"gpujob-submit"}, ExpirationTTL: ttl}, nil)
	if err != nil {
		t.Fatalf("creating an expiring token: %v", err)
	}
	t.Cleanup(func() { _, _ = c.nomad.ACLTokens().Delete(tok.AccessorID, nil) })
	if _, errOut, code := c.cli(t, tok.SecretID, time.Minute, "list"); code != 0 {
		t.Fatalf("list with the fresh expiring token exited %d: %s", code, errOut)
	}
	time.Sleep(time.Until(tok.ExpirationTime.Add(500 * time.Millisecond)))
	_, errOut, code := c.cli(t, tok.SecretID, time.Minute, submit...)
	if code != 1 || !strings.Contains(errOut, `permission denied: the ACL token "e2e-expiring" (policies gpujob-submit) expired at`) {
		t.Errorf("submit with an expired token exited %d:\n%s", code, errOut)
	}

	// Consul refuses a forged token outright, inside the driver's prefix too.
	cc := c.consulClientWith(t, newUUID(t))
	_, err = cc.KV().Put(&consul.KVPair{Key: "gpujob/rendezvous/e2e-forged", Value: []byte("x")}, nil)
	if err == nil || !strings.Contains(err.Error(), "ACL not found") {
		t.Errorf("a KV write with a forged Consul token: %v, want 403 ACL not found", err)
	}
	if _, _, err := cc.Session().Create(&consul.SessionEntry{Name: "e2e-forged", TTL: "10s"}, nil); err == nil {
		t.Error("a forged Consul token created a session")
	}

	c.noJobsRunning(t)
	c.nothingInConsul(t)
}

// The driver's Consul token reads and writes its key prefix and sessions,
// and nothing else: checked with the token itself against the Consul API.
func TestSecurityDriverTokenIsConfinedToItsPrefix(t *testing.T) {
	c := secureCluster(t)
	admin := c.consulClient(t)
	drv := c.consulClientWith(t, c.secret("consul-driver"))
	outside := []string{"e2e-outside/secret", "gpujob/rendezvous-sibling/secret"}
	for _, k := range outside {
		if _, err := admin.KV().Put(&consul.KVPair{Key: k, Value: []byte("x")}, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.KV().Delete(k, nil) })
	}

	// Inside: write, read, list, lock with a session, delete.
	const inside = "gpujob/rendezvous/e2e-security/probe"
	sid, _, err := drv.Session().Create(&consul.SessionEntry{Name: "e2e-security", TTL: "10s", Behavior: consul.SessionBehaviorDelete}, nil)
	if err != nil {
		t.Fatalf("the driver's token cannot create a session: %v", err)
	}
	if ok, _, err := drv.KV().Acquire(&consul.KVPair{Key: inside, Value: []byte("x"), Session: sid}, nil); err != nil || !ok {
		t.Errorf("the driver's token cannot lock a key in its prefix: %v", err)
	}
	if p, _, err := drv.KV().Get(inside, nil); err != nil || p == nil || p.Session != sid {
		t.Errorf("the driver's token cannot read its own key: %v", err)
	}
	if _, err := drv.KV().DeleteTree("gpujob/rendezvous/e2e-security/", nil); err != nil {
		t.Errorf("the driver's token cannot delete a tree in its prefix: %v", err)
	}
	if _, err := drv.Session().Destroy(sid, nil); err != nil {
		t.Errorf("the driver's token cannot destroy its session: %v", err)
	}

	// Outside: no write, no delete, and reads see nothing.
	for _, k := range outside {
		if _, err := drv.KV().Put(&consul.KVPair{Key: k, Value: []byte("y")}, nil); !isDenied(err) {
			t.Errorf("the driver's token wrote %s: %v", k, err)
		}
		if _, err := drv.KV().Delete(k, nil); !isDenied(err) {
			t.Errorf("the driver's token deleted %s: %v", k, err)
		}
		// Consul answers a read of an existing key 403, a listing by
		// leaving the key out.
		if p, _, err := drv.KV().Get(k, nil); p != nil || !isDenied(err) {
			t.Errorf("the driver's token read %s: %v, %v", k, p, err)
		}
	}
	if _, err := drv.KV().DeleteTree("e2e-outside/", nil); !isDenied(err) {
		t.Errorf("the driver's token deleted the tree e2e-outside/: %v", err)
	}
	keys, _, err := drv.KV().Keys("", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "gpujob/rendezvous/") {
			t.Errorf("the driver's token lists %s", k)
		}
	}
	// Nor the catalog, the agent, or the ACL system.
	if nodes, _, err := drv.Catalog().Nodes(nil); err != nil || len(nodes) != 0 {
		t.Errorf("the driver's token reads the catalog's nodes: %d, %v", len(nodes), err)
	}
	if _, err := drv.Agent().Self(); !isDenied(err) {
		t.Errorf("the driver's token reads the agent: %v", err)
	}
	if _, _, err := drv.ACL().TokenList(nil); !isDenied(err) {
		t.Errorf("the driver's token lists ACL tokens: %v", err)
	}
	if _, err := drv.Catalog().Register(&consul.CatalogRegistration{Node: "e2e-rogue", Address: "127.0.0.9"}, nil); !isDenied(err) {
		t.Errorf("the driver's token registers a node: %v", err)
	}
}

// noSecretsOnDisk fails the test when an agent's log, or a file Nomad keeps
// for a task (its logs, the executor's log, the task directories), shows a
// secret. Left out: secrets/, the rendered configs and the env file, which
// hold tokens by design; the agents' data dirs beyond the allocations
// (Consul's and Nomad's state hold their tokens); and each task's private
// directory, where the driver hands the supervisor its token.
func (c *cluster) noSecretsOnDisk(t *testing.T, secrets map[string]string) {
	t.Helper()
	var files []string
	logs, _ := filepath.Glob(filepath.Join(c.dir, "logs", "*"))
	files = append(files, logs...)
	allocDirs, _ := filepath.Glob(filepath.Join(c.dir, "client-*", "data", "alloc"))
	for _, root := range allocDirs {
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() && d.Name() == "private" {
				return filepath.SkipDir
			}
			if d.Type().IsRegular() {
				files = append(files, path)
			}
			return nil
		})
	}
	if len(files) < 5 {
		t.Fatalf("only %d agent and task files to check: %v", len(files), files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // removed meanwhile
		}
		noSecrets(t, f, string(b), secrets)
	}
}

// isDenied reports whether err is Consul's 403.
func isDenied(err error) bool {
	var se consul.StatusError
	return errors.As(err, &se) && se.Code == 403
}

func newUUID(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/random/uuid")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// noJobsRunning fails the test when a job of the cluster is not dead.
func (c *cluster) noJobsRunning(t *testing.T) {
	t.Helper()
	jobs, _, err := c.nomad.Jobs().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		// The cluster's own gateway and exporters run for as long as the cluster.
		if j.Status != "dead" && j.ID != "gpujob-gateway" && j.ID != "gpujob-exporter" {
			t.Errorf("job %s is %s", j.ID, j.Status)
		}
	}
}

// nothingInConsul fails the test when a session or a rendezvous key is left
// (within leakWait: the last member out deletes a run's keys).
func (c *cluster) nothingInConsul(t *testing.T) {
	t.Helper()
	cc := c.consulClient(t)
	var left []string
	err := waitFor(leakWait, func() bool {
		left = nil
		sessions, _, err := cc.Session().List(nil)
		if err != nil {
			left = append(left, err.Error())
			return false
		}
		for _, s := range sessions {
			// The cluster's gateway keeps sessions of its own (its load
			// report, the autoscaling lock) for as long as it runs.
			if strings.HasPrefix(s.Name, "gpujob-gateway") {
				continue
			}
			left = append(left, fmt.Sprintf("session %s (%s)", s.Name, s.ID[:8]))
		}
		keys, _, err := cc.KV().Keys("gpujob/rendezvous/", "", nil)
		if err != nil {
			left = append(left, err.Error())
			return false
		}
		for _, k := range keys {
			left = append(left, "key "+k)
		}
		return len(left) == 0
	})
	if err != nil {
		t.Errorf("left in Consul: %s", strings.Join(left, ", "))
	}
}
