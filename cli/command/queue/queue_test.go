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
	out, _, err = run(t, nil, "apply", "--dry-run", p)
	if err != nil || !strings.Contains(out, "+ team-a  gpus 8, weight 2, borrow on, priority 50, cohort research") ||
		!strings.Contains(out, "1 queue(s) unchanged: default") || !strings.Contains(out, "dry run: nothing was written") {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if out, _, _ := run(t, nil, "list"); !strings.Contains(out, "No queue file applied") {
		t.Fatalf("the dry run applied:\n%s", out)
	}
	out, _, err = run(t, nil, "apply", p)
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
	out, _, err = run(t, nil, "apply", "--json", p2)
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
	if out, _, err := run(t, nil, "apply", p2); err != nil || !strings.Contains(out, "no change: nothing was written") {
		t.Fatalf("apply again: %v\n%s", err, out)
	}
}

// A bad file is refused with its file:line and nothing is written.
func TestApplyRefusesABadFile(t *testing.T) {
	cleanConfig(t)
	p := writeFile(t, "queue \"a\" {\n  gpus = 2\n}\n\nqueue \"b\" {\n  weight = -1\n}\n")
	_, errOut, err := run(t, nil, "apply", p)
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
	if _, _, err := run(t, nil, "apply", filepath.Join(t.TempDir(), "none.hcl")); err == nil || !strings.Contains(err.Error(), "nothing was applied") {
		t.Errorf("missing file: %v", err)
	}
}

// Status puts each job's GPUs in its queue, from the cluster's inventory.
func TestStatus(t *testing.T) {
	cleanConfig(t)
	if _, _, err := run(t, nil, "apply", writeFile(t, teams)); err != nil {
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
