package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
)

// queueConsulOutage is how long TestQueueControllerCrashAndConsulRestart
// keeps Consul down: past the controller's session TTL (10 s), so that its
// renewals fail for longer than the session is promised to live.
const queueConsulOutage = 15 * time.Second

// admitFourWithin bounds how long TestQueueControllerCrashAndConsulRestart's
// four waiting 3-second gangs take to be admitted one after another once
// the running gang stops: 15 s measured here.
const admitFourWithin = 45 * time.Second

// admittedJob is what the Nomad side of one admission looks like, to tell
// that it was not registered again.
type admittedJob struct {
	version, jobModifyIndex uint64
	marker                  string
	allocs                  []string
}

// admittedOnce reads job id's Nomad job and checks that the queue
// registered it exactly once: version 0 (a second registration, with the
// next admission's marker, makes version 1), the first admission's marker
// of its record, and one evaluation that placed all members.
func (c *cluster) admittedOnce(t *testing.T, id string, recordIndex uint64, members int) admittedJob {
	t.Helper()
	job, _, err := c.nomad.Jobs().Info(id, nil)
	if err != nil {
		t.Fatalf("job %s: %v", id, err)
	}
	got := admittedJob{version: *job.Version, jobModifyIndex: *job.JobModifyIndex, marker: job.Meta[contract.MetaAdmission]}
	if got.version != 0 || got.marker != admit.Marker(recordIndex, 1) {
		t.Errorf("job %s: version %d, admission marker %q; want registered once: version 0, marker %q",
			id, got.version, got.marker, admit.Marker(recordIndex, 1))
	}
	as, err := c.allocsOf(id)
	if err != nil {
		t.Fatalf("allocations of %s: %v", id, err)
	}
	evals := map[string]bool{}
	for _, a := range as {
		got.allocs = append(got.allocs, a.ID)
		evals[a.EvalID] = true
	}
	slices.Sort(got.allocs)
	if len(as) != members || len(evals) != 1 {
		t.Errorf("job %s: %d allocations by %d evaluations; want %d, placed by one: %s", id, len(as), len(evals), members, describeAllocs(as))
	}
	return got
}

// The admission controller's state survives its crash and a Consul
// restart. A 4-GPU gang is admitted and runs; four more wait behind it.
// The controller is killed with SIGKILL (Nomad restarts it; the new
// process waits out its predecessor's session) while a fifth job is
// queued; then Consul is stopped for longer than the controller's
// session TTL and started again. After each fault: every queued record
// is still there (the same records: their Consul create indexes), the
// waiting jobs keep their order (positions 1..n by submission, the job
// queued during the crash last), the running gang was not registered
// again (Nomad version, job modify index, marker, the same allocations)
// and nothing else reached Nomad. Then the running gang ends, and the
// queue admits the rest one by one, each exactly once and whole.
func TestQueueControllerCrashAndConsulRestart(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	c.waitDriverHealthy(t)
	cc := c.consulClient(t)
	const running = "e2e-qcrash-run"
	waiting := []string{"e2e-qcrash-1", "e2e-qcrash-2", "e2e-qcrash-3", "e2e-qcrash-4"} // the last queued during the crash
	c.resetQueues(t, cc)
	t.Cleanup(func() { c.resetQueues(t, cc, append([]string{running}, waiting...)...) })

	c.applyQueues(t, cc, fmt.Sprintf("queue \"default\" {\n  gpus = %d\n}\n", fakeGPUsPerClient))
	leaderAlloc, session := c.waitQueueLeader(t, cc, "", time.Minute)

	// One gang of the whole cluster runs (until the test stops it), three
	// wait behind it, each as large.
	created := map[string]uint64{}
	put := func(id string, secs int, at time.Time) {
		t.Helper()
		rec := c.queueRecord(t, queueTrainSpec(id, fakeGPUsPerClient, secs))
		rec.SubmittedAt = at.UTC()
		putRecord(t, cc, rec)
		kv, _, err := cc.KV().Get(admit.JobKey(contract.QueueJobsPrefix, "default", id), nil)
		if err != nil || kv == nil {
			t.Fatalf("reading back the record of %s: %v", id, err)
		}
		created[id] = kv.CreateIndex
	}
	base := time.Now().Add(-time.Minute)
	put(running, 600, base)
	queueWait(t, time.Minute, "the first gang admitted", func() (bool, string) {
		st := queueStatus(t, cc, running)
		return st != nil && st.State == admit.StateAdmitted, fmt.Sprintf("%+v", st)
	})
	c.waitHolding(t, running, fakeGPUsPerClient, time.Minute)
	ran := c.admittedOnce(t, running, created[running], fakeGPUsPerClient)
	for i, id := range waiting[:3] {
		put(id, 3, base.Add(time.Duration(i+1)*time.Second))
	}

	// intact waits until the queue says what it said before the faults:
	// every record there (and no other), the running gang admitted once,
	// the waiting ones queued at positions 1..n in submission order; and
	// checks that Nomad registered nothing new.
	intact := func(what string, queued []string) {
		t.Helper()
		want := append([]string{running}, queued...)
		queueWait(t, 2*time.Minute, "the queue intact "+what, func() (bool, string) {
			keys, _, err := cc.KV().List(contract.QueueJobsPrefix+"/", &consul.QueryOptions{RequireConsistent: true})
			if err != nil {
				return false, fmt.Sprintf("listing the records: %v", err)
			}
			var have []string
			for _, kv := range keys {
				id := strings.TrimPrefix(kv.Key, contract.QueueJobsPrefix+"/default/")
				have = append(have, id)
				if kv.CreateIndex != created[id] {
					return false, fmt.Sprintf("record %s has create index %d, want %d (the record submitted)", id, kv.CreateIndex, created[id])
				}
			}
			slices.Sort(have)
			if w := slices.Sorted(slices.Values(want)); !slices.Equal(have, w) {
				return false, fmt.Sprintf("records %v, want %v", have, w)
			}
			if st := queueStatus(t, cc, running); st == nil || st.State != admit.StateAdmitted || st.Admissions != 1 || st.Admitting != 0 {
				return false, fmt.Sprintf("the running gang's status: %+v", st)
			}
			for i, id := range queued {
				st := queueStatus(t, cc, id)
				if st == nil || st.State != admit.StateQueued || st.Position != i+1 || st.Admissions != 0 || st.Admitting != 0 {
					return false, fmt.Sprintf("%s: %+v, want queued at position %d", id, st, i+1)
				}
			}
			return true, ""
		})
		if now := c.admittedOnce(t, running, created[running], fakeGPUsPerClient); now.jobModifyIndex != ran.jobModifyIndex ||
			!slices.Equal(now.allocs, ran.allocs) {
			t.Errorf("%s: the running gang's job modify index %d → %d, allocations %v → %v; want it untouched",
				what, ran.jobModifyIndex, now.jobModifyIndex, ran.allocs, now.allocs)
		}
		if held := c.holding(t, running); len(held) != fakeGPUsPerClient {
			t.Errorf("%s: the running gang holds %d allocations, want %d", what, len(held), fakeGPUsPerClient)
		}
		for _, id := range queued {
			if _, _, err := c.nomad.Jobs().Info(id, nil); err == nil {
				t.Errorf("%s: %s, queued, has a Nomad job", what, id)
			}
		}
	}
	intact("before the faults", waiting[:3])

	// The controller killed: Nomad restarts its task, and the restarted
	// controller leads once its predecessor's session has expired. A job
	// queued meanwhile takes the last place.
	var killed []int
	for _, p := range processes(leaderAlloc) {
		if slices.Contains(p.args, "controller") {
			if err := kill9(p.pid); err != nil {
				t.Fatal(err)
			}
			killed = append(killed, p.pid)
		}
	}
	if len(killed) == 0 {
		t.Fatalf("no controller process of allocation %s: %v", leaderAlloc, processes(leaderAlloc))
	}
	crashed := time.Now()
	put(waiting[3], 3, time.Now())
	alloc, session2 := c.waitQueueLeader(t, cc, session, time.Minute)
	t.Logf("controller %v killed (allocation %s); leading again %s later (allocation %s)", killed, leaderAlloc[:8],
		time.Since(crashed).Round(100*time.Millisecond), alloc[:8])
	info, _, err := c.nomad.Allocations().Info(alloc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ts := info.TaskStates[render.QueueControllerTask]; alloc == leaderAlloc && (ts == nil || ts.Restarts < 1) {
		t.Errorf("the controller's task was not restarted after its kill: %+v", ts)
	}
	intact("after the controller's crash", waiting)

	// Consul stopped for longer than the controller's session TTL, and
	// started again.
	if _, err := c.script("dev-consul.sh", "stop"); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	time.Sleep(queueConsulOutage) // the fault: Consul down this long
	out, err := c.script("dev-consul.sh", "start")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Consul down %s, then: %s", time.Since(stopped).Round(100*time.Millisecond), strings.TrimSpace(out))
	c.waitDriverHealthy(t)
	_, session3 := c.waitQueueLeader(t, cc, "", time.Minute)
	t.Logf("after Consul's restart the controller leads under session %s (before: %s)", session3[:8], session2[:8])
	intact("after Consul's restart", waiting)

	// The running gang ends: the queue admits the waiting ones in order,
	// one at a time (each needs the whole cluster), each once and whole.
	if _, _, err := c.nomad.Jobs().Deregister(running, false, nil); err != nil {
		t.Fatal(err)
	}
	ended := time.Now()
	var order []string
	for _, id := range waiting {
		queueWait(t, time.Minute, id+" admitted", func() (bool, string) {
			st := queueStatus(t, cc, id)
			return st != nil && st.State == admit.StateAdmitted, fmt.Sprintf("%+v", st)
		})
		for _, other := range waiting {
			if other != id && len(c.holding(t, other)) > 0 && !slices.Contains(order, other) {
				t.Errorf("%s was admitted while %s, queued behind it, holds allocations", id, other)
			}
		}
		order = append(order, id)
		c.checkAdmittedWhole(t, cc, id, fakeGPUsPerClient)
	}
	took := time.Since(ended)
	t.Logf("the four waiting gangs admitted in order within %s of the running one's stop", took.Round(100*time.Millisecond))
	if took > admitFourWithin {
		// Each needs about 4 s (placement, 3 s of sleep); a gang that
		// ended soon after its admission once held its GPUs until the
		// next resync, some 25 s each.
		t.Errorf("the four 3-second gangs took %s to be admitted one after another; want within %s", took.Round(100*time.Millisecond), admitFourWithin)
	}
	for _, id := range waiting {
		c.waitAllocs(t, ctx(t, time.Minute), id, "every member complete", allIn(api.AllocClientStatusComplete))
		c.admittedOnce(t, id, created[id], fakeGPUsPerClient)
	}
}
