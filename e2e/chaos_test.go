package e2e

import (
	"fmt"
	"math"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// chaosFault is a fault of the matrix that can hit a run at any checkpoint
// and leave the cluster whole again: the rows that end the run (job stop),
// need a second node (node loss) or a second submission are left out.
type chaosFault struct {
	name     string
	restarts int // group restarts it costs
	hit      func(t *testing.T, f *faultRun, rng *rand.Rand) error
}

var chaosFaults = []chaosFault{
	{"kill -9 a rank", 1, func(t *testing.T, f *faultRun, rng *rand.Rand) error {
		return kill9(f.ranks[rng.Intn(len(f.ranks))])
	}},
	{"kill -9 a member's supervisor", 1, func(t *testing.T, f *faultRun, rng *rand.Rand) error {
		return kill9(supervisorPID(f.allocs[rng.Intn(len(f.allocs))].ID))
	}},
	{"Nomad client restart", 0, func(t *testing.T, f *faultRun, rng *rand.Rand) error {
		_, err := f.c.script("dev-client.sh", "restart", "1")
		return err
	}},
	{"Nomad server restart", 0, func(t *testing.T, f *faultRun, rng *rand.Rand) error {
		_, err := f.c.script("dev-nomad.sh", "restart")
		return err
	}},
	{"Consul leader killed", 0, func(t *testing.T, f *faultRun, rng *rand.Rand) error {
		return f.killConsulLeader(t, func(*testing.T) error { time.Sleep(2 * time.Second); return nil })
	}},
	{"Consul client agent restart", 0, func(t *testing.T, f *faultRun, rng *rand.Rand) error {
		_, err := f.c.script("dev-consul.sh", "restart", "client")
		return err
	}},
}

// TestChaos trains one long run on the 3-server-Consul cluster and hits it
// with GPUJOB_CHAOS_FAULTS (2) faults drawn from chaosFaults with
// GPUJOB_CHAOS_SEED (a fresh one, from the clock, unless given; logged for a
// replay), one per fresh checkpoint; then the run must end as
// every row of the matrix does: the fault-free accuracy, exactly the group
// restarts the faults cost, resumed from a checkpoint, nothing leaked.
// Only `make chaos` runs it: each fault is a row TestFaultMatrix runs, so a
// fixed seed in `make test` only repeated rows; a fresh draw each time is
// what finds a combination the matrix does not.
func TestChaos(t *testing.T) {
	n, err := envInt("GPUJOB_CHAOS_FAULTS", 2)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := envInt("GPUJOB_CHAOS_SEED", int(time.Now().UnixNano()%1_000_000_000))
	if err != nil {
		t.Fatal(err)
	}
	c := haCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	c.waitDriverHealthy(t)
	rng := rand.New(rand.NewSource(int64(seed)))
	plan := make([]chaosFault, n)
	var names []string
	for i := range plan {
		plan[i] = chaosFaults[rng.Intn(len(chaosFaults))]
		names = append(names, plan[i].name)
	}
	t.Logf("seed %d, %d fault(s): %s (replay: make chaos CHAOS_FAULTS=%d CHAOS_SEED=%d)",
		seed, n, strings.Join(names, "; "), n, seed)

	// Room for every fault: one every 60 steps, at least the matrix's run.
	steps := max(faultSteps(), 60*(n+1))
	ref := c.referenceAccuracySteps(t, 2, steps)
	const id = "e2e-chaos"
	job := c.trainJob(t, id, 2, 1, []string{"--steps", strconv.Itoa(steps), "--sleep-per-step", "0.05"},
		fmt.Sprintf("max_restarts = %d", n+1), `join_timeout = "3m"`)
	// A killed supervisor's member is replaced, as in TestFaultKillSupervisor.
	job.TaskGroups[0].ReschedulePolicy = &api.ReschedulePolicy{
		Attempts: intp(n), Interval: durp(time.Hour), Delay: durp(5 * time.Second),
		DelayFunction: strp("constant"), Unlimited: boolp(false),
	}
	leaks := c.leakCheckOnFailure(t, id)
	c.register(t, job)
	leaks.snapshotAtCleanup()

	wantRestarts, lastRestartAt, after := 0, 0, 0
	seen := map[string]bool{}
	for i, fault := range plan {
		// Each fault at a checkpoint newer than the last fault's, with the
		// whole group training.
		var f *faultRun
		err := waitFor(3*time.Minute, func() bool {
			f = c.runningGroup(t, id, 2)
			f.checkpoint = c.newestCheckpoint(id)
			return f.checkpoint > after && len(f.ranks) == 2
		})
		if err != nil {
			t.Fatalf("fault %d (%s): no new checkpoint with the group training: %v", i+1, fault.name, err)
		}
		if f.checkpoint >= steps {
			t.Fatalf("training ended before fault %d of %d", i+1, n)
		}
		t.Logf("fault %d: %s at checkpoint step %d", i+1, fault.name, f.checkpoint)
		if err := fault.hit(t, f, rng); err != nil {
			t.Fatalf("fault %d (%s): %v", i+1, fault.name, err)
		}
		after = f.checkpoint
		wantRestarts += fault.restarts
		if fault.restarts > 0 {
			lastRestartAt = f.checkpoint
		}
		for _, a := range f.allocs {
			seen[a.ID] = true
		}
	}

	allocs := c.waitFinished(t, id, 2, 10*time.Minute)
	res := c.finalResult(t, allocs)
	t.Logf("result: accuracy %.4f (fault-free %.4f), restarts %d, resumed from step %d",
		res.Accuracy, ref, res.RestartCount, res.ResumedFromStep)
	if res.RestartCount != wantRestarts {
		t.Errorf("the group restarted %d time(s); the faults cost %d", res.RestartCount, wantRestarts)
	}
	if wantRestarts > 0 && res.ResumedFromStep < lastRestartAt {
		t.Errorf("resumed from step %d; the newest checkpoint at the last restart was step %d", res.ResumedFromStep, lastRestartAt)
	}
	if res.Steps != steps || res.WorldSize != 2 {
		t.Errorf("result: %d steps, world size %d; want %d and 2", res.Steps, res.WorldSize, steps)
	}
	if math.Abs(res.Accuracy-ref) > accuracyBar {
		t.Errorf("accuracy %.4f is %.2f points from the fault-free run's %.4f", res.Accuracy, (res.Accuracy-ref)*100, ref)
	}
	for _, a := range allocs {
		seen[a.ID] = true
	}
	leaks.check(keys(seen)...)
}

// runningGroup is the job's members running now and their ranks.
func (c *cluster) runningGroup(t *testing.T, job string, workers int) *faultRun {
	t.Helper()
	allocs, _, err := c.nomad.Jobs().Allocations(job, false, nil)
	if err != nil {
		t.Fatalf("listing %s's allocations: %v", job, err)
	}
	f := &faultRun{c: c, job: job}
	for _, a := range allocs {
		if a.ClientStatus == api.AllocClientStatusRunning {
			f.allocs = append(f.allocs, a)
		}
	}
	if len(f.allocs) == workers {
		f.ranks = ranks(allocIDs(f.allocs)...)
	}
	return f
}

// envInt reads a whole number from the environment, def when unset.
func envInt(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s=%q: want a whole number", name, v)
	}
	return n, nil
}
