package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
)

// queueEnv is the CLI's environment for the queue tests: the cluster's
// agents and the controller's binary (queue apply starts the controller).
func (c *cluster) queueEnv() []string {
	return append(os.Environ(), "NOMAD_ADDR="+c.env["NOMAD_ADDR"], "CONSUL_HTTP_ADDR="+c.env["CONSUL_HTTP_ADDR"],
		"GPUJOB_CONTROLLER_BINARY="+c.env["GPUJOB_CONTROLLER_BINARY"])
}

// applyQueues applies the queue file hcl (which starts the controller)
// and waits until the controller leads.
func (c *cluster) applyQueues(t *testing.T, cc *consul.Client, hcl string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "queues.hcl")
	if err := os.WriteFile(p, []byte(hcl), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := c.gpujobEnv(t, c.queueEnv(), time.Minute, "queue", "apply", p); code != 0 {
		t.Fatalf("queue apply exited %d:\n%s%s", code, out, errOut)
	}
	// Before the test's own cleanups (which purge the controller's job):
	// what the controller said, when the test failed.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		as, _ := c.allocsOf(render.QueueControllerJob)
		for _, a := range as {
			t.Logf("the controller's log (allocation %s):\n%s", a.ID[:8], tail(c.logFile(a.ID, render.QueueControllerTask, "stderr"), 40))
		}
	})
	c.waitQueueLeader(t, cc, "", 2*time.Minute)
}

// waitQueueLeader waits until a running allocation of the controller's job
// holds the leader key under a session other than notSession, and returns
// the allocation's ID and the session.
func (c *cluster) waitQueueLeader(t *testing.T, cc *consul.Client, notSession string, limit time.Duration) (alloc, session string) {
	t.Helper()
	queueWait(t, limit, "a controller leading", func() (bool, string) {
		kv, _, err := cc.KV().Get(contract.QueueLeaderKey, nil)
		if err != nil || kv == nil || kv.Session == "" {
			return false, fmt.Sprintf("leader key %+v (%v)", kv, err)
		}
		if kv.Session == notSession {
			return false, fmt.Sprintf("the leader key is still held by session %s", notSession)
		}
		for _, a := range c.holding(t, render.QueueControllerJob) {
			if a.ID == string(kv.Value) && a.ClientStatus == api.AllocClientStatusRunning {
				alloc, session = a.ID, kv.Session
				return true, ""
			}
		}
		return false, fmt.Sprintf("leader %q is no running allocation of %s", kv.Value, render.QueueControllerJob)
	})
	return alloc, session
}

// submitDetached submits spec (a file's text) with gpujob submit --detach
// in queue mode and checks that it was queued, not registered.
func (c *cluster) submitDetached(t *testing.T, name, spec string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), name+".hcl")
	if err := os.WriteFile(p, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := c.gpujobEnv(t, c.queueEnv(), 2*time.Minute, "submit", "--detach", p)
	if code != 0 || !strings.Contains(out+errOut, "queued "+name+" in ") {
		t.Fatalf("gpujob submit --detach %s exited %d, and should have queued it:\n%s%s", name, code, out, errOut)
	}
}

// statusQueue is the queue object of `gpujob status --json JOB`.
type statusQueue struct {
	Queue        string `json:"queue"`
	State        string `json:"state"`
	Position     int    `json:"position"`
	Reason       string `json:"reason"`
	GPUs         int    `json:"gpus"`
	Admissions   int    `json:"admissions"`
	PreemptedBy  string `json:"preempted_by"`
	PreemptedWhy string `json:"preempted_why"`
	Preemptions  int    `json:"preemptions"`
}

// jobQueueStatus runs gpujob status --json and returns its queue object.
func (c *cluster) jobQueueStatus(t *testing.T, id string) *statusQueue {
	t.Helper()
	var status struct {
		Queue *statusQueue `json:"queue"`
	}
	out, errOut, code := c.gpujobEnv(t, c.queueEnv(), time.Minute, "status", "--json", id)
	if code != 0 {
		t.Fatalf("gpujob status --json %s exited %d:\n%s%s", id, code, out, errOut)
	}
	if err := json.Unmarshal([]byte(out), &status); err != nil || status.Queue == nil {
		t.Fatalf("gpujob status --json %s: no queue object (%v):\n%s", id, err, out)
	}
	return status.Queue
}

// gangSampler follows jobs' allocations every 100 ms and adds up, per job,
// the GPU-seconds its members held while the gang was partly placed: some
// member of one job version (one admission) pending or running while
// fewer than all of that version's members had been placed. Members that
// end by themselves stay placed (a batch gang's members finish apart);
// members being stopped (desired stop) count as gone, so a gang stopped
// whole is never partial. It also counts samples where members of two
// admissions held resources at once (a readmission before the preempted
// gang had stopped).
type gangSampler struct {
	c       *cluster
	members map[string]int // per job
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once

	mu      sync.Mutex
	idle    map[string]float64 // GPU-seconds held by partly placed gangs
	seen    map[string]string  // the first partial sample of each job, in words
	twice   []string           // samples with two admissions holding resources
	samples int
	err     error
}

// sampleGangs starts a gangSampler of jobs (job ID: members of one GPU);
// it stops at check, or with the test.
func (c *cluster) sampleGangs(t *testing.T, members map[string]int) *gangSampler {
	s := &gangSampler{c: c, members: members, stop: make(chan struct{}), done: make(chan struct{}),
		idle: map[string]float64{}, seen: map[string]string{}}
	go s.run()
	t.Cleanup(s.halt)
	return s
}

// halt stops the sampler and waits for it.
func (s *gangSampler) halt() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

func (s *gangSampler) run() {
	defer close(s.done)
	last := time.Now()
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		now := time.Now()
		for id, members := range s.members {
			as, err := s.c.allocsOf(id)
			if err != nil {
				s.mu.Lock()
				s.err = fmt.Errorf("allocations of %s: %w", id, err)
				s.mu.Unlock()
				continue
			}
			// placed and live are of the members Nomad wants to run; held
			// counts those being stopped too.
			placed, live, held := map[uint64]int{}, map[uint64]int{}, map[uint64]int{}
			for _, a := range as {
				holds := a.ClientStatus == api.AllocClientStatusPending || a.ClientStatus == api.AllocClientStatusRunning
				if holds {
					held[a.JobVersion]++
				}
				if a.DesiredStatus != api.AllocDesiredStatusRun {
					continue
				}
				placed[a.JobVersion]++
				if holds {
					live[a.JobVersion]++
				}
			}
			s.mu.Lock()
			if len(held) > 1 {
				s.twice = append(s.twice, fmt.Sprintf("%s: members of versions %v hold resources at once", id, held))
			}
			for v, n := range live {
				if placed[v] < members {
					s.idle[id] += float64(n) * now.Sub(last).Seconds()
					if s.seen[id] == "" {
						s.seen[id] = fmt.Sprintf("version %d: %d of %d members placed, %d live (%s)", v, placed[v], members, n, describeAllocs(as))
					}
				}
			}
			s.samples++
			s.mu.Unlock()
		}
		last = now
	}
}

// check stops the sampler and fails t if a gang was ever partly placed or
// members of two admissions of a job held resources at once.
func (s *gangSampler) check(t *testing.T) {
	t.Helper()
	s.halt()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		t.Errorf("sampling the gangs: %v", s.err)
	}
	if s.samples == 0 {
		t.Errorf("the gang sampler took no sample")
	}
	for _, id := range sortedKeysOf(s.members) {
		if s.idle[id] > 0 || s.seen[id] != "" {
			t.Errorf("job %s was partly placed, holding %.1f GPU-seconds: %s", id, s.idle[id], s.seen[id])
		}
	}
	if len(s.twice) > 0 {
		t.Errorf("members of two admissions of a job held resources at once in %d samples, e.g. %s", len(s.twice), s.twice[0])
	}
	t.Logf("gang sampler: %d samples of %d jobs; no gang partly placed", s.samples/len(s.members), len(s.members))
}

func sortedKeysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// logFile is what a task of an allocation on one of the cluster's clients
// has written to a stream so far, read from the client's data dir ("" when
// there is none): for polling a running member's output, which through
// Nomad's file system API opens a connection to the client per read.
func (c *cluster) logFile(allocID, task, stream string) string {
	files, _ := filepath.Glob(filepath.Join(c.dir, "client-*", "data", "alloc", allocID, "alloc", "logs", task+"."+stream+".0"))
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			return string(b)
		}
	}
	return ""
}

// losses is rank 0's logged training loss at each logged step.
func losses(logs ...string) map[int]float64 {
	out := map[int]float64{}
	for _, l := range logs {
		for _, m := range lossLine.FindAllStringSubmatch(l, -1) {
			if m[2] != "0" {
				continue
			}
			step, _ := strconv.Atoi(m[1])
			loss, _ := strconv.ParseFloat(m[3], 64)
			out[step] = loss
		}
	}
	return out
}

func sortedSteps(m map[int]float64) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// preemptSteps and the rest are the preempted BERT job's workload: a few
// hundred short steps, slowed so that the preemption lands mid-training,
// its loss logged every 10 steps as the mean of those 10 steps alone (so a
// step logged before the preemption and again after the resume is the
// mean of the same steps), a checkpoint every 50: the preemption lands
// 20 steps past one, well before the next.
const (
	preemptSteps     = 300
	preemptLogEvery  = 10
	preemptCkptEvery = 50
	preemptCkptAt    = 200 // the preemption comes once a checkpoint of this step or later exists, the loss well down
	// replayTolerance bounds the difference between the losses of one step
	// trained before the preemption and again after the resume.
	replayTolerance = 0.01
	// continuityTolerance bounds the jump from the last loss logged before
	// the preemption to the first after the resume (10 steps apart at
	// most): two 10-step windows apart differ by up to 0.1 at these steps,
	// while the loss falls from about 0.70 at the start to about 0.45 by
	// step 200.
	continuityTolerance = 0.12
)

// The borrowing-then-reclaim scenario on the 4-GPU dev cluster,
// through gpujob submit: team-b (quota 1 GPU, may borrow) runs the real BERT
// workload on 2 GPUs, borrowing one of team-a's idle 3; team-a then submits
// a 3-GPU gang, which needs its quota back. The controller preempts team-b's
// gang whole (SIGTERM, its checkpoint_grace, every member stopped at once),
// says who and why in gpujob status, admits team-a's gang whole, and once
// that ends readmits team-b's job, which resumes from its checkpoint: the
// result line's resumed-from step is the checkpoint's, the loss of every
// step logged before the preemption and again after the resume is the same
// (continuous, not restarted), and no gang ever held part of its members.
func TestQueuePreemptionResumesFromCheckpoint(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	c.waitDriverHealthy(t)
	cc := c.consulClient(t)
	const (
		b = "e2e-qpre-b" // the borrower: BERT, 2 workers
		a = "e2e-qpre-a" // the owner: a 3-GPU gang of sleepers
	)
	c.resetQueues(t, cc)
	t.Cleanup(func() { c.resetQueues(t, cc, a, b) })
	t.Cleanup(func() { os.RemoveAll(c.checkpointDir(b)) })

	c.applyQueues(t, cc, `queue "team-a" {
  gpus   = 3
  cohort = "research"
}

queue "team-b" {
  gpus   = 1
  borrow = true
  cohort = "research"
}
`)
	sampler := c.sampleGangs(t, map[string]int{a: 3, b: 2})

	c.submitDetached(t, b, fmt.Sprintf(`train %q {
  queue            = "team-b"
  workers          = 2
  gpus_per_worker  = 1
  command          = "/usr/bin/python3"
  args             = [%q, "--steps", "%d", "--sleep-per-step", "0.05", "--log-every", "%d", "--loss-window", "%d"]
  env = {
    OMP_NUM_THREADS = "1"
  }
  resources {
    cpu    = 500
    memory = 1024
  }
  checkpoint {
    every = %d
  }
  checkpoint_grace   = "10s"
  max_failures       = 0
  rendezvous_timeout = "2m"
}
`, b, c.workload(), preemptSteps, preemptLogEvery, preemptLogEvery, preemptCkptEvery))

	// Admitted borrowing: 2 GPUs against team-b's quota of 1.
	queueWait(t, time.Minute, "team-b's job admitted", func() (bool, string) {
		st := queueStatus(t, cc, b)
		return st != nil && st.State == admit.StateAdmitted, fmt.Sprintf("%+v", st)
	})
	if st := queueStatus(t, cc, b); !strings.Contains(st.Reason, "borrows 1 GPUs") {
		t.Errorf("team-b's job was admitted with reason %q; want it to borrow 1 GPU of team-a's idle quota", st.Reason)
	}
	c.checkAdmittedWhole(t, cc, b, 2)
	first := c.waitAllocs(t, ctx(t, 2*time.Minute), b, "both members running", func(as []*api.AllocationListStub) bool {
		return len(as) == 2 && allIn(api.AllocClientStatusRunning)(as)
	})
	// The preemption comes once the run has a checkpoint of step
	// preemptCkptAt or later and has logged the loss of 2 steps past it:
	// the steps the resumed run trains again, whose losses must repeat.
	var ckptAtPreemption int
	queueWait(t, 2*time.Minute, fmt.Sprintf("a checkpoint of step %d or later, and the loss %d steps after it", preemptCkptAt, 2*preemptLogEvery), func() (bool, string) {
		ckptAtPreemption = c.newestCheckpoint(b)
		var logs []string
		for _, al := range first {
			logs = append(logs, c.logFile(al.ID, "train", "stdout"))
		}
		steps := sortedSteps(losses(logs...))
		last := 0
		if len(steps) > 0 {
			last = steps[len(steps)-1]
		}
		return ckptAtPreemption >= preemptCkptAt && last >= ckptAtPreemption+2*preemptLogEvery,
			fmt.Sprintf("newest checkpoint %d, loss logged up to step %d", ckptAtPreemption, last)
	})

	// team-a reclaims its quota: 3 GPUs, with 2 free.
	submitted := time.Now()
	c.submitDetached(t, a, queueTrainSpecIn("team-a", a, 3, 15))
	var preempted *admit.Status
	queueWait(t, time.Minute, "team-b's job preempted", func() (bool, string) {
		preempted = queueStatus(t, cc, b)
		return preempted != nil && preempted.Preemptions > 0, fmt.Sprintf("%+v", preempted)
	})
	t.Logf("team-b's job preempted %s after team-a's submit, at checkpoint step %d: %s",
		time.Since(submitted).Round(100*time.Millisecond), ckptAtPreemption, preempted.PreemptedWhy)
	if preempted.PreemptedBy != "default/"+a || !strings.Contains(preempted.PreemptedWhy, "queue team-a reclaims 2 GPUs lent to team-b") {
		t.Errorf("team-b's job preempted by %q because %q; want by default/%s, team-a reclaiming its GPUs", preempted.PreemptedBy, preempted.PreemptedWhy, a)
	}
	if sq := c.jobQueueStatus(t, b); sq.Preemptions != 1 || sq.PreemptedBy != "default/"+a || sq.PreemptedWhy != preempted.PreemptedWhy ||
		(sq.State != admit.StatePreempted && sq.State != admit.StateQueued) {
		t.Errorf("gpujob status --json %s: queue %+v; want preempted (or queued again) once, by default/%s, saying why", b, *sq, a)
	}

	// Stopped whole: every member of the first admission stopped by the
	// queue (desired stop), none rescheduled or failed over.
	stopped := c.waitAllocs(t, ctx(t, time.Minute), b, "every member of the first admission stopped", func(as []*api.AllocationListStub) bool {
		return len(as) >= 2 && allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed)(as)
	})
	if len(stopped) != 2 {
		t.Errorf("team-b's job has %d allocations after the preemption, want its 2: %s", len(stopped), describeAllocs(stopped))
	}
	for _, al := range stopped {
		if al.DesiredStatus != api.AllocDesiredStatusStop {
			t.Errorf("member %s of the preempted gang: desired %s, client %s; want stopped by the queue", al.Name, al.DesiredStatus, al.ClientStatus)
		}
	}
	var before []string
	for _, al := range first {
		before = append(before, c.taskLog(t, al.ID, "train", "stdout"))
	}

	// team-a's gang runs whole; team-b's waits at its place.
	queueWait(t, time.Minute, "team-a's job admitted", func() (bool, string) {
		st := queueStatus(t, cc, a)
		return st != nil && st.State == admit.StateAdmitted, fmt.Sprintf("%+v", st)
	})
	c.checkAdmittedWhole(t, cc, a, 3)
	t.Logf("team-a's job admitted %s after its submit", time.Since(submitted).Round(100*time.Millisecond))
	queueWait(t, 30*time.Second, "team-b's job queued again", func() (bool, string) {
		st := queueStatus(t, cc, b)
		return st != nil && st.State == admit.StateQueued && st.Position == 1, fmt.Sprintf("%+v", st)
	})
	if sq := c.jobQueueStatus(t, b); sq.State != admit.StateQueued || sq.Position != 1 || sq.PreemptedBy != "default/"+a {
		t.Errorf("gpujob status --json %s while team-a runs: queue %+v; want queued at position 1, last preempted by default/%s", b, *sq, a)
	}
	if held := c.holding(t, b); len(held) != 0 {
		t.Errorf("team-b's job holds %d allocations while queued again", len(held))
	}

	// team-a's gang ends; team-b's job is admitted again, resumes from its
	// checkpoint and completes.
	queueWait(t, 2*time.Minute, "team-b's job admitted again", func() (bool, string) {
		st := queueStatus(t, cc, b)
		return st != nil && st.State == admit.StateAdmitted && st.Admissions == 2, fmt.Sprintf("%+v", st)
	})
	if held := c.holding(t, a); len(held) != 0 {
		t.Errorf("team-b's job was admitted again while team-a's held %d allocations", len(held))
	}
	t.Logf("team-b's job admitted again %s after team-a's submit", time.Since(submitted).Round(100*time.Millisecond))
	c.checkAdmittedWhole(t, cc, b, 2)
	allocs := c.waitAllocs(t, ctx(t, 3*time.Minute), b, "the resumed run to end", func(as []*api.AllocationListStub) bool {
		ended := 0
		for _, al := range as {
			if al.JobVersion > first[0].JobVersion &&
				(al.ClientStatus == api.AllocClientStatusComplete || al.ClientStatus == api.AllocClientStatusFailed) {
				ended++
			}
		}
		return ended == 2
	})
	var second []*api.AllocationListStub
	for _, al := range allocs {
		if al.JobVersion > first[0].JobVersion {
			second = append(second, al)
		}
	}
	res := c.finalResult(t, second)
	var after []string
	for _, al := range second {
		after = append(after, c.taskLog(t, al.ID, "train", "stdout"))
	}
	sampler.check(t)

	lb, la := losses(before...), losses(after...)
	stepsBefore, stepsAfter := sortedSteps(lb), sortedSteps(la)
	if len(stepsBefore) == 0 || len(stepsAfter) == 0 {
		t.Fatalf("loss lines: %d steps before the preemption, %d after", len(stepsBefore), len(stepsAfter))
	}
	lastBefore, firstAfter := stepsBefore[len(stepsBefore)-1], stepsAfter[0]
	t.Logf("result: accuracy %.4f, %d steps, world size %d, restarts %d, resumed from step %d (checkpoint at the preemption: %d); "+
		"loss %.4f at step %d (first logged) and %.4f at step %d (last) before the preemption, %.4f at step %d (first) after the resume",
		res.Accuracy, res.Steps, res.WorldSize, res.RestartCount, res.ResumedFromStep, ckptAtPreemption,
		lb[stepsBefore[0]], stepsBefore[0], lb[lastBefore], lastBefore, la[firstAfter], firstAfter)
	if res.Steps != preemptSteps || res.WorldSize != 2 {
		t.Errorf("result: %d steps, world size %d; want %d and 2", res.Steps, res.WorldSize, preemptSteps)
	}
	if res.ResumedFromStep < ckptAtPreemption || res.ResumedFromStep > lastBefore {
		t.Errorf("the readmitted job resumed from step %d; want the newest checkpoint at the preemption (%d) or a later one, at most the last step logged (%d)",
			res.ResumedFromStep, ckptAtPreemption, lastBefore)
	}
	if firstAfter != res.ResumedFromStep+preemptLogEvery {
		t.Errorf("the first loss after the resume is at step %d; want step %d, %d steps after the checkpoint", firstAfter, res.ResumedFromStep+preemptLogEvery, preemptLogEvery)
	}
	// Continuity: the steps trained twice (from the checkpoint to the
	// preemption) give the same loss, the workload being deterministic;
	// and the first loss after the resume continues the last one logged
	// before it at or below its step, where a run restarted from scratch,
	// or from another model, would be back at the start's loss.
	replayed := 0
	for _, s := range stepsAfter {
		if l, ok := lb[s]; ok {
			replayed++
			if math.Abs(l-la[s]) > replayTolerance {
				t.Errorf("step %d: loss %.4f before the preemption, %.4f after the resume; want the same (within %g)", s, l, la[s], replayTolerance)
			}
		}
	}
	prev := stepsBefore[0]
	for _, s := range stepsBefore {
		if s <= firstAfter {
			prev = s
		}
	}
	start := lb[stepsBefore[0]]
	t.Logf("%d steps logged both before the preemption and after the resume; loss %.4f at step %d (the run's first), %.4f at step %d before, %.4f at step %d after",
		replayed, start, stepsBefore[0], lb[prev], prev, la[firstAfter], firstAfter)
	if start-lb[lastBefore] < 2*continuityTolerance {
		t.Fatalf("the loss fell only from %.4f to %.4f before the preemption: too little for continuity to show", start, lb[lastBefore])
	}
	if d := math.Abs(la[firstAfter] - lb[prev]); d > continuityTolerance || d > math.Abs(la[firstAfter]-start) {
		t.Errorf("the loss jumped by %.4f across the preemption: %.4f at step %d before, %.4f at step %d after the resume; "+
			"want within %g, and nearer the loss before than the run's first (%.4f)", d, lb[prev], prev, la[firstAfter], firstAfter, continuityTolerance, start)
	}
}
