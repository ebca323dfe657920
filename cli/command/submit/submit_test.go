package submit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/command/gpujobs/fixture"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/taskevent"
)

const goodSpec = `train "bert" {
  workers         = 2
  gpus_per_worker = 1
  command         = "/usr/bin/python3"
  args            = ["train.py"]
}
`

func writeSpec(t *testing.T, src string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "spec.hcl")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// cluster is a fake Nomad with one node of four GPUs; ParseHCL returns a job
// of the rendered spec's name with two workers.
func cluster(t *testing.T) *nomadapi.Fake {
	f := nomadapi.NewFake()
	var devs []*api.NodeDevice
	for i := 0; i < 4; i++ {
		devs = append(devs, &api.NodeDevice{ID: "GPU-" + string(rune('a'+i)), Healthy: true})
	}
	f.SetNode(&api.Node{ID: "n1", Name: "gpu-1", Status: "ready", NodeResources: &api.NodeResources{
		Devices: []*api.NodeDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: "Tesla T4", Instances: devs}},
	}})
	f.ParseHCLFunc = func(hcl, vars string) (*api.Job, error) {
		if !regexp.MustCompile(`driver\s*= "gpujob"`).MatchString(hcl) {
			t.Errorf("ParseHCL got something other than a rendered gpujob jobspec:\n%s", hcl)
		}
		id, count := "bert", 2
		return &api.Job{ID: &id, Name: &id, TaskGroups: []*api.TaskGroup{{Name: strp("train"), Count: &count}}}, nil
	}
	return f
}

func strp(s string) *string { return &s }

func alloc(i int, status string, events ...taskevent.Event) *api.Allocation {
	var evs []*api.TaskEvent
	for _, e := range events {
		evs = append(evs, fixture.DriverEvent(e, fixture.Epoch))
	}
	return &api.Allocation{ID: "alloc-" + string(rune('0'+i)), Name: "bert.train[" + string(rune('0'+i)) + "]",
		JobID: "bert", NodeID: "n1", NodeName: "gpu-1", TaskGroup: "train", ClientStatus: status,
		CreateIndex: uint64(10 + i), TaskStates: map[string]*api.TaskState{"train": {Events: evs}}}
}

func runCmd(t *testing.T, f *nomadapi.Fake, args ...string) (string, string, error) {
	t.Helper()
	io, _, out, errOut := iostreams.Test()
	clock := time.Unix(1764490000, 0)
	fac := &factory.Factory{IO: io, Nomad: func() (nomadapi.API, error) { return f, nil },
		Now: func() time.Time { clock = clock.Add(100 * time.Millisecond); return clock }}
	cmd := NewCmd(fac)
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

func TestSubmitFollowsTheJobToSuccess(t *testing.T) {
	for _, withLogs := range []bool{false, true} {
		t.Run(map[bool]string{false: "progress", true: "progress and logs"}[withLogs], func(t *testing.T) {
			followTheJob(t, withLogs)
		})
	}
}

func followTheJob(t *testing.T, withLogs bool) {
	f := cluster(t)
	// A finished allocation of an earlier run of a job of the same name:
	// not part of this submission.
	old := alloc(7, "complete", fixture.Then(fixture.Joined(1, 0, 1, 0, 0, 1, "127.0.0.1:1"), taskevent.Succeeded))
	old.CreateIndex = 0
	f.SetAlloc(old)
	// The job's life, one step per blocking query: placed, joined, done.
	step := 0
	f.OnBlock = func(f *nomadapi.Fake, query string, index uint64) {
		if query != "JobAllocations" {
			return
		}
		step++
		joined := func(n int) taskevent.Event { return fixture.Joined(1, n, 2, n, n, 2, "127.0.0.1:24001") }
		switch step {
		case 1:
			f.SetAlloc(alloc(0, "pending"))
			f.SetAlloc(alloc(1, "pending"))
		case 2:
			f.SetAlloc(alloc(0, "running", joined(0)))
			f.SetAlloc(alloc(1, "running", joined(1)))
		case 3:
			f.SetAlloc(alloc(0, "complete", joined(0), fixture.Then(joined(0), taskevent.Succeeded)))
			f.SetAlloc(alloc(1, "complete", joined(1), fixture.Then(joined(1), taskevent.Succeeded)))
			f.SetLog("alloc-0", "train", "stdout", "gpujob: step=10 rank=0 loss=0.5\n",
				`gpujob-result: {"accuracy": 0.9375, "f1": 0.9371, "wall_seconds": 11.7, "world_size": 2, "restart_count": 0}`+"\n")
			f.SetLog("alloc-1", "train", "stdout", "gpujob: step=10 rank=1 loss=0.5\n")
		}
	}
	args := []string{writeSpec(t, goodSpec)}
	if withLogs {
		args = append([]string{"--logs"}, args...)
	}
	out, errOut, err := runCmd(t, f, args...)
	if err != nil {
		t.Fatalf("submit: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	logLine := "[bert.train[1]] gpujob: step=10 rank=1 loss=0.5"
	if got := strings.Count(out, logLine); withLogs && got != 1 || !withLogs && got != 0 {
		t.Errorf("worker log line shown %d time(s) (logs %v):\n%s", got, withLogs, out)
	}
	for _, want := range []string{
		"submitted bert: 2 worker(s) × 1 GPU(s)",
		"placed bert.train[0] on node gpu-1",
		"rendezvous round 1 complete: 2 member(s), world size 2, master 127.0.0.1:24001; training",
		"bert.train[1] complete",
		"complete in",
		"result: accuracy 0.9375, F1 0.9371, wall time 11.7s, world size 2, restarts 0",
		"gpujob status bert",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "bert.train[7]") {
		t.Errorf("the watcher reported an allocation of an earlier run:\n%s", out)
	}
	if strings.Count(out, "rendezvous round 1 complete") != 1 {
		t.Errorf("round 1 announced more than once:\n%s", out)
	}
	if len(f.Registered) != 1 || f.Registered[0].Meta["gpujob_run"] == "" {
		t.Errorf("registered %d job(s); the submission is not stamped with gpujob_run", len(f.Registered))
	}
}

func TestSubmitExitsWithTheJobsFailure(t *testing.T) {
	f := cluster(t)
	f.OnBlock = func(f *nomadapi.Fake, query string, index uint64) {
		if query != "JobAllocations" {
			return
		}
		exhausted := fixture.After(fixture.Joined(4, 0, 2, 0, 0, 2, "127.0.0.1:24001"), 4, 3)
		exhausted.Kind, exhausted.Failure = taskevent.Restarting, taskevent.Failure{Member: "bert.train[0]", Reason: "rank 0 exited 1", ExitCode: 1}
		f.SetAlloc(alloc(0, "failed", exhausted))
		f.SetAlloc(alloc(1, "failed"))
	}
	out, _, err := runCmd(t, f, writeSpec(t, goodSpec))
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Code != 1 {
		t.Fatalf("error %v, want exit code 1", err)
	}
	if !strings.Contains(err.Error(), "rank 0 exited 1: no restarts left") || !strings.Contains(out, "failed after") {
		t.Errorf("the failure does not say why: %v\n%s", err, out)
	}
}

func TestSubmitNoQueueExplainsAndRegistersNothing(t *testing.T) {
	f := cluster(t)
	f.SetAlloc(&api.Allocation{ID: "other", JobID: "bert-a", NodeID: "n1", ClientStatus: "running",
		AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{"t": {
			Devices: []*api.AllocatedDeviceResource{{DeviceIDs: []string{"GPU-a", "GPU-b", "GPU-c"}}}}}}})
	f.PlanFunc = func(*api.Job) (*api.JobPlanResponse, error) {
		return &api.JobPlanResponse{FailedTGAllocs: map[string]*api.AllocationMetric{"train": {
			NodesEvaluated: 1, NodesInPool: 1, NodesExhausted: 1,
			DimensionExhausted: map[string]int{"devices: no devices match request": 1}}}}, nil
	}
	out, _, err := runCmd(t, f, "--no-queue", writeSpec(t, goodSpec))
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Code != ExitNotPlaced {
		t.Fatalf("error %v, want exit code %d", err, ExitNotPlaced)
	}
	for _, want := range []string{"bert cannot be placed now", "needs 2 × 1 nvidia/gpu (2 GPUs)", "1 of 2 could be placed now",
		"node gpu-1 has 1 of 4 free, 3 held by job bert-a"} {
		if !strings.Contains(out, want) {
			t.Errorf("explanation lacks %q:\n%s", want, out)
		}
	}
	if len(f.Registered) != 0 {
		t.Errorf("--no-queue registered the job")
	}
}

func TestSubmitQueuesByDefaultAndDetaches(t *testing.T) {
	f := cluster(t)
	f.PlanFunc = func(*api.Job) (*api.JobPlanResponse, error) {
		return &api.JobPlanResponse{FailedTGAllocs: map[string]*api.AllocationMetric{"train": {NodesEvaluated: 1, NodesInPool: 1}}}, nil
	}
	out, _, err := runCmd(t, f, "--detach", writeSpec(t, goodSpec))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Registered) != 1 || !strings.Contains(out, "queued: needs 2 × 1 nvidia/gpu") {
		t.Errorf("registered %d, output:\n%s", len(f.Registered), out)
	}
}

func TestSubmitRefusesBadSpecsAndOversizedWorkers(t *testing.T) {
	cases := []struct {
		name, spec, want string
	}{
		{"bad field", "train \"x\" {\n  command = \"/bin/true\"\n  worker  = 2\n}\n", "spec.hcl:3:3"},
		{"more GPUs than any node", "train \"x\" {\n  command = \"/bin/true\"\n  gpus_per_worker = 8\n}\n", "spec.hcl:3:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := cluster(t)
			_, errOut, err := runCmd(t, f, writeSpec(t, c.spec))
			var exit *ExitError
			if !errors.As(err, &exit) || exit.Code != 1 {
				t.Fatalf("error %v, want exit code 1", err)
			}
			if !strings.Contains(errOut, c.want) {
				t.Errorf("errors lack %q:\n%s", c.want, errOut)
			}
			if len(f.Registered) != 0 {
				t.Errorf("a refused spec registered a job")
			}
		})
	}
}

func TestSubmitReplacesAFinishedJobButNotALiveOne(t *testing.T) {
	for _, status := range []string{"dead", "running"} {
		t.Run(status, func(t *testing.T) {
			f := cluster(t)
			id, s := "bert", status
			f.SetJob(&api.Job{ID: &id, Name: &id, Status: &s})
			_, _, err := runCmd(t, f, "--detach", writeSpec(t, goodSpec))
			if status == "dead" {
				if err != nil || len(f.Deregistered) != 1 || !f.Deregistered[0].Purge || len(f.Registered) != 1 {
					t.Fatalf("finished job: err %v, deregistered %+v, registered %d", err, f.Deregistered, len(f.Registered))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "already running") || len(f.Registered) != 0 {
				t.Fatalf("live job: err %v, registered %d", err, len(f.Registered))
			}
		})
	}
}
