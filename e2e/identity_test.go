package e2e

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/testpriv"
)

// procUIDs reads a process's real and effective UIDs from /proc.
func procUIDs(pid int) (real, effective int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "Uid:" {
			real, _ = strconv.Atoi(f[1])
			effective, _ = strconv.Atoi(f[2])
			return real, effective, nil
		}
	}
	return 0, 0, fmt.Errorf("/proc/%d/status has no Uid line", pid)
}

func nobodyUID(t *testing.T) int {
	t.Helper()
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("no user nobody on this machine: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	return uid
}

// checkIdentities asserts the driver's default on the dev cluster for the
// running allocations: every process of the ranks runs as nobody, the
// supervisor (which holds the Consul token) as root.
func checkIdentities(t *testing.T, allocIDs ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return // a client that is not root runs everything as itself
	}
	nobody := nobodyUID(t)
	ranks := 0
	for _, p := range processes(allocIDs...) {
		real, eff, err := procUIDs(p.pid)
		if err != nil {
			continue // gone meanwhile
		}
		want := nobody
		if p.isSupervisor() || p.isContainerInit() {
			want = 0
		} else {
			ranks++
		}
		if real != want || eff != want {
			t.Errorf("%s runs as UID %d (effective %d), want %d", p, real, eff, want)
		}
	}
	if ranks == 0 {
		t.Errorf("no rank process of allocations %v to check", allocIDs)
	}
}

// TestTasksRunAsNobodyAndRootIsRefused: on the dev cluster's default
// (default_user nobody, no allow_root) a training job's ranks run as nobody,
// its checkpoint directory is nobody's alone, and a job that asks for root
// fails at once with a plain-words reason that `gpujob status` shows.
func TestTasksRunAsNobodyAndRootIsRefused(t *testing.T) {
	c := needCluster(t)
	if os.Geteuid() != 0 {
		testpriv.Skip(t, "the dev cluster's client is not root: it cannot switch users")
	}
	c.nodeGPUs(t, fakeGPUsPerClient)
	const id = "e2e-identity"
	job := c.trainJob(t, id, 2, 1, []string{"--steps", "200", "--sleep-per-step", "0.05"})
	c.register(t, job)
	allocs := c.waitAllocs(t, ctx(t, 2*time.Minute), id, "both members running",
		func(as []*api.AllocationListStub) bool {
			return len(as) == 2 && allIn(api.AllocClientStatusRunning)(as)
		})
	if err := c.waitCheckpoint(id, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	checkIdentities(t, allocIDs(allocs)...)

	// The checkpoint directory (the run's, or the job's without a run
	// stamp) is nobody's, mode 0700; what leads to it is root's.
	ckpt := filepath.Dir(c.checkpoints(id)[0])
	nobody := nobodyUID(t)
	for dir := ckpt; dir != filepath.Dir(filepath.Join(c.dir, "checkpoints")); dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		uid := int(fi.Sys().(*syscall.Stat_t).Uid)
		switch {
		case dir == ckpt && (uid != nobody || fi.Mode().Perm() != 0o700):
			t.Errorf("checkpoint dir %s: UID %d mode %v, want nobody's 0700", dir, uid, fi.Mode().Perm())
		case dir != ckpt && (uid != 0 || fi.Mode().Perm()&0o022 != 0):
			t.Errorf("%s above the checkpoint dir: UID %d mode %v, want root's, writable by root alone", dir, uid, fi.Mode().Perm())
		}
	}
	allocs = c.waitFinished(t, id, 2, 3*time.Minute)
	res := c.finalResult(t, allocs)
	if res.Steps != 200 {
		t.Errorf("trained %d steps as nobody, want 200", res.Steps)
	}

	// The same job as root: refused before anything starts.
	const rootID = "e2e-identity-root"
	rootJob := c.trainJob(t, rootID, 1, 1, []string{"--steps", "20"})
	rootJob.TaskGroups[0].Tasks[0].User = "root"
	// What `gpujob submit` stamps, so that `gpujob status` takes it up.
	rootJob.SetMeta("gpujob", "train")
	rootJob.SetMeta("gpujob_workers", "1")
	rootJob.SetMeta("gpujob_gpus_per_worker", "1")
	c.register(t, rootJob)
	c.waitAllocs(t, ctx(t, time.Minute), rootID, "the member to fail", allIn(api.AllocClientStatusFailed))
	out, errOut, _ := c.gpujob(t, time.Minute, "status", rootID)
	t.Logf("gpujob status %s:\n%s%s", rootID, out, errOut)
	if !strings.Contains(out+errOut, "which the gpujob driver refuses") || !strings.Contains(out+errOut, "allow_root = true") {
		t.Errorf("gpujob status does not say why the root task failed:\n%s%s", out, errOut)
	}
	if strings.Contains(out+errOut, "rpc error") {
		t.Errorf("gpujob status shows the plugin's gRPC wrapping, not just the reason:\n%s%s", out, errOut)
	}
	if _, err := os.Stat(c.checkpointDir(rootID)); !os.IsNotExist(err) {
		t.Errorf("the refused job got a checkpoint directory: %v", err)
	}
}

// openGPUs is a rank that prints its CUDA_VISIBLE_DEVICES and, for each GPU
// device node of the client, whether opening it got past the device cgroup:
// "ok", or ENXIO (the look-alike nodes have no driver behind them), or
// EPERM (the cgroup refused).
const openGPUs = `import errno, glob, os, sys
print("visible", os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
for p in sorted(glob.glob(sys.argv[1])):
    try:
        os.close(os.open(p, os.O_RDONLY))
        print("node", p, "ok")
    except OSError as e:
        print("node", p, errno.errorcode.get(e.errno, str(e.errno)))
`

// TestRanksOpenOnlyTheirGPUs: a task that reserved 2 of the client's 4
// GPUs sees those 2 in CUDA_VISIBLE_DEVICES, and the kernel refuses its
// ranks the device nodes of the other 2 (dev-up gives the fake GPUs
// look-alike nodes, 195:N as NVIDIA's, when it runs as root).
func TestRanksOpenOnlyTheirGPUs(t *testing.T) {
	c := needCluster(t)
	nodes := filepath.Join(c.dir, "client-1", "fakedev", "dev", "nvidia*")
	if m, _ := filepath.Glob(nodes); len(m) != fakeGPUsPerClient {
		testpriv.Skip(t, "the dev cluster has no look-alike GPU device nodes (dev-up needs root to make them)")
	}
	c.nodeGPUs(t, fakeGPUsPerClient)
	const id = "e2e-gpu-nodes"
	job := api.NewBatchJob(id, id, "global", 50)
	job.Datacenters = []string{"*"}
	task := api.NewTask("t", "gpujob").
		SetConfig("command", "/usr/bin/python3").
		SetConfig("args", []string{"-c", openGPUs, nodes}).
		SetConfig("nproc_per_node", 1).
		Require(&api.Resources{CPU: intp(100), MemoryMB: intp(128),
			Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: uint64p(2)}}})
	group := api.NewTaskGroup("g", 1).AddTask(task)
	group.RestartPolicy = &api.RestartPolicy{Attempts: intp(0), Mode: strp("fail")}
	group.ReschedulePolicy = &api.ReschedulePolicy{Attempts: intp(0), Unlimited: boolp(false)}
	job.AddTaskGroup(group)
	c.register(t, job)
	allocs := c.waitAllocs(t, ctx(t, time.Minute), id, "the task to end",
		allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed))
	out := c.taskLog(t, allocs[0].ID, "t", "stdout")
	if allocs[0].ClientStatus != api.AllocClientStatusComplete {
		t.Fatalf("the task %s:\n%s\nstderr:\n%s", allocs[0].ClientStatus, out, c.taskLog(t, allocs[0].ID, "t", "stderr"))
	}
	open, refused := 0, 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "visible":
			if ids := strings.Split(f[1], ","); len(ids) != 2 || !strings.HasPrefix(ids[0], "GPU-") {
				t.Errorf("CUDA_VISIBLE_DEVICES = %s, want the 2 reserved GPUs", f[1])
			}
		case len(f) == 3 && f[0] == "node" && (f[2] == "ok" || f[2] == "ENXIO"):
			open++
		case len(f) == 3 && f[0] == "node" && f[2] == "EPERM":
			refused++
		case len(f) > 0:
			t.Errorf("unexpected line %q", line)
		}
	}
	if open != 2 || refused != 2 {
		t.Errorf("the rank got past the device cgroup to %d GPU nodes and was refused %d, want 2 and 2:\n%s", open, refused, out)
	}
}
