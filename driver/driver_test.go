package driver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/helper/testlog"
	"github.com/hashicorp/nomad/helper/uuid"
	"github.com/hashicorp/nomad/nomad/structs"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	dtestutil "github.com/hashicorp/nomad/plugins/drivers/testutils"
	mtesting "github.com/mitchellh/go-testing-interface"

	"github.com/gpujob/gpujob/driver/supervisor"
	"github.com/gpujob/gpujob/internal/taskevent"
	"github.com/gpujob/gpujob/internal/testagent"
	"github.com/gpujob/gpujob/internal/testpriv"
)

// testConsul is the Consul agent of the tests that run tasks, started by
// the first of them (consulAddr) and stopped by TestMain: the fuzz targets'
// worker processes run TestMain too and need none.
var testConsul testagent.Lazy

// consulAddr returns the test Consul agent's address, starting it on first
// use.
func consulAddr(t testingT) string {
	t.Helper()
	agent, err := testConsul.Start()
	if err != nil {
		t.Fatalf("driver tests need a real Consul: %v", err)
	}
	return agent.Addr
}

// testingT is what Nomad's driver harness takes; *testing.T is one, and
// benchT makes a *testing.B one.
type testingT = mtesting.T

type benchT struct{ *testing.B }

func (benchT) Parallel() {}

func TestMain(m *testing.M) {
	// The executor runs this test binary as the supervisor, as the real
	// driver runs its own binary.
	if len(os.Args) == 3 && os.Args[1] == SuperviseCommand {
		os.Exit(supervisor.Main(os.Args[2]))
	}
	if len(os.Args) > 1 && os.Args[1] == supervisor.RunAsCommand {
		os.Exit(supervisor.RunAsMain(os.Args[2:]))
	}
	os.Exit(testConsul.Main(m))
}

// harness is a driver behind Nomad's gRPC plugin boundary, configured for
// the test Consul.
func harness(t testingT, cfg Config) *dtestutil.DriverHarness {
	t.Helper()
	return harnessWith(t, cfg, func(*Driver) {})
}

// harnessWith is harness with the driver adjusted by tweak first.
func harnessWith(t testingT, cfg Config, tweak func(*Driver)) *dtestutil.DriverHarness {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d := New(testlog.HCLogger(t), self)
	// The tasks' state directories and container run directories go to
	// the test's own, not the machine's /run/gpujob.
	d.runRoot = t.TempDir()
	tweak(d)
	// No h.Kill on cleanup: it stops the in-memory gRPC server while
	// go-plugin's own shutdown handler does the same, a data race inside
	// go-plugin v1.4.10 that -race reports. The server dies with the test
	// binary; every task is destroyed by its test.
	h := dtestutil.NewDriverHarness(t, d)
	if cfg.Consul == nil {
		cfg.Consul = &ConsulConfig{Address: consulAddr(t)}
	}
	if cfg.CheckpointRoot == "" {
		cfg.CheckpointRoot = t.TempDir()
	}
	// The tests' ranks write to the test's own temporary directories,
	// which only the test's user can enter: they run as that user unless
	// a test says otherwise (TestTaskRunsAsItsUser runs them as nobody).
	if cfg.DefaultUser == "" && os.Geteuid() == 0 {
		cfg.DefaultUser, cfg.AllowRoot = "root", true
	}
	var data []byte
	if err := base.MsgPackEncode(&data, &cfg); err != nil {
		t.Fatal(err)
	}
	if err := h.SetConfig(&base.Config{PluginConfig: data}); err != nil {
		t.Fatal(err)
	}
	return h
}

// member is one allocation's task of a group: job.g[index], with its
// rendezvous port on loopback.
func member(t testingT, h *dtestutil.DriverHarness, job string, index, port int, tc TaskConfig) *drivers.TaskConfig {
	t.Helper()
	return memberTask(t, h, job, index, port, "train", tc)
}

// memberTask is member with the task named task.
func memberTask(t testingT, h *dtestutil.DriverHarness, job string, index, port int, task string, tc TaskConfig) *drivers.TaskConfig {
	t.Helper()
	cfg := &drivers.TaskConfig{
		ID:            uuid.Generate(),
		AllocID:       uuid.Generate(),
		Name:          task,
		JobName:       job,
		JobID:         job,
		TaskGroupName: "g",
		Namespace:     "default",
		Env:           map[string]string{"NOMAD_ALLOC_NAME": fmt.Sprintf("%s.g[%d]", job, index), "NOMAD_ALLOC_INDEX": fmt.Sprint(index)},
		Resources: &drivers.Resources{
			NomadResources: &structs.AllocatedTaskResources{},
			Ports:          &structs.AllocatedPorts{{Label: "rdzv", Value: port, HostIP: "127.0.0.1"}},
		},
	}
	if err := cfg.EncodeConcreteDriverConfig(&tc); err != nil {
		t.Fatal(err)
	}
	destroy := h.MkAllocDir(cfg, true)
	// The harness removes the alloc dir but not the temporary dir it made
	// for it; cleanups run last-in first-out, so this one runs after.
	parent := filepath.Dir(cfg.AllocDir)
	t.Cleanup(func() { os.Remove(parent) })
	t.Cleanup(destroy)
	return cfg
}

// startAll starts every member and returns their exit results in order.
func startAll(t testingT, h *dtestutil.DriverHarness, cfgs []*drivers.TaskConfig, timeout time.Duration) []*drivers.ExitResult {
	t.Helper()
	var waits []<-chan *drivers.ExitResult
	for _, cfg := range cfgs {
		if _, _, err := h.StartTask(cfg); err != nil {
			t.Fatalf("starting %s: %v", cfg.Env["NOMAD_ALLOC_NAME"], err)
		}
		t.Cleanup(func() { _ = h.DestroyTask(cfg.ID, true) })
		ch, err := h.WaitTask(context.Background(), cfg.ID)
		if err != nil {
			t.Fatal(err)
		}
		waits = append(waits, ch)
	}
	var out []*drivers.ExitResult
	for i, ch := range waits {
		select {
		case r := <-ch:
			out = append(out, r)
		case <-time.After(timeout):
			t.Fatalf("%s did not exit within %s", cfgs[i].Env["NOMAD_ALLOC_NAME"], timeout)
		}
	}
	return out
}

// logOf reads a task's log once it satisfies ready: logmon copies the
// task's output to the file asynchronously, so a task that exited may not be
// in its log yet.
func logOf(t testingT, cfg *drivers.TaskConfig, stream string, ready func(string) bool) string {
	t.Helper()
	path := filepath.Join(cfg.TaskDir().LogDir, cfg.Name+"."+stream+".0")
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if ready(string(b)) || time.Now().After(deadline) {
			return string(b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lines(n int) func(string) bool {
	return func(s string) bool { return strings.Count(s, "\n") >= n }
}

func stderr(t testingT, cfg *drivers.TaskConfig) string {
	return logOf(t, cfg, "stderr", lines(1))
}

// ports returns n free loopback ports.
func ports(t testingT, n int) []int {
	var out []int
	for i := 0; i < n; i++ {
		addr, err := freeLoopbackAddr()
		if err != nil {
			t.Fatal(err)
		}
		var p int
		fmt.Sscanf(addr[strings.LastIndex(addr, ":")+1:], "%d", &p)
		out = append(out, p)
	}
	return out
}

// consulEmpty fails the test if anything of run is left in Consul.
func consulEmpty(t testingT, run string) {
	t.Helper()
	c, err := consul.NewClient(&consul.Config{Address: consulAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	keys, _, err := c.KV().Keys("gpujob/rendezvous/"+run, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("keys left in Consul: %v", keys)
	}
	sessions, _, err := c.Session().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Only this run's: a test that kills a supervisor leaves its session
	// to expire with its TTL.
	var names []string
	for _, s := range sessions {
		if strings.Contains(s.Name, " "+run+" ") {
			names = append(names, s.Name)
		}
	}
	if len(names) != 0 {
		t.Errorf("sessions left in Consul: %v", names)
	}
}

func TestFingerprintFollowsConsul(t *testing.T) {
	h := harness(t, Config{})
	ch, err := h.Fingerprint(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fp := <-ch
	if fp.Health != drivers.HealthStateHealthy {
		t.Fatalf("health %s: %s", fp.Health, fp.HealthDescription)
	}
	if v, ok := fp.Attributes["driver.gpujob"]; !ok || *v.Bool != true {
		t.Errorf("attributes %v lack driver.gpujob", fp.Attributes)
	}

	down := harness(t, Config{Consul: &ConsulConfig{Address: "127.0.0.1:1"}})
	ch, err = down.Fingerprint(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fp = <-ch
	if fp.Health != drivers.HealthStateUnhealthy || !strings.Contains(fp.HealthDescription, "127.0.0.1:1") {
		t.Fatalf("with Consul down: health %s %q, want unhealthy naming the address", fp.Health, fp.HealthDescription)
	}
}

func TestFingerprintNeedsTheDefaultUser(t *testing.T) {
	testpriv.NeedRoot(t, "default_user applies on a root client only")
	h := harness(t, Config{DefaultUser: "no-such-user-gj", AllowedUsers: []string{"no-such-user-gj"}})
	ch, err := h.Fingerprint(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fp := <-ch
	if fp.Health != drivers.HealthStateUnhealthy || !strings.Contains(fp.HealthDescription, `default_user "no-such-user-gj" does not exist`) {
		t.Fatalf("health %s %q, want unhealthy naming the missing default_user", fp.Health, fp.HealthDescription)
	}
}

func TestGroupGetsRanksAndSucceeds(t *testing.T) {
	h := harness(t, Config{})
	p := ports(t, 2)
	tc := TaskConfig{Command: "/bin/sh", NProcPerNode: 2, MaxRestarts: 1,
		Args:       []string{"-c", `echo "rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE node=$GROUP_RANK master=$MASTER_ADDR:$MASTER_PORT ckpt=$GPUJOB_CHECKPOINT_DIR"`},
		Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv", JoinTimeout: "30s"}}
	cfgs := []*drivers.TaskConfig{member(t, h, "ranks", 0, p[0], tc), member(t, h, "ranks", 1, p[1], tc)}
	for i, r := range startAll(t, h, cfgs, 60*time.Second) {
		if !r.Successful() {
			t.Fatalf("member %d exited %+v; stderr:\n%s", i, r, stderr(t, cfgs[i]))
		}
	}
	var ranks, masters []string
	for _, cfg := range cfgs {
		out := logOf(t, cfg, "stdout", lines(2))
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line) // "[rank N]" prefix, then the fields
			if len(f) < 7 {
				t.Fatalf("unexpected line %q", line)
			}
			ranks = append(ranks, f[2])
			masters = append(masters, f[6])
			if f[4] != "world=4" {
				t.Errorf("line %q: world size is not 4", line)
			}
		}
	}
	sort.Strings(ranks)
	if strings.Join(ranks, " ") != "rank=0 rank=1 rank=2 rank=3" {
		t.Errorf("ranks %v, want 0..3 once each", ranks)
	}
	for _, m := range masters {
		if m != masters[0] {
			t.Errorf("members disagree on the master: %v", masters)
			break
		}
	}
	consulEmpty(t, "default/ranks")
}

func TestGroupRestartsWhenARankFails(t *testing.T) {
	h := harness(t, Config{})
	p := ports(t, 2)
	// Rank 2 fails in the first round; every rank runs again, once. The
	// other first-round ranks outlast the news of the failure (the
	// restart stops them): ending in 0.5 s, member 0 once finished before
	// it heard, on a loaded machine, and round 2 never formed.
	tc := TaskConfig{Command: "/bin/sh", NProcPerNode: 2, MaxRestarts: 2,
		Args: []string{"-c", `echo "gen=$GPUJOB_GENERATION restarts=$TORCHELASTIC_RESTART_COUNT rank=$RANK"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 2 ]; then exit 7; fi
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then sleep 30; else sleep 0.5; fi`},
		Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv", JoinTimeout: "30s"}}
	cfgs := []*drivers.TaskConfig{member(t, h, "restart", 0, p[0], tc), member(t, h, "restart", 1, p[1], tc)}
	events, err := h.TaskEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range startAll(t, h, cfgs, 90*time.Second) {
		if !r.Successful() {
			t.Fatalf("member %d exited %+v; stderr:\n%s", i, r, stderr(t, cfgs[i]))
		}
	}
	round2 := func(s string) bool { return strings.Count(s, "gen=2") == 2 }
	all := logOf(t, cfgs[0], "stdout", round2) + logOf(t, cfgs[1], "stdout", round2)
	if n := strings.Count(all, "gen=2 restarts=1"); n != 4 {
		t.Errorf("%d ranks ran in round 2, want all 4:\n%s", n, all)
	}
	var msgs []string
	timeout := time.After(5 * time.Second)
collect:
	for {
		select {
		case e := <-events:
			msgs = append(msgs, e.Message)
			te, ok := taskevent.Decode(e.Annotations)
			if !ok {
				t.Fatalf("event %q carries no structured details: %v", e.Message, e.Annotations)
			}
			if te.Kind == taskevent.Restarting && !te.Remote {
				want := taskevent.Failure{Member: "restart.g[1]", Reason: "rank 2 exited 7", ExitCode: 7}
				if te.Failure != want || te.Restarts != 0 || te.MaxRestarts != 2 || te.Describe() != e.Message {
					t.Errorf("restart event %+v, message %q", te, e.Message)
				}
				break collect
			}
		case <-timeout:
			t.Fatalf("no task event tells of the restart; events:\n%s", strings.Join(msgs, "\n"))
		}
	}
	consulEmpty(t, "default/restart")
}

func TestJoinTimeoutNamesTheMissingMember(t *testing.T) {
	h := harness(t, Config{})
	p := ports(t, 1)
	tc := TaskConfig{Command: "/bin/true",
		Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv", JoinTimeout: "2s"}}
	cfg := member(t, h, "lonely", 0, p[0], tc)
	events, err := h.TaskEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := startAll(t, h, []*drivers.TaskConfig{cfg}, 30*time.Second)[0]
	if r.Successful() {
		t.Fatal("a group missing a member succeeded")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("join timeout of 2s took %s", d)
	}
	select {
	case e := <-events:
		if !strings.Contains(e.Message, "never joined: lonely.g[1]") {
			t.Errorf("task event %q does not name the missing member lonely.g[1]", e.Message)
		}
	case <-time.After(5 * time.Second):
		t.Error("no task event for the failed join")
	}
	// The same words reach the task's stderr.
	if msg := logOf(t, cfg, "stderr", func(s string) bool { return strings.Contains(s, "lonely.g[1]") }); !strings.Contains(msg, "lonely.g[1]") {
		t.Errorf("stderr does not name the missing member lonely.g[1]:\n%s", msg)
	}
	consulEmpty(t, "default/lonely")
}

func TestRunningTaskStatsSignalAndExec(t *testing.T) {
	h := harness(t, Config{})
	out := t.TempDir()
	// Each local rank records the signals it gets.
	tc := TaskConfig{Command: "/bin/sh", NProcPerNode: 2,
		Args: []string{"-c", `trap 'echo usr1 >> "$OUT/sig.$RANK"' USR1; touch "$OUT/up.$RANK"; while :; do sleep 0.1; done`},
		Env:  []map[string]string{{"OUT": out}}}
	cfg := member(t, h, "running", 0, ports(t, 1)[0], tc)
	if _, _, err := h.StartTask(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.DestroyTask(cfg.ID, true) })
	if err := h.WaitUntilStarted(cfg.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The ranks start after the (single-member) rendezvous: wait for them
	// (a signal that arrives before the supervisor's Go runtime has set up
	// its handlers would end it, as for any program).
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err0 := os.Stat(filepath.Join(out, "up.0"))
		_, err1 := os.Stat(filepath.Join(out, "up.1"))
		if err0 == nil && err1 == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ranks did not start; stderr:\n%s", stderr(t, cfg))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		if err := h.SignalTask(cfg.ID, "SIGUSR1"); err != nil {
			st, _ := h.InspectTask(cfg.ID)
			ex, _ := os.ReadFile(filepath.Join(cfg.TaskDir().Dir, "executor.out"))
			t.Fatalf("signal: %v; status %+v %+v; stderr:\n%s\nexecutor:\n%s", err, st, st.ExitResult, stderr(t, cfg), ex[max(0, len(ex)-3000):])
		}
		a, _ := os.ReadFile(filepath.Join(out, "sig.0"))
		b, _ := os.ReadFile(filepath.Join(out, "sig.1"))
		if len(a) > 0 && len(b) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("SIGUSR1 to the task never reached both ranks")
		}
		time.Sleep(100 * time.Millisecond)
	}

	res, err := h.ExecTask(cfg.ID, []string{"/bin/sh", "-c", "echo exec-ok"}, 10*time.Second)
	if err != nil || !res.ExitResult.Successful() || !strings.Contains(string(res.Stdout), "exec-ok") {
		t.Fatalf("exec: %v %+v", err, res)
	}

	var ctx context.Context
	var cancel context.CancelFunc
	var stats <-chan *drivers.TaskResourceUsage
	// The executor rescans the process tree every few seconds: wait until
	// the sample covers the supervisor and both ranks.
	ctx, cancel = context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	stats, err = h.TaskStats(ctx, cfg.ID, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	pids := 0
	for pids < 3 {
		select {
		case u := <-stats:
			if u == nil || u.ResourceUsage == nil || u.ResourceUsage.MemoryStats == nil || u.ResourceUsage.MemoryStats.RSS == 0 {
				t.Fatalf("task stats without memory usage: %+v", u)
			}
			pids = len(u.Pids)
		case <-ctx.Done():
			t.Fatalf("task stats cover %d processes, want the supervisor and every rank", pids)
		}
	}

	if err := h.StopTask(cfg.ID, 5*time.Second, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	status, err := h.InspectTask(cfg.ID)
	if err != nil || status.State != drivers.TaskStateExited {
		t.Fatalf("after stop: %v %+v", err, status)
	}
	consulEmpty(t, "default/running")
}

// withoutCgroups is a client that is not root: the executor puts no cgroup
// around the task and only kills the supervisor's process group.
func withoutCgroups(d *Driver) { d.cgroups = false }

// leftovers are the processes a test's ranks wrote to OUT/<name>.<rank>.
func leftovers(t *testing.T, out string) []int {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(out, "*.*"))
	var pids []int
	for _, f := range files {
		b, _ := os.ReadFile(f)
		var pid int
		if _, err := fmt.Sscan(string(b), &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// alive are those of pids still running (zombies have exited).
func alive(pids []int) []int {
	var out []int
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil && !supervisor.IsZombie(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// startRanksWithChildren starts a one-member task whose two ranks each
// leave a child in their process group; it returns when the ranks and
// children have written their PIDs (4 files in out).
func startRanksWithChildren(t *testing.T, h *dtestutil.DriverHarness, job, script string) (*drivers.TaskConfig, string) {
	t.Helper()
	out := t.TempDir()
	tc := TaskConfig{Command: "/bin/sh", NProcPerNode: 2, Args: []string{"-c", script}, Env: []map[string]string{{"OUT": out}}}
	cfg := member(t, h, job, 0, ports(t, 1)[0], tc)
	if _, _, err := h.StartTask(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.DestroyTask(cfg.ID, true) })
	deadline := time.Now().Add(15 * time.Second)
	for len(leftovers(t, out)) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("ranks did not start; stderr:\n%s", stderr(t, cfg))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return cfg, out
}

// noneAlive fails the test unless every PID is gone within wait.
func noneAlive(t *testing.T, pids []int, wait time.Duration) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for len(alive(pids)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if left := alive(pids); len(left) > 0 {
		t.Errorf("processes outlived the task: %v", left)
		for _, pid := range left {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func TestKilledSupervisorLeavesNoRank(t *testing.T) {
	h := harnessWith(t, Config{}, withoutCgroups)
	// A job of its own per run: the killed member's session outlives the
	// test by its TTL.
	cfg, out := startRanksWithChildren(t, h, "orphans-"+uuid.Short(),
		`sleep 300 & echo $! > "$OUT/child.$RANK"; echo $$ > "$OUT/rank.$RANK"; wait`)
	status, err := h.InspectTask(cfg.ID)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscan(status.DriverAttributes["pid"], &pid)
	if pid <= 1 {
		t.Fatalf("no supervisor pid in %v", status.DriverAttributes)
	}
	wait, err := h.WaitTask(context.Background(), cfg.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-wait:
		if r.Successful() {
			t.Errorf("a killed supervisor exited successfully: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the task did not end when its supervisor was killed")
	}
	noneAlive(t, leftovers(t, out), 2*time.Second)
}

func TestStopEndsRanksThatIgnoreSIGTERMWithinTheTimeout(t *testing.T) {
	h := harnessWith(t, Config{}, withoutCgroups)
	// SIG_IGN is inherited: the ranks' children ignore SIGTERM too.
	job := "stubborn-" + uuid.Short()
	cfg, out := startRanksWithChildren(t, h, job,
		`trap "" TERM; sleep 300 & echo $! > "$OUT/child.$RANK"; echo $$ > "$OUT/rank.$RANK"; while :; do sleep 0.1; done`)
	pids := leftovers(t, out)
	const timeout = 3 * time.Second
	start := time.Now()
	if err := h.StopTask(cfg.ID, timeout, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > timeout+time.Second {
		t.Errorf("stop took %s with a %s timeout", took, timeout)
	}
	noneAlive(t, pids, 0)
	status, err := h.InspectTask(cfg.ID)
	if err != nil || status.ExitResult == nil || status.ExitResult.ExitCode != supervisor.ExitStopped {
		t.Errorf("after stop: %v %+v; stderr:\n%s", err, status.ExitResult, stderr(t, cfg))
	}
	consulEmpty(t, "default/"+job)
}

// TestTaskRunsAsItsUser is the driver's default on a root client: the ranks
// and `nomad alloc exec` run as nobody, the checkpoint directory is
// nobody's, the spec with the Consul token is not, and root is refused.
func TestTaskRunsAsItsUser(t *testing.T) {
	testpriv.NeedRoot(t, "running tasks as another user")
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	// t.TempDir's directories are root's, mode 0700: nobody could not
	// reach the checkpoints below. A real checkpoint_root is 0755.
	os.Chmod(filepath.Dir(ckpt), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(ckpt)), 0o755)
	h := harness(t, Config{DefaultUser: "nobody", CheckpointRoot: ckpt})
	tc := TaskConfig{Command: "/bin/sh", NProcPerNode: 2,
		Args: []string{"-c", `echo "$(id -u) $(id -G) home=$HOME user=$USER flag=$MY_FLAG" > "$GPUJOB_CHECKPOINT_DIR/ids.$RANK"
spec=$(tr '\0' '\n' < /proc/$PPID/cmdline | tail -n 1)
cat "$spec" >/dev/null 2>&1 && echo "read the spec at $spec" > "$GPUJOB_CHECKPOINT_DIR/leak.$RANK"
while :; do sleep 0.1; done`}}
	cfg := member(t, h, "as-nobody", 0, ports(t, 1)[0], tc)
	// The job's environment reaches the ranks, never the root supervisor.
	cfg.Env["MY_FLAG"] = "from-the-job"
	cfg.Env["LD_PRELOAD"] = "/nonexistent/hostile.so"
	// The harness's alloc dir is under a 0700 temporary directory; a
	// client's data_dir/alloc is 0711.
	os.Chmod(filepath.Dir(cfg.AllocDir), 0o711)
	if _, _, err := h.StartTask(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.DestroyTask(cfg.ID, true) })
	dir := filepath.Join(ckpt, "default", "as-nobody")
	deadline := time.Now().Add(15 * time.Second)
	for {
		a, _ := os.ReadFile(filepath.Join(dir, "ids.0"))
		b, _ := os.ReadFile(filepath.Join(dir, "ids.1"))
		if len(a) > 0 && len(b) > 0 {
			want := "65534 65534 home=" + filepath.Join(cfg.TaskDir().Dir, "local") + " user=nobody flag=from-the-job\n"
			if string(a) != want || string(b) != want {
				t.Fatalf("ranks ran as %q and %q, want %q", a, b, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ranks did not start; stderr:\n%s", stderr(t, cfg))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if leaks, _ := filepath.Glob(filepath.Join(dir, "leak.*")); len(leaks) > 0 {
		b, _ := os.ReadFile(leaks[0])
		t.Errorf("a rank read the supervisor's spec (and the Consul token in it): %s", b)
	}
	// The task's own directories are the ranks' user's alone; private/
	// (Nomad's) root's.
	for _, d := range []string{"", "local", "secrets", "tmp"} {
		if uid, mode := owner(t, filepath.Join(cfg.TaskDir().Dir, d)); uid != 65534 || mode.Perm() != 0o700 {
			t.Errorf("task dir %q: UID %d mode %v, want nobody's 0700", d, uid, mode)
		}
	}
	if uid, mode := owner(t, filepath.Join(cfg.AllocDir, "alloc", "data")); uid != 65534 || mode.Perm() != 0o700 {
		t.Errorf("alloc/data: UID %d mode %v, want nobody's 0700", uid, mode)
	}
	if uid, mode := owner(t, dir); uid != 65534 || mode.Perm() != 0o700 {
		t.Errorf("checkpoint dir: UID %d mode %v, want nobody's 0700", uid, mode)
	}
	if uid, mode := owner(t, filepath.Join(cfg.TaskDir().Dir, "private")); uid != 0 || mode.Perm() != 0o700 {
		t.Errorf("private dir: UID %d mode %v, want root's 0700", uid, mode)
	}
	// The supervisor itself stays root: it holds the token.
	status, _ := h.InspectTask(cfg.ID)
	var pid int
	fmt.Sscan(status.DriverAttributes["pid"], &pid)
	if uid := procUID(t, pid); uid != 0 {
		t.Errorf("the supervisor runs as UID %d, want root", uid)
	}
	// ... with an environment of the driver's making, nothing of the job's.
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Split(strings.TrimRight(string(environ), "\x00"), "\x00"), supervisor.RootEnv(cfg.AllocID, cfg.Name); !reflect.DeepEqual(got, want) {
		t.Errorf("the supervisor's environment is %q, want only %q", got, want)
	}
	// nomad alloc exec runs as the task's user too.
	res, err := h.ExecTask(cfg.ID, []string{"/bin/sh", "-c", "id -u; id -G; echo $MY_FLAG"}, 10*time.Second)
	if err != nil || !res.ExitResult.Successful() {
		t.Fatalf("exec: %v %+v", err, res)
	}
	var lines []string // without the loader's complaint about the task's (missing) LD_PRELOAD
	for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		if !strings.HasPrefix(l, "ERROR: ld.so:") {
			lines = append(lines, l)
		}
	}
	if got := strings.Join(lines, " "); got != "65534 65534 from-the-job" {
		t.Errorf("exec ran as %q, want nobody with nobody's group alone and the task's environment", res.Stdout)
	}
	if err := h.StopTask(cfg.ID, 5*time.Second, "SIGTERM"); err != nil {
		t.Fatal(err)
	}

	// Root is refused without allow_root, in words that name the knob.
	rootTask := member(t, h, "as-root", 0, ports(t, 1)[0], tc)
	rootTask.User = "root"
	_, _, err = h.StartTask(rootTask)
	if err == nil || !strings.Contains(err.Error(), "allow_root = true") {
		t.Fatalf("a root task: %v, want a refusal naming allow_root", err)
	}
	if _, err := os.Stat(filepath.Join(ckpt, "default", "as-root")); !os.IsNotExist(err) {
		t.Errorf("the refused task got a checkpoint directory: %v", err)
	}
}

// procUID is the real UID of a process.
func procUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			var uid int
			fmt.Sscan(f[1], &uid)
			return uid
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return -1
}

// TestPidsLimitBoundsAForkBomb: a rank that starts processes without end
// is held to the driver's pids_limit (the supervisor's cgroup), and the
// machine's other processes are untouched. The bomb is bounded (200
// sleeps), so a missing limit fails the test without harming the machine.
func TestPidsLimitBoundsAForkBomb(t *testing.T) {
	testpriv.NeedRoot(t, "cgroups")
	h := harness(t, Config{PidsLimit: 64})
	dir := t.TempDir()
	py := `import os, subprocess
started, failed = [], 0
for i in range(200):
    try:
        started.append(subprocess.Popen(["sleep", "30"]))
    except OSError:
        failed += 1
with open(os.path.join(DIR, "started"), "w") as f:
    f.write("%d %d" % (len(started), failed))
with open("/proc/self/cgroup") as f, open(os.path.join(DIR, "cgroup"), "w") as out:
    out.write(f.read())
for p in started:
    p.kill()
    p.wait()
`
	tc := TaskConfig{Command: "/usr/bin/python3", Args: []string{"-c", "DIR = " + strconv.Quote(dir) + "\n" + py}}
	cfg := member(t, h, "bomb", 0, ports(t, 1)[0], tc)
	res := startAll(t, h, []*drivers.TaskConfig{cfg}, 60*time.Second)
	b, err := os.ReadFile(filepath.Join(dir, "started"))
	if err != nil {
		t.Fatalf("the rank did not report: %v; exit %+v; stdout:\n%s\nstderr:\n%s", err, res[0], logOf(t, cfg, "stdout", lines(1)), stderr(t, cfg))
	}
	var started, failed int
	fmt.Sscan(string(b), &started, &failed)
	if started >= 64 || started == 0 || failed == 0 {
		t.Errorf("the rank started %d of 200 processes (%d failed), want fewer than pids_limit 64 (and some)", started, failed)
	}
	cg, _ := os.ReadFile(filepath.Join(dir, "cgroup"))
	if !strings.Contains(string(cg), "gpujob-") {
		t.Errorf("the rank's pids cgroup is %q, not the task's", cg)
	}
}
