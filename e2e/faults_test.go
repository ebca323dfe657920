package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// The fault matrix: one test per row of the table in docs/operations/fault-tolerance.md. Each row trains
// the real workload with two workers, hits it with one fault once it has
// written a checkpoint, asserts what its row promises (how many group
// restarts, if any), and then the same three things:
//
//   - the accuracy of a fault-free run of the same workload, within 0.5
//     point (the bar TestTrainingScalesAcrossWorkersWithTheSameModel holds
//     1 and N workers to);
//   - no checkpoint lost: a restarted group resumes from the newest
//     checkpoint there was when the fault hit, or a later one, and a group
//     that was not restarted never resumed at all;
//   - nothing of the job left (assertNoLeaks): no process, Consul session or
//     rendezvous key.

// faultArgs is every row's workload: few steps for CI's two cores, slowed
// down enough that a fault at the first checkpoint (step 20) lands with most
// of the training still to come, and the resumed group checkpoints again.
var faultArgs = []string{"--steps", "240", "--sleep-per-step", "0.05"}

// accuracyBar is how far a faulted run's accuracy may be from the fault-free
// run's.
const accuracyBar = 0.005

// faultRow is one row of the matrix.
type faultRow struct {
	job     string
	workers int      // 2 when 0
	vars    []string // extra jobspec variables
	// image runs the members in the test image (imageJob) instead of on
	// the host; vars do not apply.
	image bool
	// args replaces faultArgs, for a row whose fault needs training to
	// last longer; the step count must stay faultSteps().
	args []string
	edit func(*api.Job) // changes to the parsed jobspec
	// fault hits the running job once it has a checkpoint; nil for a row
	// whose fault is in the workload itself.
	fault func(t *testing.T, f *faultRun) error
	// restarts is how many group restarts the row expects; maxRestarts,
	// when above it, allows that many.
	restarts, maxRestarts int
	// check asserts what else the row promises, once training ended.
	check func(t *testing.T, f *faultRun, allocs []*api.AllocationListStub)
}

// faultRun is what a fault acts on and what it leaves for the checks.
type faultRun struct {
	c          *cluster
	job        string
	allocs     []*api.AllocationListStub // the members running when the fault hit
	ranks      map[int]int               // rank -> PID when the fault hit
	checkpoint int                       // newest checkpoint's step when the fault hit
}

// member is the running allocation of member index i (job.train[i]).
func (f *faultRun) member(i int) *api.AllocationListStub {
	name := fmt.Sprintf("%s.train[%d]", f.job, i)
	for _, a := range f.allocs {
		if a.Name == name {
			return a
		}
	}
	return nil
}

// trainThroughFault runs row on c and returns the result and every
// allocation the job had.
func (c *cluster) trainThroughFault(t *testing.T, row faultRow) (result, []*api.AllocationListStub) {
	t.Helper()
	workers := row.workers
	if workers == 0 {
		workers = 2
	}
	c.nodeGPUs(t, c.gpusPerClient())
	c.waitDriverHealthy(t)
	ref := c.referenceAccuracy(t, workers)

	args := faultArgs
	if row.args != nil {
		args = row.args
	}
	var job *api.Job
	if row.image {
		job = c.imageJob(t, row.job, workers, 1, args)
	} else {
		job = c.trainJob(t, row.job, workers, 1, args, row.vars...)
	}
	if row.edit != nil {
		row.edit(job)
	}
	leaks := c.leakCheckOnFailure(t, row.job)
	c.register(t, job)
	leaks.snapshotAtCleanup()
	f := &faultRun{c: c, job: row.job}
	if row.fault != nil {
		f.allocs = c.waitAllocs(t, ctx(t, 2*time.Minute), row.job, "every member running",
			func(as []*api.AllocationListStub) bool {
				return len(as) == workers && allIn(api.AllocClientStatusRunning)(as) || anyIn(api.AllocClientStatusFailed)(as)
			})
		if anyIn(api.AllocClientStatusFailed)(f.allocs) {
			t.Fatalf("a member failed before the fault: %s\n%s", describeAllocs(f.allocs), c.failureReport(t, f.allocs))
		}
		if err := c.waitCheckpoint(row.job, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		f.checkpoint = c.newestCheckpoint(row.job)
		f.ranks = ranks(allocIDs(f.allocs)...)
		t.Logf("fault at checkpoint step %d; rank PIDs %v", f.checkpoint, f.ranks)
		checkIdentities(t, allocIDs(f.allocs)...)
		if err := row.fault(t, f); err != nil {
			t.Fatalf("the fault: %v", err)
		}
	}

	allocs := c.waitFinished(t, row.job, workers, 5*time.Minute)
	res := c.finalResult(t, allocs)
	t.Logf("result: accuracy %.4f (fault-free %.4f), %d steps, world size %d, restarts %d, resumed from step %d",
		res.Accuracy, ref, res.Steps, res.WorldSize, res.RestartCount, res.ResumedFromStep)

	maxRestarts := max(row.restarts, row.maxRestarts)
	if res.RestartCount < row.restarts || res.RestartCount > maxRestarts {
		t.Errorf("the group restarted %d time(s); want %s", res.RestartCount, wantRange(row.restarts, maxRestarts))
	}
	switch {
	case row.restarts == 0 && maxRestarts == 0 && res.ResumedFromStep != 0:
		t.Errorf("the ranks resumed from step %d: they were restarted", res.ResumedFromStep)
	case res.RestartCount > 0 && (res.ResumedFromStep == 0 || res.ResumedFromStep < f.checkpoint):
		t.Errorf("the restarted group resumed from step %d; the newest checkpoint when the fault hit was step %d",
			res.ResumedFromStep, f.checkpoint)
	}
	if res.WorldSize != workers || res.Steps != faultSteps() {
		t.Errorf("result: world size %d, %d steps; want %d and %d", res.WorldSize, res.Steps, workers, faultSteps())
	}
	if math.Abs(res.Accuracy-ref) > accuracyBar {
		t.Errorf("accuracy %.4f is %.2f points from the fault-free run's %.4f (bar: %.1f)",
			res.Accuracy, (res.Accuracy-ref)*100, ref, accuracyBar*100)
	}
	if row.check != nil {
		row.check(t, f, allocs)
	}
	leaks.check(allocIDs(allocs)...)
	if row.image {
		c.assertNoContainerLeaks(t, allocIDs(allocs)...)
	}
	return res, allocs
}

// leakCheck runs assertNoLeaks once per test: where the test says, or, when
// it stops early (a failed row), at its end, after its job was stopped.
type leakCheck struct {
	c     *cluster
	t     *testing.T
	job   string
	done  bool
	extra []string // allocations known before the job's listing
	ids   []string // the job's allocations at the test's end
}

// leakCheckOnFailure registers the end-of-test leak check; call it before
// the job is registered, so that it runs after the job is stopped.
func (c *cluster) leakCheckOnFailure(t *testing.T, job string) *leakCheck {
	l := &leakCheck{c: c, t: t, job: job}
	t.Cleanup(func() {
		if !l.done {
			l.check(append(l.extra, l.ids...)...)
		}
	})
	return l
}

// snapshotAtCleanup records the job's allocations when the test ends,
// before register's cleanup purges the job; call it after register.
func (l *leakCheck) snapshotAtCleanup() {
	l.t.Cleanup(func() {
		if allocs, _, err := l.c.nomad.Jobs().Allocations(l.job, true, nil); err == nil {
			l.ids = allocIDs(allocs)
		}
	})
}

func (l *leakCheck) check(allocIDs ...string) {
	l.done = true
	l.c.assertNoLeaks(l.t, l.job, allocIDs...)
}

func wantRange(lo, hi int) string {
	if lo == hi {
		return strconv.Itoa(lo)
	}
	return fmt.Sprintf("%d to %d", lo, hi)
}

// faultSteps is the step count faultArgs trains.
func faultSteps() int {
	n, _ := strconv.Atoi(faultArgs[1])
	return n
}

func (c *cluster) gpusPerClient() int {
	if c.opts.gpus == 0 {
		return fakeGPUsPerClient
	}
	return c.opts.gpus
}

func allocIDs(allocs []*api.AllocationListStub) []string {
	ids := make([]string, len(allocs))
	for i, a := range allocs {
		ids[i] = a.ID
	}
	return ids
}

// references holds the fault-free accuracy per worker count: the workload
// is deterministic, so one run per package run, on any cluster, serves
// every row.
var references struct {
	mu  sync.Mutex
	acc map[[2]int]float64 // by workers and steps
}

// referenceAccuracy is the accuracy of a fault-free run of faultArgs with
// workers workers.
func (c *cluster) referenceAccuracy(t *testing.T, workers int) float64 {
	return c.referenceAccuracySteps(t, workers, faultSteps())
}

// referenceAccuracySteps is the accuracy of a fault-free run of steps steps
// with workers workers (without the sleep, which changes no number).
func (c *cluster) referenceAccuracySteps(t *testing.T, workers, steps int) float64 {
	t.Helper()
	references.mu.Lock()
	defer references.mu.Unlock()
	key := [2]int{workers, steps}
	if acc, ok := references.acc[key]; ok {
		return acc
	}
	id := fmt.Sprintf("e2e-fault-free-%d-%d", workers, steps)
	res, _, _ := c.runTraining(t, c.trainJob(t, id, workers, 1, []string{"--steps", strconv.Itoa(steps)}), 5*time.Minute)
	if res.RestartCount != 0 || res.Steps != steps {
		t.Fatalf("the fault-free run restarted or fell short: %+v", res)
	}
	if res.Accuracy < 0.65 {
		t.Fatalf("the fault-free run reached accuracy %.4f: the workload did not learn", res.Accuracy)
	}
	c.purge(id)
	if references.acc == nil {
		references.acc = map[[2]int]float64{}
	}
	references.acc[key] = res.Accuracy
	return res.Accuracy
}

var checkpointFile = regexp.MustCompile(`ckpt-(\d+)\.pt$`)

// checkpoints lists the job's checkpoint files: in its checkpoint
// directory, or one level down (a `gpujob submit` run's own directory).
func (c *cluster) checkpoints(job string) []string {
	a, _ := filepath.Glob(filepath.Join(c.checkpointDir(job), "ckpt-*.pt"))
	b, _ := filepath.Glob(filepath.Join(c.checkpointDir(job), "*", "ckpt-*.pt"))
	return append(a, b...)
}

// newestCheckpoint is the step of the job's newest checkpoint (0: none).
func (c *cluster) newestCheckpoint(job string) int {
	newest := 0
	for _, f := range c.checkpoints(job) {
		if m := checkpointFile.FindStringSubmatch(f); m != nil {
			n, _ := strconv.Atoi(m[1])
			newest = max(newest, n)
		}
	}
	return newest
}

// waitCheckpointAfter waits until the job has a checkpoint newer than step:
// training went on.
func (c *cluster) waitCheckpointAfter(job string, step int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if c.newestCheckpoint(job) > step {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("no checkpoint after step %d within %s: training did not go on", step, timeout)
}

// waitFinished waits until the job is over: workers members complete, or a
// member failed with nothing to follow it (no reschedule pending), and
// nothing runs. Lost and replaced members count by their replacements.
func (c *cluster) waitFinished(t *testing.T, job string, workers int, timeout time.Duration) []*api.AllocationListStub {
	t.Helper()
	return c.waitAllocs(t, ctx(t, timeout), job, "training to end", func(as []*api.AllocationListStub) bool {
		complete, finalFailure := 0, false
		for _, a := range as {
			switch a.ClientStatus {
			case api.AllocClientStatusPending, api.AllocClientStatusRunning:
				return false
			case api.AllocClientStatusComplete:
				complete++
			case api.AllocClientStatusFailed:
				finalFailure = finalFailure || (a.NextAllocation == "" && a.FollowupEvalID == "")
			}
		}
		return complete == workers || finalFailure
	})
}

// finalResult checks that the job ended with every member complete and
// returns rank 0's result line.
func (c *cluster) finalResult(t *testing.T, allocs []*api.AllocationListStub) result {
	t.Helper()
	var res result
	found := false
	for _, a := range allocs {
		if a.ClientStatus == api.AllocClientStatusFailed && a.NextAllocation == "" {
			t.Fatalf("%s failed:\nstderr:\n%s\nevents:\n%s", a.Name,
				tail(c.taskLog(t, a.ID, "train", "stderr"), 30), c.taskEvents(t, allocs))
		}
		if a.ClientStatus != api.AllocClientStatusComplete {
			continue
		}
		if out := c.taskLog(t, a.ID, "train", "stdout"); strings.Contains(out, "gpujob-result: ") {
			res, found = parseResult(t, out), true
		}
	}
	if !found {
		t.Fatalf("no member printed a result line; events:\n%s", c.taskEvents(t, allocs))
	}
	return res
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// leakWait is how long assertNoLeaks lets teardown take: a member that was
// killed leaves its session behind until Consul expires it, which takes up
// to twice the 10 s session TTL.
const leakWait = 25 * time.Second

// assertNoLeaks fails t unless nothing of the job outlives it: no process
// of any of its allocations (supervisor, rank, or anything a rank started),
// no Consul session of one of its members, no rendezvous key of its run. It
// waits up to leakWait for each to go, and names what stayed.
func (c *cluster) assertNoLeaks(t *testing.T, job string, allocIDs ...string) {
	t.Helper()
	deadline := time.Now().Add(leakWait)
	var procs []proc
	for {
		if procs = processes(allocIDs...); len(procs) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, p := range procs {
		kind := "process"
		switch {
		case p.isSupervisor():
			kind = "supervisor"
		case p.isRank():
			kind = "rank " + p.env["RANK"] + " (or its child)"
		}
		t.Errorf("leaked %s of allocation %s: %s", kind, p.env["NOMAD_ALLOC_ID"][:8], p)
		_ = kill9(p.pid) // so the next test starts clean
	}

	cc := c.consulClient(t)
	mentions := regexp.MustCompile(`(^|[/ ])` + regexp.QuoteMeta(job) + `($|[^A-Za-z0-9_-])`)
	var sessions, keys []string
	for {
		sessions, keys = nil, nil
		list, _, err := cc.Session().List(nil)
		if err != nil {
			t.Fatalf("listing Consul sessions: %v", err)
		}
		for _, s := range list {
			if mentions.MatchString(s.Name) {
				sessions = append(sessions, fmt.Sprintf("%s (%s)", s.Name, s.ID[:8]))
			}
		}
		all, _, err := cc.KV().Keys("gpujob/", "", nil)
		if err != nil {
			t.Fatalf("listing Consul keys: %v", err)
		}
		for _, k := range all {
			if mentions.MatchString(k) {
				keys = append(keys, k)
			}
		}
		if len(sessions)+len(keys) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	sort.Strings(keys)
	if len(sessions) > 0 {
		t.Errorf("Consul sessions left %s after the job: %s", leakWait, strings.Join(sessions, ", "))
	}
	if len(keys) > 0 {
		t.Errorf("rendezvous keys left %s after the job: %s", leakWait, strings.Join(keys, ", "))
	}
	// Whatever stayed would otherwise fail the rows after this one too.
	for _, k := range keys {
		_, _ = cc.KV().Delete(k, nil)
	}
}

// ---- the rows --------------------------------------------------------------------

func TestFaultKillRank(t *testing.T) {
	c := needCluster(t)
	c.trainThroughFault(t, faultRow{
		job: "e2e-fault-rank",
		fault: func(t *testing.T, f *faultRun) error {
			return kill9(f.ranks[1])
		},
		restarts: 1,
	})
}

func TestFaultKillSupervisor(t *testing.T) {
	c := needCluster(t)
	c.trainThroughFault(t, faultRow{
		job: "e2e-fault-supervisor",
		// The killed member's task fails for good (the jobspec lets Nomad
		// neither restart nor reschedule it: the group restarts as one), so
		// Nomad must be allowed to replace it once, as it replaces the
		// member of a lost node.
		edit: func(job *api.Job) {
			job.TaskGroups[0].ReschedulePolicy = &api.ReschedulePolicy{
				Attempts: intp(1), Interval: durp(time.Hour), Delay: durp(5 * time.Second), // Nomad's least
				DelayFunction: strp("constant"), Unlimited: boolp(false),
			}
		},
		fault:    killSupervisor,
		restarts: 1,
	})
}

// killSupervisor kills member 1's supervisor with SIGKILL; every process it
// started (ranks, preloaded interpreters) must die with it.
func killSupervisor(t *testing.T, f *faultRun) error {
	victim := f.member(1)
	sup := supervisorPID(victim.ID)
	if sup == 0 {
		return fmt.Errorf("no supervisor runs for %s", victim.Name)
	}
	var pids []int
	for _, p := range processes(victim.ID) {
		if p.pid != sup {
			pids = append(pids, p.pid)
		}
	}
	if len(ranks(victim.ID)) == 0 {
		return fmt.Errorf("no rank of %s runs", victim.Name)
	}
	if err := kill9(sup); err != nil {
		return err
	}
	// The supervisor's ranks must die with it, not train on as orphans
	// holding their GPUs.
	if alive := waitGone(10*time.Second, pids...); len(alive) > 0 {
		t.Errorf("processes %v of the killed supervisor still run 10s later (orphaned)", alive)
		for _, pid := range alive {
			_ = kill9(pid)
		}
	}
	return nil
}

func TestFaultNomadClientRestart(t *testing.T) {
	c := needCluster(t)
	c.trainThroughFault(t, faultRow{
		job: "e2e-fault-client-restart",
		fault: func(t *testing.T, f *faultRun) error {
			if _, err := f.c.script("dev-client.sh", "restart", "1"); err != nil {
				return err
			}
			return f.sameRanks(t)
		},
	})
}

// sameRanks checks, once training has gone on past the fault, that the
// ranks still running are the processes that ran when the fault hit. (Once
// training is over none runs; the result line then tells whether the group
// ever restarted.)
func (f *faultRun) sameRanks(t *testing.T) error {
	if err := f.c.waitCheckpointAfter(f.job, f.checkpoint, time.Minute); err != nil {
		return err
	}
	now := ranks(allocIDs(f.allocs)...)
	for r, pid := range now {
		if f.ranks[r] != pid {
			return fmt.Errorf("rank PIDs when the fault hit %v, after it %v: want the same processes", f.ranks, now)
		}
	}
	return nil
}

// consulOutage is how long the Consul restart row keeps Consul down: the
// 60 s outage training must ride out, six session TTLs, so a supervisor's
// renewals fail for many TTLs and must be retried, not given up.
const consulOutage = 60 * time.Second

// consulOutageArgs slow the workload so that training still runs when
// Consul is back (240 steps of 0.4 s: the fault hits at the first
// checkpoint, with over a minute of training left).
var consulOutageArgs = []string{"--steps", "240", "--sleep-per-step", "0.4"}

func TestFaultNodeLost(t *testing.T) {
	c := pairCluster(t)
	var lost time.Time
	c.trainThroughFault(t, faultRow{
		job:  "e2e-fault-node-lost",
		vars: []string{`join_timeout = "3m"`},
		// One member per node to start with.
		edit: func(job *api.Job) {
			weight := int8(100)
			job.AddSpread(&api.Spread{Attribute: "${node.unique.id}", Weight: &weight})
		},
		fault: func(t *testing.T, f *faultRun) error {
			if f.allocs[0].NodeID == f.allocs[1].NodeID {
				return fmt.Errorf("both members on %s despite the spread", f.allocs[0].NodeName)
			}
			victim := f.member(1)
			lost = time.Now()
			return f.c.loseMachineFor(t, f.c.clientOf(t, victim.NodeName))
		},
		// The survivor hears of the loss from its own rank (a collective
		// with the dead peer breaks) or from the rendezvous (the dead
		// member's session expires), whichever comes first; rarely both.
		restarts: 1, maxRestarts: 2,
		check: func(t *testing.T, f *faultRun, allocs []*api.AllocationListStub) {
			victim := f.member(1)
			for _, a := range allocs {
				if a.Name == victim.Name && a.ID != victim.ID && a.ClientStatus == api.AllocClientStatusComplete {
					if a.NodeID == victim.NodeID {
						t.Errorf("the replacement for %s ran on the lost node", victim.Name)
					}
					t.Logf("replacement %s ran on %s; group done %s after the loss", a.ID[:8], a.NodeName,
						time.Since(lost).Round(time.Second))
					return
				}
			}
			t.Errorf("no replacement for %s completed: %s", victim.Name, describeAllocs(allocs))
		},
	})
}

func TestFaultConsulRestart(t *testing.T) {
	c := needCluster(t)
	c.trainThroughFault(t, faultRow{
		job:  "e2e-fault-consul-restart",
		args: consulOutageArgs,
		fault: func(t *testing.T, f *faultRun) error {
			if _, err := f.c.script("dev-consul.sh", "stop"); err != nil {
				return err
			}
			time.Sleep(consulOutage)
			out, err := f.c.script("dev-consul.sh", "start")
			if err != nil {
				return err
			}
			t.Logf("Consul down %s, then: %s", consulOutage, strings.TrimSpace(out))
			return f.sameRanks(t)
		},
	})
}

func TestFaultConsulLeaderKilled(t *testing.T) {
	c := haCluster(t)
	c.trainThroughFault(t, faultRow{
		job: "e2e-fault-consul-leader",
		fault: func(t *testing.T, f *faultRun) error {
			return f.killConsulLeader(t, f.sameRanks)
		},
	})
}

// killConsulLeader kills the Consul leader, waits for the next one, runs
// meanwhile (training under the new leader), then starts the killed server
// again, so the cluster is whole for what comes next.
func (f *faultRun) killConsulLeader(t *testing.T, meanwhile func(*testing.T) error) error {
	out, err := f.c.script("dev-consul.sh", "leader")
	if err != nil {
		return err
	}
	old := strings.TrimSpace(out)
	killed := time.Now()
	if _, err := f.c.script("dev-consul.sh", "kill", old); err != nil {
		return err
	}
	var next string
	for next == "" || next == old {
		if time.Since(killed) > 30*time.Second {
			return fmt.Errorf("no new Consul leader 30s after server %s was killed", old)
		}
		time.Sleep(100 * time.Millisecond)
		next = ""
		if out, err := f.c.script("dev-consul.sh", "leader"); err == nil {
			next = strings.TrimSpace(out)
		}
	}
	t.Logf("Consul server %s (leader) killed; server %s leads %s later", old, next, time.Since(killed).Round(100*time.Millisecond))
	if err := meanwhile(t); err != nil {
		return err
	}
	_, err = f.c.script("dev-consul.sh", "start", old)
	return err
}

func TestFaultNomadServerRestart(t *testing.T) {
	c := needCluster(t)
	c.trainThroughFault(t, faultRow{
		job: "e2e-fault-nomad-server",
		fault: func(t *testing.T, f *faultRun) error {
			out, err := f.c.script("dev-nomad.sh", "restart")
			if err != nil {
				return err
			}
			t.Logf("%s", strings.TrimSpace(out))
			return f.sameRanks(t)
		},
	})
}

func TestFaultRankExitsZeroWhileItsChildHoldsStdout(t *testing.T) {
	c := needCluster(t)
	c.trainThroughFault(t, faultRow{
		job: "e2e-fault-exit-zero",
		// Each rank is a shell that trains, leaves a child holding its
		// stdout and stderr, and exits with the workload's status. With
		// log_prefix the supervisor reads the ranks' output through pipes,
		// which the child keeps open.
		edit: func(job *api.Job) {
			task := job.TaskGroups[0].Tasks[0]
			task.Config["log_prefix"] = true
			args := task.Config["args"].([]interface{})
			task.Config["command"] = "/bin/sh"
			task.Config["args"] = append([]interface{}{"-c",
				`/usr/bin/python3 "$@" || exit; sleep 120 & exit 0`, "rank"}, args...)
		},
		check: func(t *testing.T, f *faultRun, allocs []*api.AllocationListStub) {
			for _, a := range allocs {
				st := a.TaskStates["train"]
				if st == nil || st.FinishedAt.IsZero() {
					continue
				}
				if d := st.FinishedAt.Sub(st.StartedAt); d > 100*time.Second {
					t.Errorf("%s ran %s: its supervisor waited for the child holding the rank's stdout", a.Name, d)
				}
			}
		},
	})
}

func TestFaultJobStop(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	c.waitDriverHealthy(t)
	const id = "e2e-fault-job-stop"
	const killTimeout = 5 * time.Second // Nomad's default, set here so the test says it
	job := c.trainJob(t, id, 2, 1, faultArgs)
	job.TaskGroups[0].Tasks[0].KillTimeout = durp(killTimeout)
	leaks := c.leakCheckOnFailure(t, id)
	c.register(t, job)
	leaks.snapshotAtCleanup()
	allocs := c.waitAllocs(t, ctx(t, 2*time.Minute), id, "every member running",
		func(as []*api.AllocationListStub) bool {
			return len(as) == 2 && allIn(api.AllocClientStatusRunning)(as)
		})
	if err := c.waitCheckpoint(id, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	ids := allocIDs(allocs)
	before := processes(ids...)
	if len(ranks(ids...)) != 2 {
		t.Fatalf("before the stop, the ranks running are %v; want 2", ranks(ids...))
	}

	stopped := time.Now()
	if _, _, err := c.nomad.Jobs().Deregister(id, false, nil); err != nil {
		t.Fatalf("nomad job stop: %v", err)
	}
	var pids []int
	for _, p := range before {
		pids = append(pids, p.pid)
	}
	// The stop reaches the client a little after the API returns: allow
	// for that, not for any part of kill_timeout.
	const schedulingSlack = 2 * time.Second
	alive := waitGone(killTimeout+schedulingSlack, pids...)
	took := time.Since(stopped)
	for _, p := range before {
		for _, pid := range alive {
			if p.pid == pid {
				t.Errorf("still running %s after nomad job stop (kill_timeout %s): %s", took.Round(100*time.Millisecond), killTimeout, p)
			}
		}
	}
	if len(alive) == 0 {
		t.Logf("every process of the job gone %s after nomad job stop", took.Round(100*time.Millisecond))
	}
	c.waitAllocs(t, ctx(t, time.Minute), id, "every member stopped", allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed))
	leaks.check(ids...)
}

func TestFaultResubmitAfterDeadRun(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	c.waitDriverHealthy(t)
	ref := c.referenceAccuracy(t, 2)
	const id = "e2e-fault-resubmit"
	spec := filepath.Join(c.repo, "e2e", "testdata", "resubmit.hcl")
	leaks := c.leakCheckOnFailure(t, id)
	t.Cleanup(func() { c.purge(id); os.RemoveAll(c.checkpointDir(id)) })
	leaks.snapshotAtCleanup()
	submitArgs := []string{"submit", "-var", c.workloadVar(), "-var", "steps=" + strconv.Itoa(faultSteps()), spec}

	// The first run: one group restart spends its budget (max_failures =
	// 1), then both supervisors die, so it can never continue.
	out, errOut, code := c.gpujob(t, time.Minute, append([]string{"submit", "--detach"}, submitArgs[1:]...)...)
	if code != 0 {
		t.Fatalf("first submit exited %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	first := c.waitAllocs(t, ctx(t, 2*time.Minute), id, "every member running",
		func(as []*api.AllocationListStub) bool {
			return len(as) == 2 && allIn(api.AllocClientStatusRunning)(as)
		})
	if err := c.waitCheckpoint(id, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	ids := allocIDs(first)
	leaks.extra = ids // the resubmission purges the dead run's job
	if err := kill9(ranks(ids...)[1]); err != nil {
		t.Fatalf("killing rank 1: %v", err)
	}
	if err := waitFor(2*time.Minute, func() bool { return restartedRanks(ids...) == 2 }); err != nil {
		t.Fatalf("the group did not restart after rank 1 was killed: %v", err)
	}
	for _, a := range first {
		if err := kill9(supervisorPID(a.ID)); err != nil {
			t.Fatalf("killing the supervisor of %s: %v", a.Name, err)
		}
	}
	c.waitAllocs(t, ctx(t, 2*time.Minute), id, "the dead run's members to fail", allIn(api.AllocClientStatusFailed))

	// The second submission of the same spec is a run of its own.
	out, errOut, code = c.gpujob(t, 5*time.Minute, submitArgs...)
	if code != 0 {
		t.Fatalf("resubmission exited %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "rendezvous round 1 complete") {
		t.Errorf("the resubmission did not start at round 1:\n%s", out)
	}
	allocs, _, err := c.nomad.Jobs().Allocations(id, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	var second []*api.AllocationListStub
	for _, a := range allocs {
		if a.ID != first[0].ID && a.ID != first[1].ID {
			second = append(second, a)
		}
	}
	res := c.finalResult(t, second)
	if res.RestartCount != 0 || res.ResumedFromStep != 0 || res.Steps != faultSteps() {
		t.Errorf("the resubmission's result: %d restarts, resumed from step %d, %d steps; want a fresh run: 0, 0, %d",
			res.RestartCount, res.ResumedFromStep, res.Steps, faultSteps())
	}
	if math.Abs(res.Accuracy-ref) > accuracyBar {
		t.Errorf("accuracy %.4f is %.2f points from the fault-free run's %.4f", res.Accuracy, (res.Accuracy-ref)*100, ref)
	}
	leaks.check(append(ids, allocIDs(second)...)...)
}

// restartedRanks counts the ranks of the allocations that run in a restarted
// group (TORCHELASTIC_RESTART_COUNT above 0).
func restartedRanks(allocIDs ...string) int {
	n := 0
	for _, p := range rankProcs(allocIDs...) {
		if r, _ := strconv.Atoi(p.env["TORCHELASTIC_RESTART_COUNT"]); r > 0 {
			n++
		}
	}
	return n
}

// waitFor polls cond every 100 ms until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

func durp(d time.Duration) *time.Duration { return &d }

// waitDriverHealthy waits until the gpujob driver is healthy on every ready
// node. It fingerprints every 30 s and reports unhealthy while Consul has no
// leader, so a row right after a Consul fault could otherwise submit to a
// node Nomad will not place gpujob tasks on (and Nomad does not re-evaluate
// the blocked job when the driver turns healthy again).
func (c *cluster) waitDriverHealthy(t *testing.T) {
	t.Helper()
	err := waitFor(45*time.Second, func() bool {
		nodes, _, err := c.nomad.Nodes().List(nil)
		if err != nil {
			return false
		}
		for _, n := range nodes {
			if d := n.Drivers["gpujob"]; n.Status == api.NodeStatusReady && (d == nil || !d.Healthy) {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("the gpujob driver is not healthy on every node: %v", err)
	}
}
