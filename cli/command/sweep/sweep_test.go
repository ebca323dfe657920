package sweep

import (
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/sweepcreds"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
	"github.com/gpujob/gpujob/internal/testagent"
)

var epoch = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// The tests share one real Consul agent: the sweep commands keep
// everything there.
var shared testagent.Lazy

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

func consulClient(t *testing.T) *consul.Client {
	t.Helper()
	return shared.Client(t)
}

// parseFake stands in for the agent's parser: the job's ID and meta are
// all the commands read back from a parsed job.
var jobLabel = regexp.MustCompile(`(?m)^job "([^"]+)"`)

func newFake() (*nomadapi.Fake, *[]string) {
	f := nomadapi.NewFake()
	var parsed []string
	f.ParseHCLFunc = func(src, _ string) (*api.Job, error) {
		parsed = append(parsed, src)
		id := jobLabel.FindStringSubmatch(src)[1]
		return &api.Job{ID: &id, Name: &id, Meta: map[string]string{}}, nil
	}
	return f, &parsed
}

func execute(t *testing.T, c *consul.Client, f *nomadapi.Fake, args ...string) (string, error) {
	t.Helper()
	ios, _, out, _ := iostreams.Test()
	fac := &factory.Factory{IO: ios, Now: func() time.Time { return epoch },
		Nomad:     func() (nomadapi.API, error) { return f, nil },
		Consul:    func() (*consul.Client, error) { return c, nil },
		Namespace: func() string { return "default" }}
	cmd := NewCmd(fac)
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(out)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

const specSrc = `sweep "%s" {
  train {
    workers = 1
    gpus_per_worker = 1
    command = "/usr/bin/python3"
    args    = ["/w/toy.py", "--lr", param.lr]
  }
  param "lr" {
    grid = [0.1, 0.01, 0.001]
  }
  objective {
    metric = "score"
  }
  search {
    algorithm = "grid"
  }
  parallel = 2
}
`

func writeSpec(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sweep.hcl")
	if err := os.WriteFile(p, []byte(strings.Replace(specSrc, "%s", name, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSubmitRecordsTheSweepAndRegistersItsController(t *testing.T) {
	c := consulClient(t)
	f, parsed := newFake()
	t.Setenv("GPUJOB_CONTROLLER_BINARY", "/opt/gpujob/bin/gpujob")
	t.Setenv("NOMAD_TOKEN", "")
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	out, err := execute(t, c, f, "submit", "--detach", writeSpec(t, "sub"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "submitted sweep sub: up to 3 trials, 2 at a time; controller job sub-controller") {
		t.Errorf("output:\n%s", out)
	}
	if len(f.Registered) != 1 || *f.Registered[0].ID != "sub-controller" {
		t.Fatalf("want the controller registered, got %d jobs", len(f.Registered))
	}
	var ctlHCL string
	for _, src := range *parsed {
		if strings.Contains(src, `job "sub-controller"`) {
			ctlHCL = src
		}
	}
	for _, want := range []string{`driver       = "raw_exec"`, `user         = "nobody"`, `command = "/opt/gpujob/bin/gpujob"`,
		`args    = ["sweep", "controller", "--namespace", "default", "sub"]`} {
		if !strings.Contains(ctlHCL, want) {
			t.Errorf("controller jobspec lacks %s:\n%s", want, ctlHCL)
		}
	}
	st, index, err := controller.LoadState(context.Background(), c, sweepkv.DefaultPrefix, "default", "sub")
	if err != nil || index == 0 {
		t.Fatalf("no state: %v", err)
	}
	if st.Status != controller.StatusRunning || st.MaxTrials != 3 {
		t.Errorf("state %+v, want running with max_trials 3 (the grid's size)", st)
	}
	// A second submission of the same name is refused, and changes nothing.
	if out, err := execute(t, c, f, "submit", "--detach", writeSpec(t, "sub")); err == nil || !strings.Contains(err.Error(), "already exists (running)") {
		t.Errorf("second submit: %v\n%s", err, out)
	}
	if len(f.Registered) != 1 {
		t.Errorf("the refused submission registered a job")
	}
}

// With Nomad's ACLs on (the test's Consul has none), submit gives the
// controller a Nomad token and policy of its own in a variable its workload
// identity reads, renders it with that identity and without the CLI's TLS
// files, and purge takes all of it back.
func TestSubmitWithACLsIssuesTheControllersOwnToken(t *testing.T) {
	c := consulClient(t)
	f, parsed := newFake()
	f.SetACLEnabled(true)
	t.Setenv("GPUJOB_CONTROLLER_BINARY", "/opt/gpujob/bin/gpujob")
	t.Setenv("NOMAD_CACERT", "/etc/nomad/ca.pem")
	out, err := execute(t, c, f, "submit", "--detach", writeSpec(t, "acl"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var ctlHCL string
	for _, src := range *parsed {
		if strings.Contains(src, `job "acl-controller"`) {
			ctlHCL = src
		}
	}
	for _, want := range []string{"identity {", "file = true", `GPUJOB_SWEEP_CREDENTIALS = "nomad/jobs/acl-controller"`, `NOMAD_CACERT             = ""`,
		`user         = "gpujob-sweep"`} {
		if !strings.Contains(ctlHCL, want) {
			t.Errorf("controller jobspec lacks %s:\n%s", want, ctlHCL)
		}
	}
	pol := f.ACLPolicies()[sweepcreds.PolicyName("default", "acl")]
	if pol == nil || !strings.Contains(pol.Rules, `"submit-job", "read-job", "list-jobs"`) {
		t.Fatalf("controller policy %+v", pol)
	}
	v := f.Variables()["nomad/jobs/acl-controller"]
	toks := f.Tokens()
	if v == nil || len(toks) != 1 || toks[v.Items["nomad_accessor"]] == nil || toks[v.Items["nomad_accessor"]].SecretID != v.Items["nomad_token"] {
		t.Fatalf("variable %+v, tokens %+v: want the one token's secret in the variable", v, toks)
	}
	if _, ok := v.Items["consul_token"]; ok {
		t.Errorf("a Consul token was made for a Consul without ACLs: %v", v.Items)
	}

	f.RemoveJob("acl-controller") // as if it had ended
	out, err = execute(t, c, f, "stop", "--purge", "acl")
	if err != nil {
		t.Fatalf("purge: %v\n%s", err, out)
	}
	if len(f.ACLPolicies()) != 0 || len(f.Tokens()) != 0 || len(f.Variables()) != 0 {
		t.Errorf("left after purge: policies %v, tokens %v, variables %v", f.ACLPolicies(), f.Tokens(), f.Variables())
	}
	if !strings.Contains(out, "its controller's ACL tokens and policies") {
		t.Errorf("purge output:\n%s", out)
	}
}

// A submitter whose token cannot make tokens is told what to use, and the
// sweep is not recorded.
func TestSubmitWithACLsAndNoManagementTokenIsRefusedCleanly(t *testing.T) {
	c := consulClient(t)
	f, _ := newFake()
	f.SetACLEnabled(true)
	t.Setenv("GPUJOB_CONTROLLER_BINARY", "/opt/gpujob/bin/gpujob")
	f.Fail("ACLTokens", &nomadapi.PermissionError{Op: "listing ACL tokens", Need: nomadapi.Need{Management: true},
		Address: f.Address(), TokenSet: true, TokenName: "alice", TokenPolicies: []string{"gpujob-submit"}})
	_, err := execute(t, c, f, "submit", "--detach", writeSpec(t, "aclno"))
	if err == nil || !strings.Contains(err.Error(), "only a management token") || !strings.Contains(err.Error(), `"alice" of policies gpujob-submit`) {
		t.Fatalf("want the management-token refusal naming the token, got %v", err)
	}
	if len(f.Registered) != 0 || len(f.ACLPolicies()) != 0 || len(f.Variables()) != 0 {
		t.Errorf("the refused submission left jobs %d, policies %v, variables %v", len(f.Registered), f.ACLPolicies(), f.Variables())
	}
	if keys, _, _ := c.KV().Keys(sweepkv.SweepKey(sweepkv.DefaultPrefix, "default", "aclno")+"/", "", nil); len(keys) != 0 {
		t.Errorf("the refused submission recorded %v", keys)
	}
}

// seed records a sweep with trials in the given states, as a controller
// would have left it.
func seed(t *testing.T, c *consul.Client, f *nomadapi.Fake, name string, status controller.Status, states ...controller.TrialState) {
	t.Helper()
	ctx := context.Background()
	rec := map[string]any{"version": 1, "namespace": "default", "sweep": name, "metric": "score", "mode": "max",
		"algorithm": "grid", "max_trials": len(states), "parallel": 2, "workers": 1, "gpus_per_worker": 1,
		"template": &api.Job{}, "params": []search.Param{search.GridParam("lr", search.FloatValue(0.1), search.FloatValue(0.01), search.FloatValue(0.001), search.FloatValue(1e-4))}}
	b, _ := json.Marshal(rec)
	if _, err := c.KV().Put(&consul.KVPair{Key: sweepkv.SpecKey(sweepkv.DefaultPrefix, "default", name), Value: b}, nil); err != nil {
		t.Fatal(err)
	}
	st := &controller.State{Namespace: "default", Sweep: name, Status: status, MaxTrials: len(states), Starts: 1}
	if status.Terminal() {
		st.Ended = epoch
	}
	lrs := []float64{0.1, 0.01, 0.001, 1e-4}
	for i, s := range states {
		v := float64(i) / 10
		tr := controller.Trial{ID: controller.TrialID(i), Index: i, JobID: controller.TrialJobID(name, i), State: s,
			Params: search.Assignment{"lr": search.FloatValue(lrs[i])}, Step: 10 * (i + 1), Value: &v}
		if s == controller.TrialStopped {
			tr.StoppedBy, tr.Reason = controller.StoppedByASHA, "stopped by ASHA at step 10: 0.1 < rung cut 0.3"
		}
		st.Trials = append(st.Trials, tr)
		if s.Active() {
			id, status := tr.JobID, "running"
			f.SetJob(&api.Job{ID: &id, Name: &id, Status: &status, Meta: map[string]string{contract.MetaSweep: name}})
		}
	}
	if ok, err := controller.SaveState(ctx, c, sweepkv.DefaultPrefix, st, 0); err != nil || !ok {
		t.Fatalf("saving the state: %v %v", ok, err)
	}
}

func TestStatusShowsEveryTrialAndTheBest(t *testing.T) {
	c := consulClient(t)
	f, _ := newFake()
	seed(t, c, f, "st", controller.StatusRunning, controller.TrialCompleted, controller.TrialStopped, controller.TrialCompleted, controller.TrialRunning)
	out, err := execute(t, c, f, "status", "st")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{
		"sweep st: running",
		"trials: 1 running, 2 completed, 1 stopped early of at most 4, 2 at a time",
		"best: trial-003 score 0.2 (lr=0.001, completed)",
		"trial-002  stopped    0.01    20    0.1    stopped by ASHA at step 10: 0.1 < rung cut 0.3",
		"trial-003  completed  0.001   30    0.2    best",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	out, err = execute(t, c, f, "status", "--json", "st")
	if err != nil {
		t.Fatal(err)
	}
	var s Status
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if s.Best == nil || s.Best.ID != "trial-003" || len(s.Trials) != 4 || s.Counts["completed"] != 2 || s.Controller.Status != "missing" {
		t.Errorf("status -json: %+v", s)
	}
	if _, err := execute(t, c, f, "status", "nosuch"); err == nil || !strings.Contains(err.Error(), `no sweep "nosuch"`) {
		t.Errorf("unknown sweep: %v", err)
	}
}

func TestStopWithoutAControllerStopsTheTrialsItself(t *testing.T) {
	c := consulClient(t)
	f, _ := newFake()
	seed(t, c, f, "stp", controller.StatusRunning, controller.TrialCompleted, controller.TrialRunning, controller.TrialRunning)
	out, err := execute(t, c, f, "stop", "stp")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	stopped := map[string]bool{}
	for _, d := range f.Deregistered {
		stopped[d.JobID] = !d.Purge
	}
	if !stopped["stp-trial-002"] || !stopped["stp-trial-003"] || stopped["stp-trial-001"] {
		t.Errorf("deregistered %+v, want the two running trials stopped", f.Deregistered)
	}
	st, _, _ := controller.LoadState(context.Background(), c, sweepkv.DefaultPrefix, "default", "stp")
	if st.Status != controller.StatusStopped || st.Ended.IsZero() || st.Counts()[controller.TrialStopped] != 2 {
		t.Errorf("state %s, counts %v", st.Status, st.Counts())
	}
	if !strings.Contains(out, "sweep stp stopped: 1 completed, 2 stopped early") {
		t.Errorf("output:\n%s", out)
	}

	// --purge: no job, no key.
	out, err = execute(t, c, f, "stop", "--purge", "stp")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	keys, _, err := c.KV().Keys(sweepkv.SweepKey(sweepkv.DefaultPrefix, "default", "stp")+"/", "", nil)
	if err != nil || len(keys) != 0 {
		t.Errorf("keys left after --purge: %v %v", keys, err)
	}
	if jobs, _, _ := f.Jobs(&api.QueryOptions{Prefix: "stp-"}); len(jobs) != 0 {
		t.Errorf("%d jobs left after --purge", len(jobs))
	}
}

func TestExtendContinuesAnEndedSweep(t *testing.T) {
	c := consulClient(t)
	f, _ := newFake()
	t.Setenv("GPUJOB_CONTROLLER_BINARY", "/opt/gpujob/bin/gpujob")
	seed(t, c, f, "ext", controller.StatusCompleted, controller.TrialCompleted, controller.TrialCompleted)
	out, err := execute(t, c, f, "extend", "ext", "--max-trials", "+2", "--detach")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	st, _, _ := controller.LoadState(context.Background(), c, sweepkv.DefaultPrefix, "default", "ext")
	if st.MaxTrials != 4 || st.Status != controller.StatusRunning || !st.Ended.IsZero() || len(st.Trials) != 2 {
		t.Errorf("state after extend: %+v", st)
	}
	if len(f.Registered) != 1 || *f.Registered[0].ID != "ext-controller" {
		t.Errorf("want the controller registered again, got %d", len(f.Registered))
	}
	if _, err := execute(t, c, f, "extend", "ext", "--max-trials", "1", "--detach"); err == nil {
		t.Error("extend below the trials it has was accepted")
	}
}

func TestReportDrawsTheTrialsCurves(t *testing.T) {
	c := consulClient(t)
	f, _ := newFake()
	seed(t, c, f, "rep", controller.StatusCompleted, controller.TrialCompleted, controller.TrialStopped, controller.TrialCompleted)
	for i, steps := range []int{4, 2, 4} {
		m := sweepkv.Metrics{}
		for s := 1; s <= steps; s++ {
			m.Points = append(m.Points, sweepkv.Point{Step: 10 * s, Values: map[string]float64{"score": float64(i*s) / 10, "loss": 1}})
		}
		b, _ := json.Marshal(m)
		key := sweepkv.MetricsKey(sweepkv.DefaultPrefix, "default", "rep", controller.TrialID(i))
		if _, err := c.KV().Put(&consul.KVPair{Key: key, Value: b}, nil); err != nil {
			t.Fatal(err)
		}
	}
	curves, _, err := (&env{consul: c, ns: "default", prefix: sweepkv.DefaultPrefix}).curves(context.Background(), "rep")
	if err != nil {
		t.Fatal(err)
	}
	if len(curves) != 3 || len(curves[0].Points) != 4 || len(curves[1].Points) != 2 || !curves[2].Best ||
		curves[1].StopNote != "ASHA at step 10" || curves[1].State != "stopped" {
		t.Fatalf("curves: %+v", curves)
	}
	out := filepath.Join(t.TempDir(), "sweep.png")
	if msg, err := execute(t, c, f, "report", "rep", "-o", out); err != nil || !strings.Contains(msg, "wrote "+out+": 3 trial(s)") {
		t.Fatalf("%v\n%s", err, msg)
	}
	fh, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	img, err := png.Decode(fh)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 700 {
		t.Errorf("size %v", b)
	}
}

// Credentials that fail half-way leave neither credentials nor a record.
func TestSubmitWithACLsUndoesAFailedIssue(t *testing.T) {
	c := consulClient(t)
	f, _ := newFake()
	f.SetACLEnabled(true)
	t.Setenv("GPUJOB_CONTROLLER_BINARY", "/opt/gpujob/bin/gpujob")
	f.Fail("PutVariable", errors.New("writing variable: Unexpected response code: 500 (raft apply failed)"))
	_, err := execute(t, c, f, "submit", "--detach", writeSpec(t, "aclhalf"))
	if err == nil || !strings.Contains(err.Error(), "raft apply failed") {
		t.Fatalf("want the variable's failure, got %v", err)
	}
	if len(f.Registered) != 0 || len(f.ACLPolicies()) != 0 || len(f.Tokens()) != 0 {
		t.Errorf("left: jobs %d, policies %v, tokens %v", len(f.Registered), f.ACLPolicies(), f.Tokens())
	}
	if keys, _, _ := c.KV().Keys(sweepkv.SweepKey(sweepkv.DefaultPrefix, "default", "aclhalf")+"/", "", nil); len(keys) != 0 {
		t.Errorf("the failed submission left its record: %v", keys)
	}
}
