package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// trainArgs are the workload's defaults (640 steps: 10-20 s a run here), at
// which the 1- and 4-worker models are measured to agree, plus denser logs.
var trainArgs = []string{"--log-every", "8"}

// trainJob parses jobspecs/bert-finetune.nomad.hcl with the agent's own HCL2
// parser and the given variables, under the job ID id.
func (c *cluster) trainJob(t *testing.T, id string, workers, gpus int, extra []string, vars ...string) *api.Job {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(c.repo, "jobspecs", "bert-finetune.nomad.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	args, _ := json.Marshal(append(append([]string{}, trainArgs...), extra...))
	v := fmt.Sprintf("workers = %d\ngpus_per_worker = %d\nworkload = %q\nargs = %s\n%s\n",
		workers, gpus, c.workload(), args, strings.Join(vars, "\n"))
	job, err := c.nomad.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: string(src), Variables: v, Canonicalize: true})
	if err != nil {
		t.Fatalf("parsing the training jobspec: %v", err)
	}
	job.ID, job.Name = &id, &id
	t.Cleanup(func() { os.RemoveAll(c.checkpointDir(id)) })
	return job
}

// workload is the training script as the cluster's tasks see it: dev-up's
// copy, which the tasks' user (nobody) can read wherever the checkout is.
func (c *cluster) workload() string {
	if dir := c.env["GPUJOB_DEV_WORKLOADS"]; dir != "" {
		return filepath.Join(dir, "bert_finetune.py")
	}
	return filepath.Join(c.repo, "jobspecs", "workloads", "bert_finetune.py")
}

func (c *cluster) checkpointDir(job string) string {
	return filepath.Join(c.dir, "checkpoints", "default", job)
}

// result is the workload's final line.
type result struct {
	Accuracy        float64 `json:"accuracy"`
	F1              float64 `json:"f1"`
	WallSeconds     float64 `json:"wall_seconds"`
	Steps           int     `json:"steps"`
	WorldSize       int     `json:"world_size"`
	ResumedFromStep int     `json:"resumed_from_step"`
	RestartCount    int     `json:"restart_count"`
	SamplesPerSec   float64 `json:"samples_per_sec"`
}

// runTraining registers job, waits for every allocation to complete, and
// returns the result line and every member's stdout.
func (c *cluster) runTraining(t *testing.T, job *api.Job, timeout time.Duration) (result, []string, []*api.AllocationListStub) {
	t.Helper()
	c.register(t, job)
	allocs := c.waitAllocs(t, ctx(t, timeout), *job.ID, "training to end",
		func(as []*api.AllocationListStub) bool {
			return len(as) == *job.TaskGroups[0].Count && allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed)(as)
		})
	var logs []string
	var res result
	found := false
	for _, a := range allocs {
		out := c.taskLog(t, a.ID, "train", "stdout")
		if a.ClientStatus != api.AllocClientStatusComplete {
			t.Fatalf("allocation %s ended %s; stderr:\n%s\n%s", a.Name, a.ClientStatus, c.taskLog(t, a.ID, "train", "stderr"),
				c.taskEvents(t, []*api.AllocationListStub{a}))
		}
		logs = append(logs, out)
		if strings.Contains(out, "gpujob-result: ") {
			res, found = parseResult(t, out), true
		}
	}
	if !found {
		t.Fatalf("no member printed a result line")
	}
	return res, logs, allocs
}

// parseResult decodes the workload's last "gpujob-result: {...}" line.
func parseResult(t *testing.T, out string) result {
	t.Helper()
	i := strings.LastIndex(out, "gpujob-result: ")
	line := strings.SplitN(out[i+len("gpujob-result: "):], "\n", 2)[0]
	var res result
	if err := json.Unmarshal([]byte(line), &res); err != nil {
		t.Fatalf("result line %q: %v", line, err)
	}
	return res
}

var lossLine = regexp.MustCompile(`gpujob: step=(\d+) .*?rank=(\d+) loss=([0-9.]+)`)

// lossSpread is the largest difference between two ranks' losses at one step.
func lossSpread(logs []string) (spread float64, steps, ranks int) {
	byStep := map[int]map[int]float64{}
	rankSet := map[int]bool{}
	for _, l := range logs {
		for _, m := range lossLine.FindAllStringSubmatch(l, -1) {
			step, _ := strconv.Atoi(m[1])
			rank, _ := strconv.Atoi(m[2])
			loss, _ := strconv.ParseFloat(m[3], 64)
			if byStep[step] == nil {
				byStep[step] = map[int]float64{}
			}
			byStep[step][rank] = loss
			rankSet[rank] = true
		}
	}
	for _, losses := range byStep {
		lo, hi := 1e9, -1e9
		for _, v := range losses {
			lo, hi = min(lo, v), max(hi, v)
		}
		spread = max(spread, hi-lo)
	}
	return spread, len(byStep), len(rankSet)
}

func TestTrainingScalesAcrossWorkersWithTheSameModel(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	results := map[int]result{}
	for _, workers := range []int{1, 2, 4} {
		job := c.trainJob(t, fmt.Sprintf("e2e-train-%d", workers), workers, 1, nil)
		res, logs, _ := c.runTraining(t, job, 5*time.Minute)
		results[workers] = res
		if res.WorldSize != workers || res.RestartCount != 0 {
			t.Errorf("%d workers: result %+v", workers, res)
		}
		spread, steps, ranks := lossSpread(logs)
		if ranks != workers || steps < 3 {
			t.Errorf("%d workers: loss lines from %d ranks over %d steps", workers, ranks, steps)
		}
		if spread > 0.05 {
			t.Errorf("%d workers: per-step loss differs across ranks by %.4f (> 0.05)", workers, spread)
		}
		t.Logf("%d workers: accuracy %.4f F1 %.4f, %.1fs wall, loss spread %.4f over %d steps",
			workers, res.Accuracy, res.F1, res.WallSeconds, spread, steps)
	}
	for _, w := range []int{2, 4} {
		if d := results[w].Accuracy - results[1].Accuracy; d > 0.005 || d < -0.005 {
			t.Errorf("%d-worker accuracy %.4f is %.2f points from the 1-worker %.4f (bar: 0.5)",
				w, results[w].Accuracy, d*100, results[1].Accuracy)
		}
	}
}

// waitCheckpoint waits for the run's first checkpoint file.
func (c *cluster) waitCheckpoint(job string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if len(c.checkpoints(job)) > 0 {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("no checkpoint in %s after %s", c.checkpointDir(job), timeout)
}

// taskEvents joins the messages of every allocation's train task events.
func (c *cluster) taskEvents(t *testing.T, allocs []*api.AllocationListStub) string {
	var out []string
	for _, a := range allocs {
		alloc, _, err := c.nomad.Allocations().Info(a.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range alloc.TaskStates["train"].Events {
			out = append(out, fmt.Sprintf("%s %s: %s", a.Name, e.Type, e.DisplayMessage))
		}
	}
	return strings.Join(out, "\n")
}

func TestUnplaceableMemberTimesOutCleanly(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	// Two members of 3 GPUs each on a node of 4: only one can be placed.
	job := c.trainJob(t, "e2e-unplaced", 2, 3, nil, `join_timeout = "8s"`)
	c.register(t, job)
	// Once the placed member fails, its GPUs are free and Nomad places the
	// other (which would wait for a partner in turn): the first failure is
	// the test's, and the job is stopped then.
	var placed *api.AllocationListStub
	allocs := c.waitAllocs(t, ctx(t, 2*time.Minute), *job.ID, "the placed member to fail",
		func(as []*api.AllocationListStub) bool {
			for _, a := range as {
				if a.ClientStatus == api.AllocClientStatusFailed && (placed == nil || a.CreateIndex < placed.CreateIndex) {
					placed = a
				}
			}
			return placed != nil
		})
	if _, _, err := c.nomad.Jobs().Deregister(*job.ID, false, nil); err != nil {
		t.Fatal(err)
	}
	if placed.ClientStatus != api.AllocClientStatusFailed {
		t.Fatalf("allocations: %s; want the placed one failed", describeAllocs(allocs))
	}
	c.waitAllocs(t, ctx(t, time.Minute), *job.ID, "every member to stop",
		allIn(api.AllocClientStatusFailed, api.AllocClientStatusComplete))
	events := c.taskEvents(t, []*api.AllocationListStub{placed})
	missing := "e2e-unplaced.train[1]"
	if placed.Name == missing {
		missing = "e2e-unplaced.train[0]"
	}
	if !strings.Contains(events, "never joined: "+missing) {
		t.Errorf("the failure does not name the member that was never placed (%s):\n%s", missing, events)
	}

	// Nothing left behind: no rendezvous keys or sessions, no processes.
	c.assertNoLeaks(t, "e2e-unplaced", placed.ID)
}
