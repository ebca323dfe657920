package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// sweepDoc is the part of `gpujob sweep status -json` the tests read.
type sweepDoc struct {
	Sweep      string         `json:"sweep"`
	Status     string         `json:"status"`
	Reason     string         `json:"reason"`
	MaxTrials  int            `json:"max_trials"`
	Counts     map[string]int `json:"counts"`
	Best       *sweepTrialDoc `json:"best"`
	Controller struct {
		Job    string `json:"job"`
		Status string `json:"status"`
		Starts int    `json:"starts"`
	} `json:"controller"`
	Trials []sweepTrialDoc `json:"trials"`
}

type sweepTrialDoc struct {
	ID        string         `json:"id"`
	Job       string         `json:"job"`
	State     string         `json:"state"`
	Params    map[string]any `json:"params"`
	Step      int            `json:"step"`
	Value     *float64       `json:"value"`
	StoppedBy string         `json:"stopped_by"`
	Reason    string         `json:"reason"`
	Waiting   string         `json:"waiting"`
}

// sweepSpec writes the test spec file with its sweep renamed to name.
func (c *cluster) sweepSpec(t *testing.T, file, name string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(c.repo, "e2e", "testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	renamed := regexp.MustCompile(`(?m)^sweep "[^"]*"`).ReplaceAllString(string(src), fmt.Sprintf("sweep %q", name))
	path := filepath.Join(t.TempDir(), file)
	if err := os.WriteFile(path, []byte(renamed), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// sweepCLI runs gpujob with the cluster's addresses and its controller
// binary (dev-up's copy, which the user nobody can run).
func (c *cluster) sweepCLI(t *testing.T, timeout time.Duration, args ...string) (string, string, int) {
	t.Helper()
	env := append(os.Environ(), "NOMAD_ADDR="+c.env["NOMAD_ADDR"], "CONSUL_HTTP_ADDR="+c.env["CONSUL_HTTP_ADDR"],
		"GPUJOB_CONTROLLER_BINARY="+c.env["GPUJOB_CONTROLLER_BINARY"])
	return c.gpujobEnv(t, env, timeout, args...)
}

func (c *cluster) sweepStatus(t *testing.T, name string) sweepDoc {
	t.Helper()
	out, errOut, code := c.sweepCLI(t, time.Minute, "sweep", "status", "-json", name)
	if code != 0 {
		t.Fatalf("sweep status exited %d: %s%s", code, out, errOut)
	}
	var d sweepDoc
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("sweep status -json: %v\n%s", err, out)
	}
	return d
}

// purgeSweep removes the sweep with the CLI and fails t if anything of it
// is left: a job, a process of one of its allocations, a Consul key or
// session.
func (c *cluster) purgeSweep(t *testing.T, name string) {
	t.Helper()
	var allocs []string
	jobs, _, _ := c.nomad.Jobs().PrefixList(name + "-")
	for _, j := range jobs {
		as, _ := c.allocsOf(j.ID)
		for _, a := range as {
			allocs = append(allocs, a.ID)
		}
	}
	out, errOut, code := c.sweepCLI(t, 3*time.Minute, "sweep", "stop", "--purge", name)
	if code != 0 {
		t.Fatalf("sweep stop --purge exited %d: %s%s", code, out, errOut)
	}
	if left, _, _ := c.nomad.Jobs().PrefixList(name + "-"); len(left) > 0 {
		var ids []string
		for _, j := range left {
			ids = append(ids, j.ID)
		}
		t.Errorf("jobs left after sweep stop --purge: %v", ids)
	}
	c.assertNoLeaks(t, name, allocs...)
}

// waitSweep waits until the sweep's status satisfies ok.
func (c *cluster) waitSweep(t *testing.T, name string, limit time.Duration, what string, ok func(sweepDoc) bool) sweepDoc {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		d := c.sweepStatus(t, name)
		if ok(d) {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("sweep %s: no %s within %s; last status: %+v", name, what, limit, d)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// bertTrialArgs make a BERT trial of a few seconds: 64 steps, an
// evaluation (a metric line) every 16.
func bertTrialArgs(extra ...string) string {
	args := append([]string{"--steps", "64", "--train-size", "1024", "--eval-size", "400", "--log-every", "16"}, extra...)
	b, _ := json.Marshal(args)
	return "args=" + string(b)
}

// Scenario 1: a grid sweep of the BERT workload runs to the end; best is
// the maximum of the table; the results outlive Nomad's garbage collection.
func TestSweepGrid(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	const name = "e2e-sweep-grid"
	t.Cleanup(func() { c.purgeSweep(t, name) })
	spec := c.sweepSpec(t, "sweep-bert.hcl", name)

	start := time.Now()
	out, errOut, code := c.sweepCLI(t, 6*time.Minute, "sweep", "submit", "-var", c.workloadVar(), "-var", bertTrialArgs(), spec)
	if code != 0 {
		t.Fatalf("sweep submit exited %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	t.Logf("4 trials, 2 at a time, in %s", time.Since(start).Round(time.Second))
	for _, want := range []string{"submitted sweep " + name, "trials 4/4", "sweep " + name + " completed", "best: trial-"} {
		if !strings.Contains(out, want) {
			t.Errorf("submit's output lacks %q:\n%s", want, out)
		}
	}

	d := c.sweepStatus(t, name)
	checkGrid := func(d sweepDoc) {
		t.Helper()
		if d.Status != "completed" || len(d.Trials) != 4 || d.Counts["completed"] != 4 {
			t.Fatalf("want 4 completed trials, got status %s, counts %v", d.Status, d.Counts)
		}
		seen := map[string]bool{}
		var best *sweepTrialDoc
		for i := range d.Trials {
			tr := &d.Trials[i]
			key := fmt.Sprint(tr.Params["lr"], "/", tr.Params["layers"])
			if seen[key] {
				t.Errorf("grid cell %s ran twice", key)
			}
			seen[key] = true
			if tr.Value == nil || tr.Step != 64 {
				t.Errorf("%s: value %v at step %d, want a value at step 64", tr.ID, tr.Value, tr.Step)
				continue
			}
			if best == nil || *tr.Value > *best.Value {
				best = tr
			}
		}
		if d.Best == nil || best == nil || d.Best.ID != best.ID || *d.Best.Value != *best.Value {
			t.Errorf("best %+v is not the table's maximum %+v", d.Best, best)
		}
	}
	checkGrid(d)

	// The trial jobs' records live in Consul, not in Nomad's job history.
	if err := c.nomad.System().GarbageCollect(); err != nil {
		t.Fatal(err)
	}
	c.waitJobsGone(t, name+"-trial-", time.Minute)
	after := c.sweepStatus(t, name)
	checkGrid(after)
	if after.Best.ID != d.Best.ID || *after.Best.Value != *d.Best.Value {
		t.Errorf("best changed after nomad system gc: %+v, before %+v", after.Best, d.Best)
	}
	best, errOut, code := c.sweepCLI(t, time.Minute, "sweep", "best", "--as-train", name)
	if code != 0 || !strings.Contains(best, `train "`+name+`-best"`) {
		t.Errorf("sweep best --as-train exited %d: %s%s", code, best, errOut)
	}
}

// waitJobsGone waits until no job has the ID prefix.
func (c *cluster) waitJobsGone(t *testing.T, prefix string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		jobs, _, err := c.nomad.Jobs().PrefixList(prefix)
		if err == nil && len(jobs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs %s* still there after %s: %d", prefix, limit, len(jobs))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Scenario 5: trials failing beyond max_failed_trials fail the sweep with
// the reason; stop --purge leaves nothing.
func TestSweepFailedTrials(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	const name = "e2e-sweep-fail"
	spec := c.sweepSpec(t, "sweep-bert.hcl", name)
	// --layers x: the workload refuses it (argparse, exit 2).
	out, errOut, code := c.sweepCLI(t, 4*time.Minute, "sweep", "submit", "-var", c.workloadVar(), "-var", bertTrialArgs(),
		"-var", `layers=["x","y","z"]`, "-var", "lrs=[0.001]", "-var", "max_trials=3", "-var", "parallel=1", "-var", "max_failed_trials=1", spec)
	if code != 1 {
		t.Fatalf("sweep submit exited %d, want 1 (the sweep failed)\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	d := c.sweepStatus(t, name)
	if d.Status != "failed" || !strings.Contains(d.Reason, "2 trials failed, more than max_failed_trials = 1") {
		t.Errorf("status %s (%s), want failed for 2 trials over max_failed_trials = 1", d.Status, d.Reason)
	}
	if d.Counts["failed"] != 2 || len(d.Trials) != 2 {
		t.Errorf("want exactly 2 trials, both failed (the third never proposed): %v", d.Counts)
	}
	for _, tr := range d.Trials {
		if tr.Reason == "" {
			t.Errorf("%s failed without a reason", tr.ID)
		}
	}
	if !strings.Contains(out, "sweep "+name+" failed") {
		t.Errorf("submit's output does not say the sweep failed:\n%s", out)
	}
	c.purgeSweep(t, name)
}

// Scenario 6: with 4 GPUs and parallel = 8, never more than 4 trials run;
// the rest wait, and status says why in plain words.
func TestSweepParallelAboveGPUs(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	const name = "e2e-sweep-wide"
	t.Cleanup(func() { c.purgeSweep(t, name) })
	spec := c.sweepSpec(t, "sweep-bert.hcl", name)
	out, errOut, code := c.sweepCLI(t, time.Minute, "sweep", "submit", "--detach", "-var", c.workloadVar(),
		"-var", bertTrialArgs("--sleep-per-step", "0.5"), "-var", "lrs=[0.001,0.002,0.003,0.004]",
		"-var", "max_trials=8", "-var", "parallel=8", spec)
	if code != 0 {
		t.Fatalf("sweep submit exited %d: %s%s", code, out, errOut)
	}
	// A trial just registered waits for "Nomad has not placed it yet"
	// until the scheduler has evaluated it; after that its reason must
	// name the GPUs. Each trial runs over 30 s, so the four waiting ones
	// wait long enough to be seen with their reasons.
	d := c.waitSweep(t, name, 2*time.Minute, "4 trials running and 4 waiting for GPUs", func(d sweepDoc) bool {
		waiting := 0
		for _, tr := range d.Trials {
			if tr.Waiting != "" && strings.Contains(tr.Waiting, "GPU") {
				waiting++
			}
		}
		return len(d.Trials) == 8 && waiting == 4
	})
	for _, tr := range d.Trials {
		if tr.Waiting != "" && !strings.Contains(tr.Waiting, "GPU") {
			t.Errorf("%s waits for %q, which does not name the GPUs", tr.ID, tr.Waiting)
		}
	}
	// The table says it too, while they wait (each trial runs over 30 s).
	text, _, _ := c.sweepCLI(t, time.Minute, "sweep", "status", name)
	if !strings.Contains(text, "waiting: needs 1 × 1 nvidia/gpu") {
		t.Errorf("sweep status does not say why trials wait:\n%s", text)
	}
	t.Logf("sweep status:\n%s", text)
	// Nomad never runs more than the 4 GPUs allow, while the sweep runs.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		running := 0
		allocs, _, err := c.nomad.Allocations().List(&api.QueryOptions{Prefix: ""})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range allocs {
			if strings.HasPrefix(a.JobID, name+"-trial-") && a.ClientStatus == "running" {
				running++
			}
		}
		if running > 4 {
			t.Fatalf("%d trials run at once on 4 GPUs", running)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// Scenario 3: the controller killed mid-sweep: a new one resumes within
// 30 s; the sweep runs exactly max_trials trials, none launched twice.
func TestSweepControllerKilled(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	const name = "e2e-sweep-ctl"
	t.Cleanup(func() { c.purgeSweep(t, name) })
	spec := c.sweepSpec(t, "sweep-bert.hcl", name)
	out, errOut, code := c.sweepCLI(t, time.Minute, "sweep", "submit", "--detach", "-var", c.workloadVar(),
		"-var", bertTrialArgs("--sleep-per-step", "0.08"), "-var", "lrs=[0.001,0.002,0.003]",
		"-var", "max_trials=6", "-var", "parallel=2", spec)
	if code != 0 {
		t.Fatalf("sweep submit exited %d: %s%s", code, out, errOut)
	}
	c.waitSweep(t, name, 2*time.Minute, "a completed trial", func(d sweepDoc) bool { return d.Counts["completed"] >= 1 })

	ctlJob := name + "-controller"
	allocs, err := c.allocsOf(ctlJob)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, a := range allocs {
		if a.ClientStatus != "running" {
			continue
		}
		for _, p := range processes(a.ID) {
			if strings.Contains(strings.Join(p.args, " "), "sweep controller") {
				pids = append(pids, p.pid)
			}
		}
	}
	if len(pids) != 1 {
		t.Fatalf("want the one controller process, found %v", pids)
	}
	killed := time.Now()
	if err := kill9(pids[0]); err != nil {
		t.Fatal(err)
	}
	d := c.waitSweep(t, name, 30*time.Second, "second controller", func(d sweepDoc) bool { return d.Controller.Starts >= 2 })
	t.Logf("a new controller took over %s after kill -9", time.Since(killed).Round(100*time.Millisecond))
	if d.Status != "running" {
		t.Errorf("after the takeover the sweep is %s (%s), want running", d.Status, d.Reason)
	}

	d = c.waitSweep(t, name, 3*time.Minute, "the end", func(d sweepDoc) bool { return d.Status != "running" })
	if d.Status != "completed" || len(d.Trials) != 6 || d.Counts["completed"] != 6 {
		t.Fatalf("want 6 completed trials, got %s (%s): %v", d.Status, d.Reason, d.Counts)
	}
	jobs, _, err := c.nomad.Jobs().PrefixList(name + "-trial-")
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 6 {
		t.Errorf("%d trial jobs, want 6", len(jobs))
	}
	for _, j := range jobs {
		// Registered create-only: a second launch would be refused, never
		// a new version of the job.
		job, _, err := c.nomad.Jobs().Info(j.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if *job.Version != 0 {
			t.Errorf("trial job %s is at version %d: launched more than once", j.ID, *job.Version)
		}
		as, _ := c.allocsOf(j.ID)
		if len(as) != 1 {
			t.Errorf("trial job %s has %d allocations, want 1", j.ID, len(as))
		}
	}
}

// Scenario 4: a trial's node lost: the trial resumes from its own
// checkpoint elsewhere; the sweep completes.
func TestSweepNodeLost(t *testing.T) {
	c := pairCluster(t)
	c.nodeGPUs(t, c.gpusPerClient())
	const name = "e2e-sweep-node"
	t.Cleanup(func() { c.purgeSweep(t, name) })
	spec := c.sweepSpec(t, "sweep-bert.hcl", name)
	// Two trials of 64 steps of 0.4 s, one per node (2 GPUs each), a
	// checkpoint and a metric line every 16 steps.
	out, errOut, code := c.sweepCLI(t, time.Minute, "sweep", "submit", "--detach", "-var", c.workloadVar(),
		"-var", bertTrialArgs("--sleep-per-step", "0.4"), "-var", "lrs=[0.002]",
		"-var", "max_trials=2", "-var", "parallel=2", spec)
	if code != 0 {
		t.Fatalf("sweep submit exited %d: %s%s", code, out, errOut)
	}
	d := c.waitSweep(t, name, 2*time.Minute, "a trial past its first checkpoint", func(d sweepDoc) bool {
		for _, tr := range d.Trials {
			if tr.State == "running" && tr.Step >= 16 {
				return true
			}
		}
		return false
	})
	var victim sweepTrialDoc
	for _, tr := range d.Trials {
		if tr.State == "running" && tr.Step >= 16 {
			victim = tr
			break
		}
	}
	allocs, err := c.allocsOf(victim.Job)
	if err != nil || len(allocs) != 1 {
		t.Fatalf("allocations of %s: %v, %v", victim.Job, allocs, err)
	}
	node := allocs[0].NodeName
	lost := time.Now()
	if err := c.loseMachineFor(t, c.clientOf(t, node)); err != nil {
		t.Fatal(err)
	}
	t.Logf("lost %s, which ran %s at step %d", node, victim.ID, victim.Step)

	d = c.waitSweep(t, name, 4*time.Minute, "the end", func(d sweepDoc) bool { return d.Status != "running" })
	if d.Status != "completed" || d.Counts["completed"] != 2 || len(d.Trials) != 2 {
		t.Fatalf("want both trials completed, got %s (%s): %+v", d.Status, d.Reason, d.Trials)
	}
	t.Logf("the sweep completed %s after the loss", time.Since(lost).Round(time.Second))
	allocs, _ = c.allocsOf(victim.Job)
	var replaced bool
	for _, a := range allocs {
		if a.NodeName != node && a.ClientStatus == "complete" {
			replaced = true
		}
	}
	if !replaced {
		t.Errorf("%s did not complete on another node: %s", victim.Job, describeAllocs(allocs))
	}
	// It resumed from its own checkpoint: its result says so.
	pair, _, err := c.consulClient(t).KV().Get("gpujob/sweeps/default/"+name+"/trials/"+victim.ID+"/metrics", nil)
	if err != nil || pair == nil {
		t.Fatalf("metrics of %s: %v", victim.ID, err)
	}
	var m struct {
		Points []struct {
			Step   int                `json:"step"`
			Values map[string]float64 `json:"values"`
			Final  bool               `json:"final"`
		} `json:"points"`
	}
	if err := json.Unmarshal(pair.Value, &m); err != nil || len(m.Points) == 0 {
		t.Fatalf("metrics of %s: %v %s", victim.ID, err, pair.Value)
	}
	last := m.Points[len(m.Points)-1]
	if !last.Final || last.Values["resumed_from_step"] < 16 {
		t.Errorf("%s's result does not say it resumed from a checkpoint at step >= 16: %+v", victim.ID, last)
	}
}

// Scenario 2: ASHA over 12 trials of a workload with a clearly bad region
// stops at least half early and finds the best, in at most 60 % of the
// trial-steps running every trial to the end would take.
func TestSweepASHA(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	const name = "e2e-sweep-asha"
	t.Cleanup(func() { c.purgeSweep(t, name) })
	src, err := os.ReadFile(filepath.Join(c.repo, "jobspecs", "examples", "sweep-toy.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(t.TempDir(), "sweep-toy.hcl")
	renamed := strings.Replace(string(src), `sweep "toy-lr"`, fmt.Sprintf("sweep %q", name), 1)
	if err := os.WriteFile(spec, []byte(renamed), 0o644); err != nil {
		t.Fatal(err)
	}
	toy := filepath.Join(filepath.Dir(c.workload()), "sweep_toy.py")
	start := time.Now()
	out, errOut, code := c.sweepCLI(t, 6*time.Minute, "sweep", "submit", "-var", "workload="+toy, spec)
	if code != 0 {
		t.Fatalf("sweep submit exited %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	d := c.sweepStatus(t, name)
	if len(d.Trials) != 12 || d.Status != "completed" {
		t.Fatalf("want 12 trials and a completed sweep, got %d, %s (%s)", len(d.Trials), d.Status, d.Reason)
	}
	steps, stopped := 0, 0
	var bestFull float64 = -2
	for _, tr := range d.Trials {
		steps += tr.Step
		switch tr.State {
		case "stopped":
			stopped++
			if tr.StoppedBy != "asha" || !strings.HasPrefix(tr.Reason, "stopped by ASHA at step ") {
				t.Errorf("%s stopped by %q: %q", tr.ID, tr.StoppedBy, tr.Reason)
			}
		case "completed":
			if tr.Value != nil && *tr.Value > bestFull {
				bestFull = *tr.Value
			}
		default:
			t.Errorf("%s ended %s: %s", tr.ID, tr.State, tr.Reason)
		}
	}
	t.Logf("12 trials in %s: %d stopped early, %d trial-steps of 1200, best %s %.3f (%v)", time.Since(start).Round(time.Second),
		stopped, steps, d.Best.ID, *d.Best.Value, d.Best.Params)
	if stopped < 6 {
		t.Errorf("ASHA stopped %d of 12 trials, want at least half", stopped)
	}
	if steps > 720 {
		t.Errorf("%d trial-steps, want at most 60%% of 1200", steps)
	}
	// The best is a completed trial in the good region (scores 0.85-0.93
	// there; the bad regions stay below 0.6 or diverge).
	if d.Best == nil || d.Best.State != "completed" || *d.Best.Value < 0.8 || *d.Best.Value != bestFull {
		t.Errorf("best %+v, want the best completed trial, above 0.8", d.Best)
	}
	// Each stopped trial's task event says why.
	for _, tr := range d.Trials {
		if tr.State != "stopped" {
			continue
		}
		allocs, err := c.allocsOf(tr.Job)
		if err != nil || len(allocs) == 0 {
			t.Fatalf("allocations of %s: %v", tr.Job, err)
		}
		found := false
		for _, ts := range allocs[0].TaskStates {
			for _, e := range ts.Events {
				if strings.Contains(e.DisplayMessage, "stopped by ASHA") || strings.Contains(e.Message, "stopped by ASHA") ||
					strings.Contains(e.Details["stop_reason"], "stopped by ASHA") {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("%s: no task event says it was stopped by ASHA", tr.ID)
		}
		break
	}
	rep := filepath.Join(t.TempDir(), "asha.png")
	if out, errOut, code := c.sweepCLI(t, time.Minute, "sweep", "report", name, "-o", rep); code != 0 {
		t.Errorf("sweep report exited %d: %s%s", code, out, errOut)
	}
}
