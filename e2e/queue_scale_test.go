package e2e

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
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

const (
	// scaleJobs is how many jobs TestQueueFiveHundredJobs queues.
	scaleJobs = 500
	// scaleStatusWithin bounds the time from the last record written to
	// every job having its place: 0.3 s measured here (2 cores, the agents
	// and the 3 s of writes beside the controller).
	scaleStatusWithin = 10 * time.Second
	// scaleWaves is how many waves of 4 one-GPU jobs the test sees
	// admitted once the cluster frees.
	scaleWaves = 3
)

// scaleJob is one of the queued jobs, as the test expects it ordered.
type scaleJob struct {
	id        string
	priority  int
	submitted time.Time
}

// 500 queued jobs on the 4-GPU dev cluster, their records written where
// submit writes them (one check-and-set each, as 500 submits would) while
// a 4-GPU gang holds the cluster. The controller keeps up: every job has
// its status, with its place, within scaleStatusWithin of the last write;
// the places are 1..500, higher priority first and, within a priority, in
// submission order (submissions shuffled against the jobs' names, so an
// order by name fails); `gpujob queue status -json` lists all 500 in that
// order. Once the gang ends, the queue admits the head of the line as
// capacity frees: wave after wave of four 1-GPU jobs, each exactly the
// next four in line, and the rest move up.
func TestQueueFiveHundredJobs(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	c.waitDriverHealthy(t)
	cc := c.consulClient(t)
	const blocker = "e2e-q500-blocker"
	c.resetQueues(t, cc)
	t.Cleanup(func() {
		// The controller first, so that it registers nothing more, then
		// every job it registered.
		c.purge(render.QueueControllerJob)
		jobs, _, _ := c.nomad.Jobs().PrefixList("e2e-q500-")
		var ids []string
		for _, j := range jobs {
			ids = append(ids, j.ID)
		}
		c.resetQueues(t, cc, ids...)
	})
	c.applyQueues(t, cc, fmt.Sprintf("queue \"default\" {\n  gpus = %d\n}\n", fakeGPUsPerClient))

	// The cluster held: a gang of its 4 GPUs, until the test stops it; of
	// a priority above every queued job's, which would preempt it else.
	br := c.queueRecord(t, queueTrainSpec(blocker, fakeGPUsPerClient, 600))
	br.Priority = 90
	putRecord(t, cc, br)
	queueWait(t, time.Minute, "the blocker admitted", func() (bool, string) {
		st := queueStatus(t, cc, blocker)
		return st != nil && st.State == admit.StateAdmitted, fmt.Sprintf("%+v", st)
	})
	c.waitHolding(t, blocker, fakeGPUsPerClient, time.Minute)

	// One rendered job, copied under 500 names: 1 GPU, 2 s. Every fifth
	// has priority 70 (the rest the queue's, 50); submission times are a
	// shuffle of 500 instants a millisecond apart.
	tmpl := c.queueRecord(t, queueTrainSpec("e2e-q500-000", 1, 2))
	var job api.Job
	if err := json.Unmarshal(tmpl.Job, &job); err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Hour).UTC()
	rng := rand.New(rand.NewPCG(25, 500))
	slots := rng.Perm(scaleJobs)
	jobs := make([]scaleJob, scaleJobs)
	for i := range jobs {
		jobs[i] = scaleJob{id: fmt.Sprintf("e2e-q500-%03d", i), submitted: base.Add(time.Duration(slots[i]) * time.Millisecond)}
		if i%5 == 4 {
			jobs[i].priority = 70
		}
	}
	written := time.Now()
	for _, j := range jobs {
		rec := *tmpl
		id := j.id
		job.ID, job.Name = &id, &id
		job.Priority = nil
		if j.priority != 0 {
			job.Priority = &j.priority
		}
		raw, err := json.Marshal(&job)
		if err != nil {
			t.Fatal(err)
		}
		rec.ID, rec.Job, rec.Priority, rec.SubmittedAt = id, raw, j.priority, j.submitted
		putRecord(t, cc, &rec)
	}
	writing := time.Since(written)
	lastWrite := time.Now()

	// The expected line: priority 70 first, then by submission.
	line := slices.Clone(jobs)
	slices.SortFunc(line, func(a, b scaleJob) int {
		if c := cmp.Compare(b.priority, a.priority); c != 0 {
			return c
		}
		return a.submitted.Compare(b.submitted)
	})
	if slices.IsSortedFunc(line, func(a, b scaleJob) int { return cmp.Compare(a.id, b.id) }) {
		t.Fatal("the expected order is the jobs' names' order: the test could not tell FIFO from an order by name")
	}

	// statuses reads every status under the jobs' tree at once.
	statuses := func() map[string]*admit.Status {
		t.Helper()
		kvs, _, err := cc.KV().List(contract.QueueStatusPrefix+"/default/", &consul.QueryOptions{RequireConsistent: true})
		if err != nil {
			t.Fatalf("listing the statuses: %v", err)
		}
		out := map[string]*admit.Status{}
		for _, kv := range kvs {
			st, err := admit.DecodeStatus(kv.Value)
			if err != nil {
				t.Fatalf("status %s: %v", kv.Key, err)
			}
			out[strings.TrimPrefix(kv.Key, contract.QueueStatusPrefix+"/default/")] = st
		}
		return out
	}
	// inLine checks that the jobs of want wait at positions 1..len(want)
	// in that order.
	inLine := func(sts map[string]*admit.Status, want []scaleJob) (bool, string) {
		for i, j := range want {
			st := sts[j.id]
			if st == nil || st.State != admit.StateQueued || st.Position != i+1 {
				return false, fmt.Sprintf("%s (priority %d, submitted %s): %+v, want queued at position %d",
					j.id, j.priority, j.submitted.Format("15:04:05.000"), st, i+1)
			}
		}
		return true, ""
	}
	queueWait(t, scaleStatusWithin, fmt.Sprintf("all %d jobs queued in line", scaleJobs), func() (bool, string) {
		return inLine(statuses(), line)
	})
	t.Logf("%d records written in %s; every job queued at its place %s after the last write",
		scaleJobs, writing.Round(time.Millisecond), time.Since(lastWrite).Round(100*time.Millisecond))
	if st := queueStatus(t, cc, line[0].id); !strings.Contains(st.Reason, "GPU") {
		t.Errorf("the head of the line waits because %q; want the GPUs it needs", st.Reason)
	}

	// gpujob queue status -json lists them all, next first.
	listed := time.Now()
	out, errOut, code := c.gpujobEnv(t, c.queueEnv(), time.Minute, "queue", "status", "-json")
	if code != 0 {
		t.Fatalf("gpujob queue status -json exited %d:\n%s", code, errOut)
	}
	t.Logf("gpujob queue status -json: %d bytes in %s", len(out), time.Since(listed).Round(time.Millisecond))
	var qs struct {
		Queues []struct {
			Name   string `json:"name"`
			Queued []struct {
				JobID    string `json:"job_id"`
				State    string `json:"state"`
				Position int    `json:"position"`
			} `json:"queued"`
		} `json:"queues"`
	}
	if err := json.Unmarshal([]byte(out), &qs); err != nil || len(qs.Queues) != 1 || qs.Queues[0].Name != "default" {
		t.Fatalf("gpujob queue status -json: %v; want the default queue alone:\n%.2000s", err, out)
	}
	if q := qs.Queues[0].Queued; len(q) != scaleJobs {
		t.Errorf("gpujob queue status -json lists %d queued jobs, want %d", len(q), scaleJobs)
	} else {
		for i, j := range line {
			if q[i].JobID != j.id || q[i].Position != i+1 || q[i].State != admit.StateQueued {
				t.Errorf("gpujob queue status -json: entry %d is %+v; want %s queued at position %d", i, q[i], j.id, i+1)
				break
			}
		}
	}

	// The cluster frees: the head of the line is admitted, four at a time
	// (1 GPU each), and the rest move up.
	if _, _, err := c.nomad.Jobs().Deregister(blocker, false, nil); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	// progress is how many of the line's head are admitted (or ended and
	// forgotten), the rest waiting at positions 1.. in order.
	progress := func(sts map[string]*admit.Status) (int, bool, string) {
		n := 0
		for n < len(line) {
			if st := sts[line[n].id]; st != nil && st.State != admit.StateAdmitted {
				break
			}
			n++
		}
		ok, why := inLine(sts, line[n:])
		return n, ok, why
	}
	for w := 1; w <= scaleWaves; w++ {
		queueWait(t, time.Minute, fmt.Sprintf("the first %d in line admitted", 4*w), func() (bool, string) {
			n, ok, why := progress(statuses())
			return n >= 4*w && ok, fmt.Sprintf("the first %d admitted; %s", n, why)
		})
		t.Logf("the first %d jobs in line admitted %s after the cluster freed", 4*w, time.Since(freed).Round(100*time.Millisecond))
	}
	n, _, _ := progress(statuses())
	for _, j := range line[n:] {
		if _, _, err := c.nomad.Jobs().Info(j.id, nil); err == nil {
			t.Fatalf("%s, still in line, has a Nomad job", j.id)
		}
	}
	for _, j := range line[:4*scaleWaves] {
		c.waitAllocs(t, ctx(t, time.Minute), j.id, "its member complete", allIn(api.AllocClientStatusComplete))
	}
}
