package queue

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/cmdutil/cmdtest"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs/fixture"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/testagent"
)

var shared testagent.Lazy

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

func TestOptionsFromArgs(t *testing.T) {
	cmdtest.CheckOptions(t, NewApplyCmd, []cmdtest.Case[ApplyOptions]{
		{Args: []string{"q.hcl"}, Want: ApplyOptions{Path: "q.hcl"}},
		{Args: []string{"--dry-run", "--json", "q.hcl"}, Want: ApplyOptions{Path: "q.hcl", DryRun: true, JSON: true}},
	})
	cmdtest.CheckRefusals(t, NewApplyCmd, cmdtest.Refusal{Args: []string{}, Err: "accepts 1 arg(s), received 0"})
	cmdtest.CheckOptions(t, NewListCmd, []cmdtest.Case[ListOptions]{
		{Args: []string{}, Want: ListOptions{}},
		{Args: []string{"--json"}, Want: ListOptions{JSON: true}},
	})
	cmdtest.CheckRefusals(t, NewListCmd, cmdtest.Refusal{Args: []string{"x"}, Err: `unknown command "x"`})
	cmdtest.CheckOptions(t, NewStatusCmd, []cmdtest.Case[StatusOptions]{
		{Args: []string{}, Want: StatusOptions{}},
		{Args: []string{"team-a", "--json"}, Want: StatusOptions{Name: "team-a", JSON: true}},
	})
	cmdtest.CheckRefusals(t, NewStatusCmd, cmdtest.Refusal{Args: []string{"a", "b"}, Err: "accepts at most 1 arg(s), received 2"})
}

// run runs `gpujob queue ARGS` against the test's Consul and nomad (nil:
// no Nomad, which apply and list never ask for).
func run(t *testing.T, nomad *nomadapi.Fake, args ...string) (string, string, error) {
	t.Helper()
	c := shared.Client(t)
	io, _, out, errOut := iostreams.Test()
	f := &factory.Factory{IO: io, Now: func() time.Time { return fixture.Epoch },
		Consul: func() (*consul.Client, error) { return c, nil },
		Nomad: func() (nomadapi.API, error) {
			if nomad == nil {
				t.Fatal("the command asked for Nomad")
			}
			return nomad, nil
		}}
	cmd := NewCmd(f)
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

func writeFile(t *testing.T, src string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "queues.hcl")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// cleanConfig removes the configuration when the test ends.
func cleanConfig(t *testing.T) {
	c := shared.Client(t)
	_, _ = c.KV().Delete(contract.QueueConfigKey, nil)
	t.Cleanup(func() { _, _ = c.KV().Delete(contract.QueueConfigKey, nil) })
}

const teams = `queue "default" {}

queue "team-a" {
  gpus   = 8
  weight = 2
  borrow = true
  cohort = "research"
}

queue "team-b" {
  gpus = 4
}
`

func TestApplyThenList(t *testing.T) {
	cleanConfig(t)
	out, _, err := run(t, nil, "list")
	if err != nil || !strings.Contains(out, "No queue file applied") || !strings.Contains(out, "default  none  1       off     50") {
		t.Fatalf("list before any apply: %v\n%s", err, out)
	}
	p := writeFile(t, teams)
	out, _, err = run(t, nil, "apply", "--no-controller", "--dry-run", p)
	if err != nil || !strings.Contains(out, "+ team-a  gpus 8, weight 2, borrow on, priority 50, cohort research") ||
		!strings.Contains(out, "1 queue(s) unchanged: default") || !strings.Contains(out, "dry run: nothing was written") {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if out, _, _ := run(t, nil, "list"); !strings.Contains(out, "No queue file applied") {
		t.Fatalf("the dry run applied:\n%s", out)
	}
	out, _, err = run(t, nil, "apply", "--no-controller", p)
	if err != nil || !strings.Contains(out, "applied (Consul index") {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	out, _, err = run(t, nil, "list")
	if err != nil || !strings.Contains(out, "Queues applied by ") || !strings.Contains(out, "from "+p) {
		t.Fatalf("list: %v\n%s", err, out)
	}
	for _, row := range []string{"QUEUE    GPUS  WEIGHT  BORROW  PRIORITY  COHORT", "team-a   8     2       on      50        research",
		"team-b   4     1       off     50        -"} {
		if !strings.Contains(out, row) {
			t.Errorf("list lacks %q:\n%s", row, out)
		}
	}
	out, _, err = run(t, nil, "list", "--json")
	var l queues.List
	if err != nil || json.Unmarshal([]byte(out), &l) != nil || len(l.Queues) != 3 || l.Applied == nil || l.Implicit ||
		l.Queues[1].Cohort != "research" || l.Applied.Index == 0 {
		t.Fatalf("list -json: %v\n%s", err, out)
	}

	// Change one, remove one, add one.
	p2 := writeFile(t, strings.Replace(strings.Replace(teams, "gpus   = 8", "gpus   = 4", 1), `queue "team-b" {`, `queue "team-c" {`, 1))
	out, _, err = run(t, nil, "apply", "--no-controller", "--json", p2)
	var res queues.ApplyResult
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || !res.Written || len(res.Changes) != 3 {
		t.Fatalf("apply -json: %v\n%s", err, out)
	}
	if c := res.Changes[0]; c.Queue != "team-a" || c.Action != queues.Changed || c.Fields[0] != (queues.FieldChange{Field: "gpus", From: "8", To: "4"}) {
		t.Errorf("change %+v", c)
	}
	if res.Changes[1].Action != queues.Added || res.Changes[2].Queue != "team-b" || res.Changes[2].Action != queues.Removed {
		t.Errorf("changes %+v", res.Changes)
	}
	if out, _, err := run(t, nil, "apply", "--no-controller", p2); err != nil || !strings.Contains(out, "no change: nothing was written") {
		t.Fatalf("apply again: %v\n%s", err, out)
	}
}

// A bad file is refused with its file:line and nothing is written.
func TestApplyRefusesABadFile(t *testing.T) {
	cleanConfig(t)
	p := writeFile(t, "queue \"a\" {\n  gpus = 2\n}\n\nqueue \"b\" {\n  weight = -1\n}\n")
	_, errOut, err := run(t, nil, "apply", "--no-controller", p)
	var exit *cmdutil.ExitError
	if !errors.As(err, &exit) || exit.Code != 1 || !strings.Contains(err.Error(), "nothing was applied") {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(errOut, p+":6:12: error: Invalid weight: weight = -1; want more than 0") || !strings.Contains(errOut, "  weight = -1") {
		t.Errorf("stderr:\n%s", errOut)
	}
	if kv, _, _ := shared.Client(t).KV().Get(contract.QueueConfigKey, nil); kv != nil {
		t.Errorf("stored %s", kv.Value)
	}
	if _, _, err := run(t, nil, "apply", "--no-controller", filepath.Join(t.TempDir(), "none.hcl")); err == nil || !strings.Contains(err.Error(), "nothing was applied") {
		t.Errorf("missing file: %v", err)
	}
}

// Status puts each job's GPUs in its queue, from the cluster's inventory.
func TestStatus(t *testing.T) {
	cleanConfig(t)
	if _, _, err := run(t, nil, "apply", "--no-controller", writeFile(t, teams)); err != nil {
		t.Fatal(err)
	}
	f := nomadapi.NewFake()
	node := fixture.Node("n1", "gpu-1", "Tesla T4", 16384, true, fixture.GPU{ID: "g0", Healthy: true}, fixture.GPU{ID: "g1", Healthy: true},
		fixture.GPU{ID: "g2", Healthy: true}, fixture.GPU{ID: "g3", Healthy: true})
	f.SetNode(node)
	a := fixture.TrainJob("bert-a", 2, 1)
	a.Meta[contract.MetaQueue] = "team-a"
	plain := fixture.TrainJob("plain", 1, 1)
	f.SetJob(a)
	f.SetJob(plain)
	f.SetAlloc(fixture.Alloc(a, "a0", 0, node, "running", []string{"g0"}))
	f.SetAlloc(fixture.Alloc(a, "a1", 1, node, "running", []string{"g1"}))
	f.SetAlloc(fixture.Alloc(plain, "p0", 0, node, "running", []string{"g2"}))
	out, _, err := run(t, f, "status")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Cluster: 4 GPUs (4 healthy), 3 in use, 1 free",
		"QUEUE    QUOTA  USED  JOBS  WAITING  WEIGHT  BORROW  PRIORITY  COHORT",
		"default  none   1     1     0        1       off     50        -",
		"team-a   8      2     1     0        2       on      50        research",
		"team-b   4      0     0     0        1       off     50        -"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	out, _, err = run(t, f, "status", "team-a")
	if err != nil || !strings.Contains(out, "Jobs of queue team-a holding GPUs:") || !strings.Contains(out, "bert-a  default    train  2") ||
		strings.Contains(out, "team-b") {
		t.Fatalf("status team-a: %v\n%s", err, out)
	}
	out, _, err = run(t, f, "status", "team-a", "--json")
	var st queues.Status
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || len(st.Queues) != 1 || st.Queues[0].UsedGPUs != 2 ||
		st.Queues[0].GPUs != 8 || st.Queues[0].Jobs[0].JobID != "bert-a" {
		t.Fatalf("status -json: %v\n%s", err, out)
	}
	if _, _, err := run(t, f, "status", "team-z"); err == nil || !strings.Contains(err.Error(), `unknown queue "team-z" (queues: default, team-a, team-b)`) {
		t.Errorf("unknown queue: %v", err)
	}
	// Nomad's jobs list is read with the meta, where the queue is.
	f.Fail("Jobs", &api.UnexpectedResponseError{})
	if _, _, err := run(t, f, "status"); err == nil {
		t.Error("status without the jobs list succeeded")
	}
}

func TestControllerOptions(t *testing.T) {
	t.Setenv("NOMAD_ALLOC_ID", "alloc-1234")
	cmdtest.CheckOptions(t, NewControllerCmd, []cmdtest.Case[ControllerOptions]{
		{Args: []string{}, Want: ControllerOptions{ID: "alloc-1234"}},
		{Args: []string{"--id", "ctl-a", "--resync", "5s"}, Want: ControllerOptions{ID: "ctl-a", Resync: 5 * time.Second}},
	})
	cmdtest.CheckRefusals(t, NewControllerCmd, cmdtest.Refusal{Args: []string{"x"}, Err: `unknown command "x"`})
	cmdtest.CheckOptions(t, NewApplyCmd, []cmdtest.Case[ApplyOptions]{
		{Args: []string{"q.hcl"}, Want: ApplyOptions{Path: "q.hcl"}},
		{Args: []string{"--no-controller", "q.hcl"}, Want: ApplyOptions{Path: "q.hcl", NoController: true}},
		{Args: []string{"--controller-binary", "/opt/gpujob", "--controller-user", "ops", "--controllers", "2", "q.hcl"},
			Want: ApplyOptions{Path: "q.hcl", ControllerBinary: "/opt/gpujob", ControllerUser: "ops", Controllers: 2}},
	})
}

// controllerFake is a Nomad whose ParseHCL takes the controller's rendered
// job and checks it is that.
func controllerFake(t *testing.T) *nomadapi.Fake {
	f := nomadapi.NewFake()
	f.ParseHCLFunc = func(src, vars string) (*api.Job, error) {
		if !strings.Contains(src, `job "gpujob-queue-controller"`) || !strings.Contains(src, `"queue", "controller"`) {
			t.Errorf("ParseHCL got something other than the queue controller's job:\n%s", src)
		}
		id, typ := "gpujob-queue-controller", "service"
		return &api.Job{ID: &id, Name: &id, Type: &typ, Meta: map[string]string{"src": src}}, nil
	}
	return f
}

// Apply registers the admission controller's job when it does not run,
// leaves a running one alone, registers a stopped or dead one again, and
// with --no-controller does not ask Nomad.
func TestApplyRegistersTheController(t *testing.T) {
	cleanConfig(t)
	t.Setenv("NOMAD_ADDR", "http://127.0.0.1:4646")
	t.Setenv("CONSUL_HTTP_ADDR", "127.0.0.1:8500")
	t.Setenv("NOMAD_CACERT", "")
	t.Setenv("CONSUL_CACERT", "")
	t.Setenv("CONSUL_HTTP_SSL", "")
	p := writeFile(t, teams)
	f := controllerFake(t)
	out, _, err := run(t, f, "apply", "--controller-binary", "/opt/gpujob/bin/gpujob", p)
	if err != nil || !strings.Contains(out, "queue controller: registered job gpujob-queue-controller") || !strings.Contains(out, "as nobody") {
		t.Fatalf("first apply: %v\n%s", err, out)
	}
	job, err := f.Job("gpujob-queue-controller")
	if err != nil {
		t.Fatal(err)
	}
	src := job.Meta["src"]
	for _, want := range []string{`command = "/opt/gpujob/bin/gpujob"`, `NOMAD_ADDR`, `"http://127.0.0.1:4646"`, `CONSUL_HTTP_ADDR`, `user         = "nobody"`} {
		if !strings.Contains(src, want) {
			t.Errorf("the registered job lacks %q:\n%s", want, src)
		}
	}
	if strings.Contains(src, render.EnvQueueControllerSecrets) {
		t.Errorf("without ACLs or TLS the controller reads no variable:\n%s", src)
	}

	// Running: left alone.
	running := "running"
	job.Status = &running
	f.SetJob(job)
	f.ParseHCLFunc = func(string, string) (*api.Job, error) {
		t.Error("a running controller was registered again")
		return nil, errors.New("no")
	}
	out, _, err = run(t, f, "apply", p)
	if err != nil || !strings.Contains(out, "queue controller: job gpujob-queue-controller runs (running)") {
		t.Fatalf("apply with the controller running: %v\n%s", err, out)
	}

	// Stopped: registered again, with ACLs from the variable as its own
	// user, with a warning while the variable is missing.
	stop := true
	job.Stop = &stop
	f.SetJob(job)
	f2 := controllerFake(t)
	f2.SetJob(job)
	f2.SetACLEnabled(true)
	out, errOut, err := run(t, f2, "apply", "--controller-binary", "/opt/gpujob/bin/gpujob", p)
	if err != nil || !strings.Contains(out, "registered job gpujob-queue-controller") || !strings.Contains(out, "as gpujob-queue") ||
		!strings.Contains(out, "warning: queue controller: no variable nomad/jobs/gpujob-queue-controller") {
		t.Fatalf("apply with the controller stopped, ACLs on: %v\n%s\n%s", err, out, errOut)
	}
	job, _ = f2.Job("gpujob-queue-controller")
	if src := job.Meta["src"]; !strings.Contains(src, `GPUJOB_QUEUE_CONTROLLER_SECRETS = "nomad/jobs/gpujob-queue-controller"`) ||
		strings.Contains(src, `"http://127.0.0.1:4646"`) {
		t.Errorf("with ACLs the controller reads its variable and reaches Nomad through its socket:\n%s", src)
	}

	// A Nomad that fails: the queues are applied, the error says so.
	f3 := controllerFake(t)
	f3.Fail("Register", errors.New("permission denied"))
	_, _, err = run(t, f3, "apply", p)
	if err == nil || !strings.Contains(err.Error(), "the queues were applied, but the admission controller's job could not be registered") {
		t.Errorf("a failed registration: %v", err)
	}
	// --no-controller: Nomad is never asked (run fails the test if it is).
	if _, _, err := run(t, nil, "apply", "--no-controller", p); err != nil {
		t.Error(err)
	}
}
