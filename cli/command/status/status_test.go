package status

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs/fixture"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/taskevent"
)

func execute(t *testing.T, f *nomadapi.Fake, args ...string) (string, string, error) {
	t.Helper()
	return fixture.Execute(NewCmd, f, args...)
}

const (
	gpuA = "GPU-aaaaaaaa-1111-2222-3333-444455556666"
	gpuB = "GPU-bbbbbbbb-1111-2222-3333-444455556666"
)

// twoWorkers: bert, 2 workers × 1 GPU, one group restart, rank 0 done with
// a result; train[1]'s first allocation failed and was replaced.
func twoWorkers(t *testing.T) *nomadapi.Fake {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("bert", 2, 1)
	f.SetJob(job)
	n1 := fixture.Node("n1-id", "node-1", "Tesla T4", 15360, true)
	n2 := fixture.Node("n2-id", "node-2", "Tesla T4", 15360, true)
	round1 := fixture.Joined(1, 0, 2, 0, 0, 2, "127.0.0.1:40469")
	ended := fixture.Then(round1, taskevent.Restarting)
	ended.Remote, ended.Failure = true, taskevent.Failure{Member: "bert.train[1]", Reason: "rank 1 exited 137", ExitCode: 137}
	round2 := fixture.After(fixture.Joined(2, 0, 2, 0, 0, 2, "127.0.0.1:40470"), 2, 1)
	f.SetAlloc(fixture.Alloc(job, "b0000000-old", 1, n2, "failed", []string{gpuB}, fixture.Joined(1, 1, 2, 1, 1, 2, "127.0.0.1:40469")))
	f.SetAlloc(fixture.Alloc(job, "a0000000-0000", 0, n1, "complete", []string{gpuA},
		round1, ended, round2, fixture.Then(round2, taskevent.Succeeded)))
	// the replacement saw no failure itself: its round says one restart was used
	f.SetAlloc(fixture.Alloc(job, "b1111111-new", 1, n2, "running", []string{gpuB},
		fixture.After(fixture.Joined(2, 1, 2, 1, 1, 2, "127.0.0.1:40470"), 2, 1)))
	f.SetLog("a0000000-0000", "train", "stdout",
		"gpujob: step=10 epoch=0 rank=0 loss=0.9000 global_loss=0.9 samples_per_sec=100\n",
		"gpujob: step=20 epoch=0 rank=0 loss=0.6931 global_loss=0.69 samples_per_sec=120\n",
		`gpujob-result: {"accuracy": 0.94, "f1": 0.9312, "wall_seconds": 12.34, "restart_count": 1}`+"\n")
	f.SetLog("b1111111-new", "train", "stdout",
		"gpujob: step=20 epoch=0 rank=1 loss=0.70",
		"12 global_loss=0.69\n")
	return f
}

func TestStatusTable(t *testing.T) {
	out, _, err := execute(t, twoWorkers(t), "bert")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Job bert: running (version 0, 2 worker(s) × 1 GPU(s)): 1 running, 1 complete, 1 group restart(s)",
		"Result: accuracy 0.9400, F1 0.9312, wall 12.3s, resumed after 1 restart(s)",
		"ALLOC", "NODE RANK",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(out, "\n")
	row := func(prefix string) []string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return strings.Fields(l)
			}
		}
		t.Fatalf("no row %q in\n%s", prefix, out)
		return nil
	}
	// ALLOC NAME NODE GPUS… NODE-RANK RANKS ROUND RESTARTS STATE LOSS (step N)
	r0 := strings.Join(row("a0000000"), " ")
	if want := "a0000000 bert.train[0] node-1 Tesla T4 ×1 (GPU-aaaaaaaa) 0 0 2 1 complete 0.6931 (step 20)"; r0 != want {
		t.Errorf("row 0 = %q\n want %q", r0, want)
	}
	r1 := strings.Join(row("b1111111"), " ")
	if want := "b1111111 bert.train[1] node-2 Tesla T4 ×1 (GPU-bbbbbbbb) 1 1 2 1 running 0.7012 (step 20)"; r1 != want {
		t.Errorf("row 1 = %q\n want %q", r1, want)
	}
	if strings.Contains(out, "b0000000") {
		t.Errorf("the replaced allocation is shown:\n%s", out)
	}
}

func TestStatusJSON(t *testing.T) {
	out, _, err := execute(t, twoWorkers(t), "bert", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if st.Job != "bert" || st.State != "running" || st.Workers != 2 || st.GPUsPerWorker != 1 || st.Restarts != 1 ||
		st.Counts.Running != 1 || st.Counts.Complete != 1 || st.NomadStatus != "running" {
		t.Errorf("summary: %+v", st)
	}
	if st.Result["accuracy"] != 0.94 || st.Result["f1"] != 0.9312 {
		t.Errorf("result: %v", st.Result)
	}
	if len(st.Members) != 2 {
		t.Fatalf("members: %+v", st.Members)
	}
	m := st.Members[1]
	if m.AllocID != "b1111111-new" || m.Node != "node-2" || m.NodeID != "n2-id" || *m.NodeRank != 1 ||
		len(m.Ranks) != 1 || m.Ranks[0] != 1 || m.Round != 2 || m.Restarts != 1 || m.State != "running" ||
		m.WorldSize != 2 || m.Master != "127.0.0.1:40470" {
		t.Errorf("member 1: %+v", m)
	}
	if len(m.GPUs) != 1 || m.GPUs[0].ID != gpuB || m.GPUs[0].Model != "Tesla T4" {
		t.Errorf("member 1 GPUs (full UUIDs): %+v", m.GPUs)
	}
	if m.Loss == nil || m.Loss.Loss != 0.7012 || m.Loss.Step != 20 || m.Loss.Rank != 1 {
		t.Errorf("member 1 loss: %+v", m.Loss)
	}
	// field names are the documented ones
	var raw map[string]any
	_ = json.Unmarshal([]byte(out), &raw)
	for _, k := range []string{"job", "namespace", "state", "nomad_status", "version", "workers", "gpus_per_worker", "counts", "restarts", "result", "members"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	mem := raw["members"].([]any)[0].(map[string]any)
	for _, k := range []string{"alloc_id", "name", "node_id", "node", "gpus", "node_rank", "ranks", "world_size", "round", "restarts",
		"state", "client_status", "desired_status", "loss", "losses", "last_event"} {
		if _, ok := mem[k]; !ok {
			t.Errorf("member JSON lacks %q", k)
		}
	}
}

func TestStatusMultiProcessAndPending(t *testing.T) {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("big", 2, 4)
	f.SetJob(job)
	n := fixture.Node("n1", "node-1", "Tesla T4", 15360, false)
	f.SetAlloc(fixture.Alloc(job, "m0", 0, n, "running", []string{"GPU-00000000-x", "GPU-11111111-x", "GPU-22222222-x", "GPU-33333333-x"},
		fixture.Joined(3, 0, 2, 0, 3, 8, "10.0.0.5:24001")))
	f.SetAlloc(fixture.Alloc(job, "m1", 1, n, "running", nil))
	f.UpdateAlloc("m1", func(a *api.Allocation) {
		a.TaskStates["train"].StartedAt = time.Time{}
		a.TaskStates["train"].Events = []*api.TaskEvent{fixture.PlainDriverEvent("waiting for 1 more member", fixture.Epoch)}
	})
	f.SetLog("m0", "train", "stdout",
		"[rank 1] gpujob: step=5 epoch=0 rank=1 loss=1.10\n",
		"[rank 0] gpujob: step=6 epoch=0 rank=0 loss=1.00\n",
		"[rank 3] gpujob: step=5 epoch=0 rank=3 loss=1.30\n")
	out, _, err := execute(t, f, "big", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	m0 := st.Members[0]
	if len(m0.Ranks) != 4 || m0.Ranks[3] != 3 || m0.Round != 3 || len(m0.GPUs) != 4 {
		t.Errorf("m0: %+v", m0)
	}
	if len(m0.Losses) != 3 || m0.Losses[0].Rank != 0 || m0.Losses[2].Rank != 3 || m0.Loss.Step != 6 || m0.Loss.Rank != 0 {
		t.Errorf("m0 losses: %+v latest %+v", m0.Losses, m0.Loss)
	}
	m1 := st.Members[1]
	if m1.NodeRank != nil || len(m1.Ranks) != 0 || m1.Loss != nil || m1.LastEvent != "waiting for 1 more member" {
		t.Errorf("m1: %+v", m1)
	}

	out, _, err = execute(t, f, "big")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Tesla T4 ×4 (GPU-00000000,GPU-11111111,GPU-22222222,GPU-33333333)", "0-3",
		"1.0000 (step 6)", "Notes:", "big.train[1] (m1): waiting for the group's rendezvous (waiting for 1 more member)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestStatusFailedJoin(t *testing.T) {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("bert", 2, 1)
	f.SetJob(job)
	msg := "rendezvous default/bert round 1: join timed out after 5m0s: 1 of 2 members joined [bert.train[0]]; never joined: bert.train[1]"
	f.SetAlloc(fixture.Alloc(job, "a0", 0, nil, "failed", nil,
		taskevent.Event{Kind: taskevent.Failed, MaxRestarts: 3, Failure: taskevent.Failure{Member: "bert.train[0]", Reason: msg}}))
	f.SetAlloc(fixture.Alloc(job, "a1", 1, nil, "pending", nil))
	out, _, err := execute(t, f, "bert")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Job bert: pending", "1 pending, 1 failed", "bert.train[0] (a0): " + msg} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestStatusErrors(t *testing.T) {
	f := nomadapi.NewFake()
	if _, _, err := execute(t, f, "nope"); err == nil || err.Error() != `job "nope" not found` {
		t.Errorf("missing job: %v", err)
	}
	f.Fail("Job", errors.New("reading job x: Nomad at http://127.0.0.1:4646 refused the request: check NOMAD_TOKEN"))
	if _, _, err := execute(t, f, "x"); err == nil || !strings.Contains(err.Error(), "check NOMAD_TOKEN") {
		t.Errorf("agent error not passed through: %v", err)
	}
	f = nomadapi.NewFake()
	job := fixture.TrainJob("empty", 2, 1)
	f.SetJob(job)
	out, _, err := execute(t, f, "empty")
	if err != nil || !strings.Contains(out, "No allocations yet") {
		t.Errorf("queued job: %v\n%s", err, out)
	}
}

func TestStatusAllocationCollected(t *testing.T) {
	f := twoWorkers(t)
	f.Fail("Allocation", errors.New("reading allocation x: Unexpected response code: 404 (alloc not found)"))
	out, _, err := execute(t, f, "bert", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 2 || st.Members[1].Round != 2 || st.Members[1].Loss != nil {
		t.Errorf("members from the list alone: %+v", st.Members)
	}
}

// A member Nomad has not placed has no allocation to show: status counts it
// and says why, from a plan, in submit's words, naming who holds the GPU.
func TestStatusExplainsUnplacedMembers(t *testing.T) {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("bert", 4, 1)
	f.SetJob(job)
	gpus := []string{gpuA, gpuB, "GPU-cccccccc-1111-2222-3333-444455556666", "GPU-dddddddd-1111-2222-3333-444455556666"}
	var devs []fixture.GPU
	for _, id := range gpus {
		devs = append(devs, fixture.GPU{ID: id, Healthy: true})
	}
	n1 := fixture.Node("n1-id", "node-1", "Tesla T4", 15360, true, devs...)
	f.SetNode(n1)
	for i := 0; i < 3; i++ {
		f.SetAlloc(fixture.Alloc(job, fmt.Sprintf("a%d000000-0000", i), i, n1, "running", []string{gpus[i]}))
	}
	// A trial left behind holds the fourth GPU.
	other := fixture.TrainJob("sweep-trial-007", 1, 1)
	f.SetJob(other)
	f.SetAlloc(fixture.Alloc(other, "e0000000-0000", 0, n1, "running", []string{gpus[3]}))
	f.PlanFunc = func(j *api.Job) (*api.JobPlanResponse, error) {
		if *j.ID != "bert" {
			t.Errorf("planned job %s, want bert", *j.ID)
		}
		return &api.JobPlanResponse{FailedTGAllocs: map[string]*api.AllocationMetric{
			"train": {NodesEvaluated: 1, NodesInPool: 1, DimensionExhausted: map[string]int{"devices: no devices match request": 1}},
		}}, nil
	}
	out, _, err := execute(t, f, "bert")
	if err != nil {
		t.Fatal(err)
	}
	want := "1 member(s) not placed: needs 4 × 1 nvidia/gpu (4 GPUs); 3 of 4 could be placed now, 1 cannot; " +
		"node node-1 has 0 of 4 free, 1 held by job sweep-trial-007, 3 held by job bert"
	if !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	js, _, err := execute(t, f, "bert", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatal(err)
	}
	if st.Unplaced != 1 || !strings.Contains(st.Waiting, "1 held by job sweep-trial-007") {
		t.Errorf("json unplaced %d, waiting %q", st.Unplaced, st.Waiting)
	}

	// Every member placed: nothing is planned, nothing said.
	f.SetAlloc(fixture.Alloc(job, "a3000000-0000", 3, n1, "running", nil))
	f.PlanFunc = func(*api.Job) (*api.JobPlanResponse, error) {
		t.Error("planned a job whose members are all placed")
		return &api.JobPlanResponse{}, nil
	}
	if out, _, err := execute(t, f, "bert"); err != nil || strings.Contains(out, "not placed") {
		t.Errorf("all placed: %v\n%s", err, out)
	}
}
