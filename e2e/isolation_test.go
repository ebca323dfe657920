package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
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

// The adversarial suite of issue 23: a job submitter must get nothing on a
// client that a Nomad job could not already get. Each test is a hostile job
// on the real dev cluster that must fail to do harm, then an ordinary job
// that must still run. The dev cluster's driver is configured as a shared
// multi-tenant client would be (tenantsDriverConfig): tenants' namespaces
// run as users of their own, and every task has a cap on its processes.

const (
	tenantA, tenantB         = "gj-team-a", "gj-team-b"
	tenantAUser, tenantBUser = "gjtenant-a", "gjtenant-b"
	// isolationPidsLimit is the dev cluster's pids_limit: room for a
	// training member's ranks, preload interpreters and threads.
	isolationPidsLimit = 512
)

// tenantsDriverConfig is added to the dev cluster's driver config.
var tenantsDriverConfig = fmt.Sprintf(`    namespace_users = {
      %q = [%q]
      %q = [%q]
    }
    pids_limit = %d`, tenantA, tenantAUser, tenantB, tenantBUser, isolationPidsLimit)

// needIsolation is the cluster of the isolation tests; they need a root
// client (GPUJOB_REQUIRE_PRIV=1 makes a missing one a failure).
func needIsolation(t *testing.T) *cluster {
	t.Helper()
	c := needCluster(t)
	testpriv.NeedRoot(t, "the dev cluster's client must be root to run tasks as other users")
	return c
}

// scratch is a directory every user can read (mode 0755) for the files a
// hostile job uses; writable is one inside it that every user can write.
func scratch(t *testing.T) (dir, writable string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "gj-iso-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	writable = filepath.Join(dir, "w")
	if err := os.Mkdir(writable, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, writable} {
		mode := os.FileMode(0o755)
		if d == writable {
			mode = 0o777 | os.ModeSticky
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
	}
	return dir, writable
}

// taskJob is a one-member job on the gpujob driver (no GPU) that runs
// command with args as user ("": the driver's default) in namespace ns,
// with env; it fails for good at the first failure.
func taskJob(id, ns, user string, env map[string]string, command string, args ...string) *api.Job {
	job := api.NewBatchJob(id, id, "global", 50)
	job.Datacenters = []string{"*"}
	if ns != "" {
		job.Namespace = &ns
	}
	job.Meta = map[string]string{"gpujob": "train", "gpujob_task": "train", "gpujob_workers": "1", "gpujob_gpus_per_worker": "0"}
	task := api.NewTask("train", "gpujob").
		SetConfig("command", command).
		SetConfig("args", args).
		SetConfig("max_restarts", 0).
		Require(&api.Resources{CPU: intp(100), MemoryMB: intp(256)})
	task.User = user
	task.Env = env
	group := api.NewTaskGroup("train", 1).AddTask(task)
	group.RestartPolicy = &api.RestartPolicy{Attempts: intp(0), Mode: strp("fail")}
	group.ReschedulePolicy = &api.ReschedulePolicy{Attempts: intp(0), Unlimited: boolp(false)}
	return job.AddTaskGroup(group)
}

// runToEnd registers job (in its namespace) and waits until its member
// ended, with blocking queries.
func (c *cluster) runToEnd(t *testing.T, job *api.Job, limit time.Duration) *api.AllocationListStub {
	t.Helper()
	c.registerIn(t, job)
	ctx := ctx(t, limit)
	ns := stringOr(job.Namespace, "default")
	ended := allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed)
	var index uint64
	var last []*api.AllocationListStub
	for {
		q := (&api.QueryOptions{Namespace: ns, WaitIndex: index, WaitTime: 5 * time.Second}).WithContext(ctx)
		allocs, meta, err := c.nomad.Jobs().Allocations(*job.ID, false, q)
		if ctx.Err() != nil {
			t.Fatalf("job %s/%s: its member did not end within %s; allocations: %s", ns, *job.ID, limit, describeAllocs(last))
		}
		if err != nil {
			t.Fatalf("job %s/%s: listing allocations: %v", ns, *job.ID, err)
		}
		index, last = meta.LastIndex, allocs
		if ended(allocs) {
			return allocs[0]
		}
	}
}

// registerIn is register for a job in any namespace.
func (c *cluster) registerIn(t *testing.T, job *api.Job) {
	t.Helper()
	q := &api.WriteOptions{Namespace: stringOr(job.Namespace, "default")}
	if _, _, err := c.nomad.Jobs().Register(job, q); err != nil {
		t.Fatalf("registering %s: %v", *job.ID, err)
	}
	t.Cleanup(func() {
		_, _, _ = c.nomad.Jobs().Deregister(*job.ID, true, q)
	})
}

func stringOr(s *string, def string) string {
	if s == nil || *s == "" {
		return def
	}
	return *s
}

// events is every task event message of the allocation's member task.
func (c *cluster) events(t *testing.T, allocID string) string {
	t.Helper()
	alloc, _, err := c.nomad.Allocations().Info(allocID, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ts := range alloc.TaskStates {
		for _, e := range ts.Events {
			out = append(out, e.DisplayMessage)
		}
	}
	return strings.Join(out, "\n")
}

// ordinaryJobStillRuns is the end of every hostile test: a plain job runs
// to completion on the same client.
func (c *cluster) ordinaryJobStillRuns(t *testing.T, name string) {
	t.Helper()
	a := c.runToEnd(t, taskJob(name, "", "", nil, "/bin/sh", "-c", "echo ordinary"), 2*time.Minute)
	if a.ClientStatus != api.AllocClientStatusComplete {
		t.Fatalf("an ordinary job after the attack ended %s:\n%s", a.ClientStatus, c.events(t, a.ID))
	}
}

// hostileLibrary is issue 23's first attack: a shared object whose
// constructor records the effective user of every process that loads it.
const hostileLibrary = `#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void hostile(void) {
	const char *log = getenv("GJ_LOG");
	char comm[64] = "?", line[160];
	int fd, n;
	if (!log) return;
	fd = open("/proc/self/comm", O_RDONLY);
	if (fd >= 0) { n = read(fd, comm, sizeof comm - 1); if (n > 0) comm[n - 1] = 0; close(fd); }
	n = snprintf(line, sizeof line, "euid=%d comm=%s\n", (int)geteuid(), comm);
	fd = open(log, O_WRONLY | O_APPEND);
	if (fd >= 0) { write(fd, line, n); close(fd); }
}
`

// TestIsolationJobEnvironmentNeverReachesRoot: a job sets LD_PRELOAD to a
// library of its own, and HTTP_PROXY and CONSUL_HTTP_* to take over the
// supervisor's Consul client. The library must load only as the ranks' user
// (never in a root process: the supervisor, the `nomad alloc exec` helper),
// and the job must still rendezvous through the real Consul.
func TestIsolationJobEnvironmentNeverReachesRoot(t *testing.T) {
	c := needIsolation(t)
	dir, writable := scratch(t)
	src := filepath.Join(dir, "hostile.c")
	lib := filepath.Join(dir, "hostile.so")
	if err := os.WriteFile(src, []byte(hostileLibrary), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("building the hostile library: %v\n%s", err, out)
	}
	log := filepath.Join(writable, "loads")
	if err := os.WriteFile(log, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(log, 0o666)
	env := map[string]string{
		"LD_PRELOAD": lib, "GJ_LOG": log,
		"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
		"CONSUL_HTTP_ADDR": "127.0.0.1:9", "CONSUL_HTTP_TOKEN": "forged", "GODEBUG": "panicnil=1",
	}
	const id = "e2e-iso-env"
	job := taskJob(id, "", "", env, "/bin/sh", "-c", "sleep 6; echo trained")
	c.registerIn(t, job)
	allocs := c.waitAllocs(t, ctx(t, 2*time.Minute), id, "the member running", allIn(api.AllocClientStatusRunning))
	// nomad alloc exec into the task: the driver's run-as helper starts as
	// root.
	nomadBin := c.env["GPUJOB_DEV_NOMAD_BIN"]
	exec1 := exec.Command(nomadBin, "alloc", "exec", "-task", "train", allocs[0].ID, "/bin/sh", "-c", "echo exec-ran")
	exec1.Env = append(os.Environ(), "NOMAD_ADDR="+c.env["NOMAD_ADDR"])
	out, err := exec1.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "exec-ran") {
		t.Errorf("nomad alloc exec: %v\n%s", err, out)
	}
	allocs = c.waitAllocs(t, ctx(t, time.Minute), id, "the member to end", allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed))
	if allocs[0].ClientStatus != api.AllocClientStatusComplete {
		t.Errorf("the job ended %s (its proxy and Consul variables reached the supervisor?):\n%s", allocs[0].ClientStatus, c.events(t, allocs[0].ID))
	}
	b, _ := os.ReadFile(log)
	var asRoot, asTask []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		switch {
		case strings.HasPrefix(line, "euid=0 "):
			asRoot = append(asRoot, line)
		case strings.HasPrefix(line, fmt.Sprintf("euid=%d ", nobodyUID(t))):
			asTask = append(asTask, line)
		}
	}
	if len(asRoot) > 0 {
		t.Errorf("the job's LD_PRELOAD library ran as root in %d process(es): %v", len(asRoot), asRoot)
	}
	if len(asTask) == 0 {
		t.Errorf("the library never loaded, even in the ranks (the test would prove nothing): %q", b)
	}
	t.Logf("the hostile library loaded %d times, all as the task's user: %v", len(asTask), asTask)
	c.ordinaryJobStillRuns(t, "e2e-iso-env-after")
}

// TestIsolationHostilePreloadCannotKill is issue 23's second attack: a
// preloaded module makes os.fork report the PID of a root process in
// another session. The supervisor must check the report and kill nothing on
// its word; the job fails saying why.
func TestIsolationHostilePreloadCannotKill(t *testing.T) {
	c := needIsolation(t)
	dir, _ := scratch(t)
	victim := exec.Command("sleep", "300")
	victim.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Process.Kill(); _ = victim.Wait() })
	files := map[string]string{
		"evilz.py": "import os\n_fork = os.fork\n" +
			"def fork():\n    pid = _fork()\n    return pid if pid == 0 else int(os.environ['VICTIM'])\nos.fork = fork\n",
		"main.py": "import time\ntime.sleep(5)\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const id = "e2e-iso-preload"
	job := taskJob(id, "", "", map[string]string{"PYTHONPATH": dir, "VICTIM": strconv.Itoa(victim.Process.Pid)},
		"/usr/bin/python3", filepath.Join(dir, "main.py"))
	job.TaskGroups[0].Tasks[0].Config["preload"] = []string{"evilz"}
	a := c.runToEnd(t, job, 3*time.Minute)
	events := c.events(t, a.ID)
	if a.ClientStatus != api.AllocClientStatusFailed || !strings.Contains(events, "reported process") {
		t.Errorf("the job ended %s; its events do not say the forged report was refused:\n%s", a.ClientStatus, events)
	}
	// The test is the victim's parent: a killed victim stays a zombie
	// until reaped, which a signal 0 would not tell.
	if _, zombie := procStat(victim.Process.Pid); zombie {
		t.Fatalf("the root process %d was killed on the preloaded interpreter's word", victim.Process.Pid)
	}
	c.ordinaryJobStillRuns(t, "e2e-iso-preload-after")
}

// TestIsolationTasksRunOnlyAsAllowedUsers is issue 23's third attack: a
// job names another account of the client. gpujob's own service accounts
// are never allowed, other accounts only when allowed_users (or the
// namespace's namespace_users) lists them; the refusal names the option.
func TestIsolationTasksRunOnlyAsAllowedUsers(t *testing.T) {
	c := needIsolation(t)
	cases := []struct{ user, want string }{
		{"gpujob-gateway", "one of gpujob's own service accounts"},
		{"gpujob-sweep", "one of gpujob's own service accounts"},
		{"messagebus", `allowed_users is ["nobody"]`},
		{"prometheus", `allowed_users is ["nobody"]`},
		{"root", "allow_root = true"},
	}
	for _, tc := range cases {
		if _, err := user.Lookup(tc.user); err != nil {
			continue // not an account of this machine: nothing to steal
		}
		id := "e2e-iso-user-" + strings.ReplaceAll(tc.user, "_", "-")
		a := c.runToEnd(t, taskJob(id, "", tc.user, nil, "/bin/sh", "-c", "id -u"), time.Minute)
		events := c.events(t, a.ID)
		if a.ClientStatus != api.AllocClientStatusFailed || !strings.Contains(events, tc.want) {
			t.Errorf("a job as %s ended %s; events lack %q:\n%s", tc.user, a.ClientStatus, tc.want, events)
		}
	}
	c.ordinaryJobStillRuns(t, "e2e-iso-user-after")
}

// plantJob is a job whose prestart task (raw_exec, as nobody: what any
// job may run) plants script's links and FIFOs in the allocation and prints
// what it managed; with sidecar it keeps running beside the gpujob task
// (and can race its start), else it ends before the gpujob task starts.
func plantJob(id, script string, sidecar bool) *api.Job {
	job := taskJob(id, "", "", nil, "/bin/sh", "-c", "echo trained")
	plant := api.NewTask("plant", "raw_exec").
		SetConfig("command", "/bin/sh").
		SetConfig("args", []string{"-c", script}).
		Require(&api.Resources{CPU: intp(50), MemoryMB: intp(32)})
	plant.User = "nobody"
	plant.Lifecycle = &api.TaskLifecycle{Hook: api.TaskLifecycleHookPrestart, Sidecar: sidecar}
	job.TaskGroups[0].AddTask(plant)
	return job
}

// victims are a root file (mode 0600) and a root directory (mode 0755) a
// hostile job points its links at.
func victims(t *testing.T, dir string) (file, directory string) {
	t.Helper()
	file, directory = filepath.Join(dir, "victim-file"), filepath.Join(dir, "victim-dir")
	if err := os.WriteFile(file, []byte("untouched\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(directory, 0o755); err != nil {
		t.Fatal(err)
	}
	return file, directory
}

// untouched fails t if path changed owner, mode or (for a file) content.
func untouched(t *testing.T, path string, mode os.FileMode, content string) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 0 || fi.Mode() != mode {
		t.Errorf("%s is now UID %d mode %v, was root's %v", path, st.Uid, fi.Mode(), mode)
	}
	if content != "" {
		if b, _ := os.ReadFile(path); string(b) != content {
			t.Errorf("%s now holds %q", path, b)
		}
	}
}

// TestIsolationPlantedLinksAreNotFollowed: a prestart task of the job plants
// symlinks and a FIFO where root used to write or read (the supervisor's
// spec, events, stop deadline and the executor's log in the task's private
// and task directories) and replaces the shared alloc/data directory with a
// link to a root directory. Root must follow none of them: the victims are
// untouched; the planted task directory does not stop the job, the planted
// shared directory refuses it, saying so.
func TestIsolationPlantedLinksAreNotFollowed(t *testing.T) {
	c := needIsolation(t)
	dir, _ := scratch(t)
	file, directory := victims(t, dir)

	// Nomad builds the gpujob task's directory (private/ included, given
	// to nobody) once the prestart sidecar runs, then starts the task: the
	// sidecar waits for the directory and plants at once, racing the
	// driver's start. It usually wins; a run where it planted nothing
	// proves nothing and is tried again.
	script := fmt.Sprintf(`cd "$NOMAD_ALLOC_DIR/.." || exit 0
i=0
while [ ! -d train/private ] && [ $i -lt 3000 ]; do i=$((i+1)); sleep 0.01; done
for p in train/private/gpujob-supervisor.json train/private/gpujob-stop-deadline train/private/gpujob-rank-groups.json train/executor.out; do
  ln -sf %q "$p" 2>/dev/null && echo "planted $p"
done
mkfifo train/private/gpujob-events.jsonl 2>/dev/null && echo "planted fifo"
sleep 120`, file)
	planted := ""
	for attempt := 1; attempt <= 3 && !strings.Contains(planted, "planted"); attempt++ {
		a := c.runToEnd(t, plantJob(fmt.Sprintf("e2e-iso-plant-task-%d", attempt), script, true), 2*time.Minute)
		planted = c.taskLog(t, a.ID, "plant", "stdout")
		t.Logf("attempt %d: the prestart sidecar planted:\n%s", attempt, planted)
		if a.ClientStatus != api.AllocClientStatusComplete {
			t.Errorf("the job with planted links in its task directory ended %s:\n%s", a.ClientStatus, c.events(t, a.ID))
		}
		untouched(t, file, 0o600, "untouched\n")
	}
	if !strings.Contains(planted, "planted") {
		t.Errorf("the sidecar never planted before the task started (the test proved nothing)")
	}

	script = fmt.Sprintf(`rm -rf "$NOMAD_ALLOC_DIR/data" && ln -s %q "$NOMAD_ALLOC_DIR/data" && echo "planted data"; exit 0`, directory)
	a := c.runToEnd(t, plantJob("e2e-iso-plant-shared", script, false), 2*time.Minute)
	if planted := c.taskLog(t, a.ID, "plant", "stdout"); !strings.Contains(planted, "planted data") {
		t.Fatalf("the prestart task could not replace alloc/data (the test proves nothing): %q", planted)
	}
	events := c.events(t, a.ID)
	if a.ClientStatus != api.AllocClientStatusFailed || !strings.Contains(events, "is not a plain directory") {
		t.Errorf("the job whose alloc/data is a link ended %s; events lack the refusal:\n%s", a.ClientStatus, events)
	}
	untouched(t, directory, os.ModeDir|0o755, "")
	c.ordinaryJobStillRuns(t, "e2e-iso-plant-after")
}

// TestIsolationRanksCannotReachTheirSupervisor: a rank (the job's user)
// tries its root supervisor: read its environment and its spec (the
// Consul token), signal it, trace it. Everything is refused.
func TestIsolationRanksCannotReachTheirSupervisor(t *testing.T) {
	c := needIsolation(t)
	script := `sup=$PPID
cat /proc/$sup/environ >/dev/null 2>&1 && echo "ATTACK read-environ" || echo "denied environ"
kill -0 $sup 2>/dev/null && echo "ATTACK signal" || echo "denied signal"
spec=$(tr '\0' '\n' < /proc/$sup/cmdline | tail -n 1)
cat "$spec" >/dev/null 2>&1 && echo "ATTACK read-spec $spec" || echo "denied spec"
SUP=$sup python3 -c 'import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("ATTACK ptrace" if libc.ptrace(16, int(os.environ["SUP"]), 0, 0) == 0 else "denied ptrace")'`
	a := c.runToEnd(t, taskJob("e2e-iso-supervisor", "", "", nil, "/bin/sh", "-c", script), 2*time.Minute)
	out := c.taskLog(t, a.ID, "train", "stdout")
	for _, want := range []string{"denied environ", "denied signal", "denied spec", "denied ptrace"} {
		if !strings.Contains(out, want) {
			t.Errorf("the rank's report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "ATTACK") {
		t.Errorf("a rank reached its supervisor:\n%s", out)
	}
}

// ensureTenants makes the tenants' Unix users and Nomad namespaces.
func (c *cluster) ensureTenants(t *testing.T) {
	t.Helper()
	for _, u := range []string{tenantAUser, tenantBUser} {
		if _, err := user.Lookup(u); err == nil {
			continue
		}
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", u).CombinedOutput(); err != nil {
			t.Fatalf("useradd %s: %v\n%s", u, err, out)
		}
	}
	for _, ns := range []string{tenantA, tenantB} {
		if _, err := c.nomad.Namespaces().Register(&api.Namespace{Name: ns, Description: "e2e tenant"}, nil); err != nil {
			t.Fatalf("creating namespace %s: %v", ns, err)
		}
	}
}

// TestIsolationTenantsCannotReachEachOther: tenant A's job (namespace
// gj-team-a, so user gjtenant-a) keeps a secret in its secrets/ and
// checkpoints, and runs a rank; tenant B's job (gjtenant-b) tries to read
// them, to signal A's rank and read its environment. Everything is refused.
// A's namespace cannot borrow B's user either.
func TestIsolationTenantsCannotReachEachOther(t *testing.T) {
	c := needIsolation(t)
	c.ensureTenants(t)
	_, writable := scratch(t)
	ready := filepath.Join(writable, "a-ready")
	aScript := fmt.Sprintf(`echo "s3cret" > "$NOMAD_SECRETS_DIR/secret"
echo "ckpt" > "$GPUJOB_CHECKPOINT_DIR/state"
echo "$NOMAD_SECRETS_DIR/secret $GPUJOB_CHECKPOINT_DIR/state $$" > %q
sleep 30`, ready)
	a := taskJob("e2e-iso-tenant-a", tenantA, "", map[string]string{"A_PRIVATE": "a-env-secret"}, "/bin/sh", "-c", aScript)
	c.registerIn(t, a)
	var paths []string
	if err := waitFor(time.Minute, func() bool {
		b, err := os.ReadFile(ready)
		paths = strings.Fields(string(b))
		return err == nil && len(paths) == 3
	}); err != nil {
		t.Fatalf("tenant A's job did not start: %v", err)
	}
	bScript := `cat "$A_SECRET" >/dev/null 2>&1 && echo "ATTACK secret" || echo "denied secret"
cat "$A_CKPT" >/dev/null 2>&1 && echo "ATTACK checkpoint" || echo "denied checkpoint"
kill -0 "$A_PID" 2>/dev/null && echo "ATTACK signal" || echo "denied signal"
tr '\0' '\n' < /proc/$A_PID/environ 2>/dev/null | grep -q a-env-secret && echo "ATTACK environ" || echo "denied environ"
id -un`
	b := taskJob("e2e-iso-tenant-b", tenantB, "", map[string]string{"A_SECRET": paths[0], "A_CKPT": paths[1], "A_PID": paths[2]},
		"/bin/sh", "-c", bScript)
	ab := c.runToEnd(t, b, 2*time.Minute)
	out := c.taskLog(t, ab.ID, "train", "stdout")
	for _, want := range []string{"denied secret", "denied checkpoint", "denied signal", "denied environ", tenantBUser} {
		if !strings.Contains(out, want) {
			t.Errorf("tenant B's report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "ATTACK") {
		t.Errorf("tenant B reached tenant A:\n%s", out)
	}
	// A's namespace cannot run as B's user.
	borrow := c.runToEnd(t, taskJob("e2e-iso-tenant-borrow", tenantA, tenantBUser, nil, "/bin/sh", "-c", "id -un"), time.Minute)
	if ev := c.events(t, borrow.ID); borrow.ClientStatus != api.AllocClientStatusFailed ||
		!strings.Contains(ev, fmt.Sprintf(`namespace_users[%q] is [%q]`, tenantA, tenantAUser)) {
		t.Errorf("a job of %s as %s ended %s:\n%s", tenantA, tenantBUser, borrow.ClientStatus, ev)
	}
}

// TestIsolationForkBombIsContained: a rank that starts processes without
// end gets at most the driver's pids_limit (the dev cluster's is 512); the
// bomb is bounded (1000 sleeps) so that a missing limit fails the test
// without harming the machine.
func TestIsolationForkBombIsContained(t *testing.T) {
	c := needIsolation(t)
	py := `import subprocess
started, failed = [], 0
for i in range(1000):
    try:
        started.append(subprocess.Popen(["sleep", "20"]))
    except OSError:
        failed += 1
print("started", len(started), "failed", failed, flush=True)
for p in started:
    p.kill()
    p.wait()
`
	a := c.runToEnd(t, taskJob("e2e-iso-forkbomb", "", "", nil, "/usr/bin/python3", "-c", py), 2*time.Minute)
	out := c.taskLog(t, a.ID, "train", "stdout")
	var started, failed int
	if _, err := fmt.Sscanf(lastLine(out, "started "), "started %d failed %d", &started, &failed); err != nil {
		t.Fatalf("the rank's report: %v\n%s\nstderr:\n%s\n%s", err, out, c.taskLog(t, a.ID, "train", "stderr"), c.events(t, a.ID))
	}
	if started >= isolationPidsLimit || failed == 0 {
		t.Errorf("the rank started %d of 1000 processes (%d refused), want the rest refused past pids_limit %d", started, failed, isolationPidsLimit)
	}
	c.ordinaryJobStillRuns(t, "e2e-iso-forkbomb-after")
}

// TestIsolationHugeEnvironmentFailsCleanly: a job whose environment holds a
// variable over Linux's limit for one (128 KiB) fails with the kernel's
// reason in its events, and the driver goes on serving.
func TestIsolationHugeEnvironmentFailsCleanly(t *testing.T) {
	c := needIsolation(t)
	env := map[string]string{"HUGE": strings.Repeat("x", 200<<10)}
	for i := 0; i < 2000; i++ {
		env[fmt.Sprintf("MANY_%d", i)] = strings.Repeat("y", 64)
	}
	a := c.runToEnd(t, taskJob("e2e-iso-huge-env", "", "", env, "/bin/sh", "-c", "echo started"), 2*time.Minute)
	if ev := c.events(t, a.ID); a.ClientStatus != api.AllocClientStatusFailed || !strings.Contains(ev, "argument list too long") {
		t.Errorf("the job with a 200 KiB variable ended %s; events lack the kernel's reason:\n%s", a.ClientStatus, ev)
	}
	c.ordinaryJobStillRuns(t, "e2e-iso-huge-env-after")
}

// lastLine is the last line of s that starts with prefix.
func lastLine(s, prefix string) string {
	var last string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			last = sc.Text()
		}
	}
	return last
}
