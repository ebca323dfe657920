package submit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs/fixture"
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
	f.SetNode(&api.Node{ID: "n1", Name: "gpu-1", Status: "ready", SchedulingEligibility: "eligible",
		Drivers: map[string]*api.DriverInfo{"gpujob": {Detected: true, Healthy: true}},
		NodeResources: &api.NodeResources{
			Cpu:     api.NodeCpuResources{CpuShares: 8000},
			Memory:  api.NodeMemoryResources{MemoryMB: 16384},
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
	return runCmdConsul(t, f, func() (*consul.Client, error) { return shared.Client(t), nil }, args...)
}

// runCmdConsul is runCmd with the Consul the queue check reads.
func runCmdConsul(t *testing.T, f *nomadapi.Fake, c func() (*consul.Client, error), args ...string) (string, string, error) {
	t.Helper()
	io, _, out, errOut := iostreams.Test()
	clock := time.Unix(1764490000, 0)
	fac := &factory.Factory{IO: io, Nomad: func() (nomadapi.API, error) { return f, nil }, Consul: c,
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
		{"job name escaping the checkpoint root", "train \"../../../../../tmp/escaped\" {\n  command = \"/bin/true\"\n}\n",
			"spec.hcl:1:7: error: Invalid job name"},
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

// node is a ready client with the gpujob driver, cpu MHz, mem MiB and gpus
// healthy GPUs of model (16 GiB each).
func node(id, name string, cpu, mem int64, model string, gpus int) *api.Node {
	n := &api.Node{ID: id, Name: name, Datacenter: "dc1", NodePool: "default", Status: "ready", SchedulingEligibility: "eligible",
		Drivers:       map[string]*api.DriverInfo{"gpujob": {Detected: true, Healthy: true}, "exec": {Detected: true, Healthy: true}},
		NodeResources: &api.NodeResources{Cpu: api.NodeCpuResources{CpuShares: cpu}, Memory: api.NodeMemoryResources{MemoryMB: mem}},
		ReservedResources: &api.NodeReservedResources{Cpu: api.NodeReservedCpuResources{CpuShares: 100},
			Memory: api.NodeReservedMemoryResources{MemoryMB: 256}},
	}
	if gpus > 0 {
		memMiB := int64(16384)
		d := &api.NodeDeviceResource{Vendor: "nvidia", Type: "gpu", Name: model,
			Attributes: map[string]*api.Attribute{"memory": {IntVal: &memMiB, Unit: "MiB"}}}
		for i := 0; i < gpus; i++ {
			d.Instances = append(d.Instances, &api.NodeDevice{ID: fmt.Sprintf("GPU-%s-%d", id, i), Healthy: true})
		}
		n.NodeResources.Devices = []*api.NodeDeviceResource{d}
	}
	return n
}

// bigCluster: two 4-GPU T4 nodes, one 8-GPU A100 node in pool "big", a CPU
// node, and nodes that can take no work: drained, gpujob driver unhealthy,
// down.
func bigCluster(t *testing.T) (*nomadapi.Fake, *bool) {
	f := nomadapi.NewFake()
	f.SetNode(node("n1", "gpu-1", 16100, 32768, "Tesla T4", 4))
	f.SetNode(node("n2", "gpu-2", 16100, 32768, "Tesla T4", 4))
	big := node("n3", "gpu-3", 64100, 262400, "A100", 8)
	big.NodePool = "big"
	f.SetNode(big)
	f.SetNode(node("n4", "cpu-1", 8100, 16640, "", 0))
	drained := node("n5", "drained", 16100, 32768, "Tesla T4", 4)
	drained.SchedulingEligibility = "ineligible"
	f.SetNode(drained)
	sick := node("n6", "sick", 16100, 32768, "Tesla T4", 4)
	sick.Drivers["gpujob"] = &api.DriverInfo{Detected: true, Healthy: false, HealthDescription: "consul unreachable"}
	f.SetNode(sick)
	down := node("n7", "down", 16100, 32768, "Tesla T4", 4)
	down.Status = "down"
	f.SetNode(down)
	planned := false
	f.PlanFunc = func(*api.Job) (*api.JobPlanResponse, error) { planned = true; return &api.JobPlanResponse{}, nil }
	f.ParseHCLFunc = func(hcl, vars string) (*api.Job, error) {
		id := "x"
		return &api.Job{ID: &id, Name: &id}, nil
	}
	return f, &planned
}

func TestSubmitRefusesAGroupTheEmptyClusterCannotHold(t *testing.T) {
	train := func(lines ...string) string {
		return "train \"x\" {\n  command = \"/bin/true\"\n" + strings.Join(lines, "\n") + "\n}\n"
	}
	cases := []struct {
		name, spec string
		most       int
		want       []string
	}{
		{"GPU-bound", train("  workers = 5000"), 8, []string{
			"spec.hcl:3:13: error: Spec cannot fit the cluster: ",
			`train "x": workers = 5000 cannot fit: the cluster could hold at most 8 workers of this size (1 GPU(s), 1000 MHz CPU, 2048 MiB memory) even when empty`,
			"(6 ready node(s): gpu-1 4 (GPUs), gpu-2 4 (GPUs), cpu-1 0 (no GPU), drained 0 (not eligible), gpu-3 0 (node pool big), sick 0 (gpujob driver unhealthy: consul unreachable))",
			"ask for at most 8 workers"}},
		// (16100-100) MHz / 5000 = 3 on each T4 node: CPU binds before GPUs.
		{"CPU-bound", train("  workers = 7", "  resources {", "    cpu = 5000", "  }"), 6, []string{
			"at most 6 workers of this size (1 GPU(s), 5000 MHz CPU, 2048 MiB memory)", "gpu-1 3 (CPU)"}},
		// (32768-256) MiB / (8000+192) = 3 on each T4 node, 2 on the CPU node.
		{"memory-bound CPU job", train("  workers = 20", "  gpus_per_worker = 0", "  resources {", "    memory = 8000", "    shm = 192", "  }"), 8, []string{
			"at most 8 workers of this size (1000 MHz CPU, 8192 MiB memory)", "gpu-1 3 (memory)", "cpu-1 2 (memory)"}},
		// In a container shm is docker's shm_size, not memory, and the
		// gpujob sidecar reserves 50 MHz and 64 MiB: (32768-256) MiB /
		// (8000+64) = 4 on each T4 node.
		{"memory-bound CPU image job", train("  workers = 20", "  gpus_per_worker = 0", `  image = "busybox"`, "  resources {", "    memory = 8000", "    shm = 192", "  }"), 10, []string{
			"at most 10 workers of this size (1050 MHz CPU, 8064 MiB memory)", "gpu-1 4 (memory)", "cpu-1 2 (memory)"}},
		{"node pool", train("  workers = 3", "  gpus_per_worker = 4", `  node_pool = "big"`), 2, []string{
			"at most 2 workers", "gpu-3 2 (GPUs)", "gpu-1 0 (node pool default)"}},
		{"GPU model", train("  workers = 9", "  gpu {", `    model = "Tesla T4"`, "  }"), 8, []string{
			"at most 8 workers", "gpu-1 4 (GPUs)"}},
		{"GPU memory", train("  workers = 1", "  gpu {", `    min_memory = "32 GiB"`, "  }"), 0, []string{
			"at most 0 workers", "gpu-1 0 (no matching GPU)", "ask for fewer workers, or smaller ones"}},
		{"datacenter", train("  workers = 2", `  datacenters = ["dc2*"]`), 0, []string{
			"at most 0 workers", "gpu-1 0 (datacenter dc1)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, planned := bigCluster(t)
			_, errOut, err := runCmd(t, f, "--detach", writeSpec(t, c.spec))
			var exit *ExitError
			if !errors.As(err, &exit) || exit.Code != 1 {
				t.Fatalf("error %v, want exit code 1\n%s", err, errOut)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("could hold at most %d; nothing was submitted", c.most)) {
				t.Errorf("error %q does not give the largest feasible size %d", err, c.most)
			}
			for _, w := range c.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("errors lack %q:\n%s", w, errOut)
				}
			}
			if len(f.Registered) != 0 || *planned {
				t.Errorf("refused, but registered %d job(s), planned %v", len(f.Registered), *planned)
			}
		})
	}
}

// TestSubmitTakesAGroupThatFitsTheEmptyCluster: at the capacity exactly, or
// below it with the GPUs held by others now, the job is submitted (queued).
func TestSubmitTakesAGroupThatFitsTheEmptyCluster(t *testing.T) {
	for _, workers := range []int{8, 3} {
		f, planned := bigCluster(t)
		// Another job holds every GPU of gpu-1 now: the group still fits
		// the empty cluster, so it is queued, not refused.
		f.SetAlloc(&api.Allocation{ID: "other", JobID: "bert-a", NodeID: "n1", ClientStatus: "running",
			AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{"t": {
				Devices: []*api.AllocatedDeviceResource{{DeviceIDs: []string{"GPU-n1-0", "GPU-n1-1", "GPU-n1-2", "GPU-n1-3"}}}}}}})
		src := fmt.Sprintf("train \"x\" {\n  command = \"/bin/true\"\n  workers = %d\n}\n", workers)
		out, errOut, err := runCmd(t, f, "--detach", writeSpec(t, src))
		if err != nil || len(f.Registered) != 1 || !*planned {
			t.Fatalf("workers = %d: err %v, registered %d, planned %v\n%s%s", workers, err, len(f.Registered), *planned, out, errOut)
		}
	}
}

const imageSpec = `train "bert" {
  workers         = 2
  gpus_per_worker = 1
  image           = "gpujob-train:latest"
  command         = "/usr/bin/python3"
  args            = ["train.py"]
}
`

// TestSubmitImageSpec: an image job is rendered with the clients'
// checkpoint root (--checkpoint-root, else GPUJOB_CHECKPOINT_ROOT), and the
// submission's run replaces the rendered empty gpujob_run, which the
// containers' checkpoint mount reads.
func TestSubmitImageSpec(t *testing.T) {
	for _, c := range []struct {
		name, env string
		args      []string
		root      string
	}{
		{"default", "", nil, "/var/lib/gpujob/checkpoints"},
		{"environment", "/srv/ckpt", nil, "/srv/ckpt"},
		{"flag over environment", "/srv/ckpt", []string{"--checkpoint-root", "/data/ckpt"}, "/data/ckpt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GPUJOB_CHECKPOINT_ROOT", c.env)
			f := cluster(t)
			f.ParseHCLFunc = func(hcl, vars string) (*api.Job, error) {
				for _, want := range []string{`driver       = "docker"`, `checkpoint_root = "` + c.root + `"`,
					`source   = "` + c.root + `/${NOMAD_NAMESPACE}/${NOMAD_JOB_ID}/${NOMAD_META_gpujob_run}"`} {
					if !strings.Contains(hcl, want) {
						t.Errorf("rendered jobspec lacks %s:\n%s", want, hcl)
					}
				}
				id, count := "bert", 2
				return &api.Job{ID: &id, Name: &id, Meta: map[string]string{"gpujob": "train", "gpujob_run": "", "gpujob_task": "train"},
					TaskGroups: []*api.TaskGroup{{Name: strp("train"), Count: &count}}}, nil
			}
			out, errOut, err := runCmd(t, f, append(append([]string{"--detach"}, c.args...), writeSpec(t, imageSpec))...)
			if err != nil {
				t.Fatalf("submit: %v\n%s%s", err, out, errOut)
			}
			if len(f.Registered) != 1 {
				t.Fatalf("registered %d jobs", len(f.Registered))
			}
			if run := f.Registered[0].Meta["gpujob_run"]; !regexp.MustCompile(`^17644900\d\d$`).MatchString(run) {
				t.Errorf("gpujob_run = %q, want the submission's time", run)
			}
		})
	}
	t.Run("a relative checkpoint root", func(t *testing.T) {
		t.Setenv("GPUJOB_CHECKPOINT_ROOT", "ckpt")
		f := cluster(t)
		_, _, err := runCmd(t, f, "--detach", writeSpec(t, imageSpec))
		if err == nil || !strings.Contains(err.Error(), "GPUJOB_CHECKPOINT_ROOT") || !strings.Contains(err.Error(), "absolute") || len(f.Registered) != 0 {
			t.Errorf("error %v, registered %d", err, len(f.Registered))
		}
	})
}
