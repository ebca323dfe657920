package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// preloadModules is what the preload rows have each rank slot import once.
var preloadModules = []string{"torch", "torch.distributed"}

// withPreload turns preload on in a parsed training jobspec.
func withPreload(job *api.Job) {
	job.TaskGroups[0].Tasks[0].Config["preload"] = preloadModules
}

// heldOutScript copies testdata/heldout where the tasks' user can read it
// and returns the script's path.
func (c *cluster) heldOutScript(t *testing.T) string {
	t.Helper()
	root := c.env["GPUJOB_DEV_WORKLOADS"]
	if root == "" {
		return filepath.Join(c.repo, "e2e", "testdata", "heldout", "heldout.py")
	}
	dst := filepath.Join(root, "heldout")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"heldout.py", "heldout_helper.py"} {
		b, err := os.ReadFile(filepath.Join(c.repo, "e2e", "testdata", "heldout", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dst, "heldout.py")
}

// resultLine decodes the last "gpujob-result: {...}" line of the logs as a map.
func resultLine(t *testing.T, logs []string) map[string]any {
	t.Helper()
	for _, out := range logs {
		if i := strings.LastIndex(out, "gpujob-result: "); i >= 0 {
			line := strings.SplitN(out[i+len("gpujob-result: "):], "\n", 2)[0]
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("result line %q: %v", line, err)
			}
			return m
		}
	}
	t.Fatal("no result line")
	return nil
}

// noPreloadWarning fails the test when a member started cold although
// preload was asked for: the comparison would then prove nothing.
func (c *cluster) noPreloadWarning(t *testing.T, allocs []*api.AllocationListStub) {
	t.Helper()
	if events := c.taskEvents(t, allocs); strings.Contains(events, "preload failed") {
		t.Fatalf("a member did not preload:\n%s", events)
	}
}

// An unmodified user script (env://, __main__, sys.argv, a relative import,
// DataLoader workers) gives the same result with and without preload; with
// it, torch was there before the script's first line.
func TestPreloadHeldOutScriptSameResult(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, c.gpusPerClient())
	c.waitDriverHealthy(t)
	script := c.heldOutScript(t)
	results := map[bool]map[string]any{}
	for _, preload := range []bool{false, true} {
		id := "e2e-heldout-cold"
		if preload {
			id = "e2e-heldout-preload"
		}
		// 2 members x 2 ranks: two preloaded slots per member.
		job := c.trainJob(t, id, 2, 2, nil)
		job.TaskGroups[0].Tasks[0].Config["args"] = []string{script, "2.5"}
		if preload {
			withPreload(job)
		}
		_, logs, allocs := c.runTraining(t, job, 3*time.Minute)
		if preload {
			c.noPreloadWarning(t, allocs)
		}
		results[preload] = resultLine(t, logs)
		c.purge(id)
	}
	cold, warm := results[false], results[true]
	t.Logf("cold: %v\npreloaded: %v", cold, warm)
	if cold["preloaded"] != false || warm["preloaded"] != true {
		t.Errorf("torch imported before the script: cold %v, preloaded %v; want false and true", cold["preloaded"], warm["preloaded"])
	}
	delete(cold, "preloaded")
	delete(warm, "preloaded")
	if !reflect.DeepEqual(cold, warm) {
		t.Errorf("results differ:\ncold      %v\npreloaded %v", cold, warm)
	}
	want := map[string]any{"name": "__main__", "argv": []any{"2.5"}, "helper": "heldout_helper", "world": 4.0,
		"cwd_is_task_dir": true, "in_main_worker_info": true}
	for k, v := range want {
		if !reflect.DeepEqual(cold[k], v) {
			t.Errorf("%s = %v, want %v", k, cold[k], v)
		}
	}
}

// The BERT workload trains to the very same accuracy with preload as the
// fault-free cold run.
func TestPreloadBERTSameAccuracy(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, c.gpusPerClient())
	c.waitDriverHealthy(t)
	ref := c.referenceAccuracy(t, 2)
	const id = "e2e-preload-bert"
	job := c.trainJob(t, id, 2, 1, []string{"--steps", strconv.Itoa(faultSteps())})
	withPreload(job)
	res, _, allocs := c.runTraining(t, job, 5*time.Minute)
	c.noPreloadWarning(t, allocs)
	t.Logf("preloaded: accuracy %.4f (cold %.4f), %d steps", res.Accuracy, ref, res.Steps)
	if res.Accuracy != ref || res.Steps != faultSteps() || res.RestartCount != 0 {
		t.Errorf("preloaded run: accuracy %v, %d steps, %d restarts; want %v (the cold run's), %d, 0",
			res.Accuracy, res.Steps, res.RestartCount, ref, faultSteps())
	}
	c.purge(id)
}

// The fault matrix's kill -9 rows with preload on.
func TestFaultKillRankPreloaded(t *testing.T) {
	c := needCluster(t)
	c.trainThroughFault(t, faultRow{
		job:  "e2e-fault-rank-preload",
		edit: withPreload,
		fault: func(t *testing.T, f *faultRun) error {
			for _, a := range f.allocs {
				if !hasZygote(a.ID) {
					t.Errorf("%s runs no preloaded interpreter", a.Name)
				}
			}
			return kill9(f.ranks[1])
		},
		restarts: 1,
		check: func(t *testing.T, f *faultRun, allocs []*api.AllocationListStub) {
			f.c.noPreloadWarning(t, allocs)
		},
	})
}

func TestFaultKillSupervisorPreloaded(t *testing.T) {
	c := needCluster(t)
	c.trainThroughFault(t, faultRow{
		job: "e2e-fault-supervisor-preload",
		edit: func(job *api.Job) {
			withPreload(job)
			job.TaskGroups[0].ReschedulePolicy = &api.ReschedulePolicy{
				Attempts: intp(1), Interval: durp(time.Hour), Delay: durp(5 * time.Second),
				DelayFunction: strp("constant"), Unlimited: boolp(false),
			}
		},
		fault: func(t *testing.T, f *faultRun) error {
			if !hasZygote(f.member(1).ID) {
				t.Errorf("%s runs no preloaded interpreter", f.member(1).Name)
			}
			return killSupervisor(t, f)
		},
		restarts: 1,
	})
}

// hasZygote reports whether an allocation runs a preloaded interpreter.
func hasZygote(allocID string) bool {
	for _, p := range processes(allocID) {
		for _, a := range p.args {
			if a == "gpujob-preload" {
				return true
			}
		}
	}
	return false
}

// A module that cannot be imported never fails the job: the ranks start
// cold and the joined event says which module and why.
func TestPreloadOfAMissingModuleStartsCold(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, c.gpusPerClient())
	script := c.heldOutScript(t)
	const id = "e2e-preload-missing"
	job := c.trainJob(t, id, 1, 1, nil)
	job.TaskGroups[0].Tasks[0].Config["args"] = []string{script, "1"}
	job.TaskGroups[0].Tasks[0].Config["preload"] = []string{"torch", "no_such_module_gpujob"}
	_, logs, allocs := c.runTraining(t, job, 3*time.Minute)
	res := resultLine(t, logs)
	if res["preloaded"] != false || res["world"] != 1.0 {
		t.Errorf("result %v: want a cold start (preloaded false) of world 1", res)
	}
	events := c.taskEvents(t, allocs)
	for _, want := range []string{"preload failed, starting cold", "no_such_module_gpujob", "ModuleNotFoundError"} {
		if !strings.Contains(events, want) {
			t.Errorf("task events lack %q:\n%s", want, events)
		}
	}
	c.purge(id)
}
