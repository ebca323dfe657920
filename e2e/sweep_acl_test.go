package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/sweepcreds"
)

// secureSweepEnv is the CLI's environment for sweeps on the secure
// cluster: Nomad as cliEnv with nomadToken, Consul over mutual TLS with
// consulToken, and dev-up's controller binary.
func (c *cluster) secureSweepEnv(nomadToken, consulToken string) []string {
	env := c.cliEnv(nomadToken)
	for _, k := range []string{"CONSUL_HTTP_ADDR", "CONSUL_CACERT", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY", "GPUJOB_CONTROLLER_BINARY"} {
		env = append(env, k+"="+c.env[k])
	}
	return append(env, "CONSUL_HTTP_TOKEN="+consulToken)
}

// A sweep on the cluster with ACLs and mutual TLS: a submitter without a
// management token is told what it takes and nothing is made; with one, the
// controller acts with tokens of its own (its trials are registered with
// its token), which can reach nothing beyond its sweep; no secret shows in
// the CLI's output or the controller's log; purge leaves no job, key,
// session, token, policy or variable.
func TestSweepWithACLsAndTLS(t *testing.T) {
	c := secureCluster(t)
	c.nodeGPUs(t, c.gpusPerClient())
	secrets := c.secrets(t)
	const name = "e2e-sweep-acl"
	admin := c.secureSweepEnv(secrets["nomad-management"], secrets["consul-management"])
	src, err := os.ReadFile(filepath.Join(c.repo, "jobspecs", "examples", "sweep-toy.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(t.TempDir(), "sweep-toy.hcl")
	if err := os.WriteFile(spec, []byte(strings.Replace(string(src), `sweep "toy-lr"`, fmt.Sprintf("sweep %q", name), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	toy := filepath.Join(c.env["GPUJOB_DEV_WORKLOADS"], "sweep_toy.py")
	args := []string{"sweep", "submit", "-var", "workload=" + toy, "-var", "max_trials=3", "-var", `args=["--steps","30","--report-every","10","--sleep-per-step","0.05"]`, spec}
	var everything strings.Builder
	t.Cleanup(func() {
		out, errOut, code := c.gpujobEnv(t, admin, 3*time.Minute, "sweep", "stop", "--purge", name)
		if code != 0 {
			t.Errorf("sweep stop --purge exited %d: %s%s", code, out, errOut)
		}
	})

	// The submit policy's token cannot make the controller's tokens.
	out, errOut, code := c.gpujobEnv(t, c.secureSweepEnv(secrets["nomad-submit"], secrets["consul-management"]), time.Minute, args...)
	everything.WriteString(out + errOut)
	if code == 0 || !strings.Contains(errOut, "only a management token") {
		t.Fatalf("submit with the submit policy's token: exit %d, want the management-token refusal\n%s%s", code, out, errOut)
	}
	if jobs, _, _ := c.nomad.Jobs().PrefixList(name); len(jobs) != 0 {
		t.Fatalf("the refused submission registered %d job(s)", len(jobs))
	}
	cc := c.consulClient(t)
	if keys, _, _ := cc.KV().Keys("gpujob/sweeps/default/"+name+"/", "", nil); len(keys) != 0 {
		t.Fatalf("the refused submission recorded %v", keys)
	}

	out, errOut, code = c.gpujobEnv(t, admin, 5*time.Minute, args...)
	everything.WriteString(out + errOut)
	if code != 0 || !strings.Contains(out, "sweep "+name+" completed") {
		t.Fatalf("sweep submit exited %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	// A gpujob user who is no ACL administrator follows the sweep with
	// the submit policy's Nomad token and the sweeps policy's Consul token.
	out, errOut, code = c.gpujobEnv(t, c.secureSweepEnv(secrets["nomad-submit"], secrets["consul-sweeps"]), time.Minute,
		"sweep", "status", "-json", name)
	var doc sweepDoc
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil || doc.Status != "completed" || len(doc.Trials) != 3 {
		t.Errorf("sweep status with the user's tokens: exit %d, %+v\n%s%s", code, doc, out, errOut)
	}
	everything.WriteString(out + errOut)

	// The controller's credentials, as it reads them.
	v, _, err := c.nomad.Variables().Read(sweepcreds.VariablePath(name+"-controller"), nil)
	if err != nil {
		t.Fatalf("the controller's variable: %v", err)
	}
	own := map[string]string{"controller-nomad": v.Items["nomad_token"], "controller-consul": v.Items["consul_token"]}
	if own["controller-nomad"] == "" || own["controller-consul"] == "" || v.Items["consul_key_pem"] == "" {
		t.Fatalf("the controller's variable lacks its tokens or Consul TLS key: items %v", keysOf(v.Items))
	}
	// Its trials were registered with its own token, not the submitter's.
	for i := 1; i <= 3; i++ {
		job, _, err := c.nomad.Jobs().Info(fmt.Sprintf("%s-trial-%03d", name, i), nil)
		if err != nil {
			t.Fatal(err)
		}
		if job.NomadTokenID == nil || *job.NomadTokenID != v.Items["nomad_accessor"] {
			t.Errorf("trial %d registered with token %v, want the controller's %s", i, job.NomadTokenID, v.Items["nomad_accessor"])
		}
	}

	// What its tokens cannot do: Nomad's ACL system and nodes; Consul keys
	// outside its sweep, another sweep whose name extends its own included.
	cn := c.nomadClientWith(t, own["controller-nomad"])
	if _, _, err := cn.ACLTokens().List(nil); !nomadDenied(err) {
		t.Errorf("the controller's Nomad token listed ACL tokens: %v", err)
	}
	if _, _, err := cn.Nodes().List(nil); !nomadDenied(err) {
		t.Errorf("the controller's Nomad token listed nodes: %v", err)
	}
	if _, _, err := cn.Jobs().List(nil); err != nil {
		t.Errorf("the controller's Nomad token cannot list jobs: %v", err)
	}
	ccc := c.consulClientWith(t, own["controller-consul"])
	for _, key := range []string{"gpujob/sweeps/default/" + name + "2/state", "gpujob/sweeps/default/other/state", "gpujob/rendezvous/x"} {
		if _, err := ccc.KV().Put(&consul.KVPair{Key: key, Value: []byte("x")}, nil); !isDenied(err) {
			t.Errorf("the controller's Consul token wrote %s: %v", key, err)
		}
	}
	if _, _, err := ccc.ACL().PolicyList(nil); !isDenied(err) {
		t.Errorf("the controller's Consul token listed ACL policies: %v", err)
	}
	if _, _, err := ccc.KV().Get("gpujob/sweeps/default/"+name+"/state", nil); err != nil {
		t.Errorf("the controller's Consul token cannot read its sweep's state: %v", err)
	}

	// No secret, the controller's own included, in what the CLI printed or
	// the controller logged.
	allocs, err := c.allocsOf(name + "-controller")
	if err != nil || len(allocs) == 0 {
		t.Fatalf("the controller's allocations: %v", err)
	}
	for _, a := range allocs {
		everything.WriteString(c.taskLog(t, a.ID, "ctl", "stdout") + c.taskLog(t, a.ID, "ctl", "stderr"))
	}
	if !strings.Contains(everything.String(), "acting with the controller's own Nomad and Consul tokens") {
		t.Errorf("the controller's log does not say it used its own tokens:\n%s", everything.String())
	}
	for k, s := range own {
		secrets[k] = s
	}
	secrets["consul-client-key"] = v.Items["consul_key_pem"]

	// The controller ran as a user no workload runs as, and its identity
	// file is that user's alone: the ranks (nobody) cannot read it.
	ctl, _, err := c.nomad.Jobs().Info(name+"-controller", nil)
	if err != nil {
		t.Fatal(err)
	}
	if u := ctl.TaskGroups[0].Tasks[0].User; u != sweepcreds.ControllerUser {
		t.Errorf("the controller runs as %q, want %s", u, sweepcreds.ControllerUser)
	}
	owner, err := user.Lookup(sweepcreds.ControllerUser)
	if err != nil {
		t.Fatal(err)
	}
	idFile := filepath.Join(c.dir, "client-1", "data", "alloc", allocs[0].ID, "ctl", "secrets", "nomad_token")
	if fi, err := os.Stat(idFile); err != nil {
		t.Errorf("the controller's identity file: %v", err)
	} else if st := fi.Sys().(*syscall.Stat_t); fmt.Sprint(st.Uid) != owner.Uid || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("the controller's identity file is uid %d mode %v, want %s's alone", st.Uid, fi.Mode(), sweepcreds.ControllerUser)
	}
	noSecrets(t, "the CLI's output or the controller's log", everything.String(), secrets)

	// Purge takes everything back.
	out, errOut, code = c.gpujobEnv(t, admin, 3*time.Minute, "sweep", "stop", "--purge", name)
	if code != 0 || !strings.Contains(out, "its controller's ACL tokens and policies") {
		t.Fatalf("sweep stop --purge exited %d: %s%s", code, out, errOut)
	}
	policy := sweepcreds.PolicyName("default", name)
	if p, _, err := c.nomad.ACLPolicies().Info(policy, nil); err == nil && p != nil {
		t.Errorf("Nomad policy %s left after purge", policy)
	}
	toks, _, err := c.nomad.ACLTokens().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range toks {
		if tok.AccessorID == v.Items["nomad_accessor"] {
			t.Errorf("the controller's Nomad token %s is left after purge", tok.Name)
		}
	}
	if p, _, err := cc.ACL().PolicyReadByName(policy, nil); err != nil || p != nil {
		t.Errorf("Consul policy %s after purge: %v %v", policy, p, err)
	}
	if _, _, err := ccc.KV().Get("gpujob/sweeps/default/"+name+"/state", nil); !isDenied(err) {
		t.Errorf("the controller's Consul token still works after purge: %v", err)
	}
	if vv, _, err := c.nomad.Variables().Read(sweepcreds.VariablePath(name+"-controller"), nil); err == nil && vv != nil {
		t.Error("the controller's variable is left after purge")
	}
	if jobs, _, _ := c.nomad.Jobs().PrefixList(name); len(jobs) != 0 {
		t.Errorf("%d job(s) left after purge", len(jobs))
	}
	c.nothingInConsul(t)
}

// nomadClientWith is a Nomad client of the cluster with token.
func (c *cluster) nomadClientWith(t *testing.T, token string) *nomad.Client {
	t.Helper()
	cfg := nomad.DefaultConfig()
	cfg.Address, cfg.SecretID = c.env["NOMAD_ADDR"], token
	cfg.TLSConfig = &nomad.TLSConfig{CACert: c.env["NOMAD_CACERT"], ClientCert: c.env["NOMAD_CLIENT_CERT"], ClientKey: c.env["NOMAD_CLIENT_KEY"]}
	n, err := nomad.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// nomadDenied is Nomad refusing a request on ACL grounds.
func nomadDenied(err error) bool {
	var ue nomad.UnexpectedResponseError
	return errors.As(err, &ue) && ue.HasStatusCode() && ue.StatusCode() == 403
}

func keysOf(m map[string]string) string {
	b, _ := json.Marshal(func() []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		return ks
	}())
	return string(b)
}
