package observe

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// gpuAlloc is an allocation of job holding gpus GPUs (client status cs).
func gpuAlloc(id, ns, job, cs string, gpus int) *api.AllocationListStub {
	var ids []string
	for i := range gpus {
		ids = append(ids, id+"-gpu"+string(rune('0'+i)))
	}
	return &api.AllocationListStub{ID: id, Namespace: ns, JobID: job, ClientStatus: cs,
		AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{"train": {
			Devices: []*api.AllocatedDeviceResource{{Vendor: "nvidia", Type: "gpu", DeviceIDs: ids},
				{Vendor: "x", Type: "fpga", DeviceIDs: []string{"f0"}}}}}}}
}

// Each declared queue gets its quota, the GPUs its jobs' live allocations
// hold (and what of it is borrowed), its waiting jobs and their GPUs, the
// oldest wait (from the requeue of a preempted job), its preempted and
// refused jobs, and the controller's counters; what names an undeclared
// queue is gathered apart, whatever a Nomad job's meta says.
func TestSummarizeQueues(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 14, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { v := t0.Add(d); return &v }
	stats := admit.NewStats()
	stats.Queue("team-a").Admitted(3, 2*time.Minute)
	stats.Queue("team-a").Preemptions = 1
	recs := &QueueRecords{
		Config: &queuekv.Record{Queues: []queuekv.Queue{
			{Name: "team-a", GPUs: 4, Borrow: true}, {Name: "team-b", GPUs: 2}, {Name: "default"}}},
		Jobs: []QueuedJob{
			{Namespace: "ml", ID: "running", RecordIndex: 1, Queue: "team-a", GPUs: 6, SubmittedAt: t0},
			{Namespace: "ml", ID: "new", RecordIndex: 2, Queue: "team-a", GPUs: 2, SubmittedAt: t0.Add(-time.Minute)},
			{Namespace: "ml", ID: "requeued", RecordIndex: 3, Queue: "team-a", GPUs: 4, SubmittedAt: t0.Add(-time.Hour)},
			{Namespace: "ml", ID: "stopping", RecordIndex: 4, Queue: "team-a", GPUs: 1, SubmittedAt: t0.Add(-2 * time.Hour)},
			{Namespace: "ml", ID: "stale", RecordIndex: 9, Queue: "team-b", GPUs: 1, SubmittedAt: t0.Add(-30 * time.Minute)},
			{Namespace: "ml", ID: "refused", RecordIndex: 5, Queue: "team-b", GPUs: 8, SubmittedAt: t0},
			{Namespace: "ml", ID: "broken", RecordIndex: 6, Queue: "team-b", Invalid: true},
			{Namespace: "ml", ID: "gone-queue", RecordIndex: 7, Queue: "old", GPUs: 1, SubmittedAt: t0},
		},
		Statuses: map[string]*admit.Status{
			"ml/running":  {State: admit.StateAdmitted, RecordIndex: 1, Admissions: 1},
			"ml/requeued": {State: admit.StateQueued, RecordIndex: 3, Preemptions: 1, QueuedAt: at(-10 * time.Minute)},
			"ml/stopping": {State: admit.StatePreempted, RecordIndex: 4, Admissions: 1, Preemptions: 1},
			"ml/stale":    {State: admit.StateAdmitted, RecordIndex: 8, Admissions: 1}, // an earlier record's
			"ml/refused":  {State: admit.StateRefused, RecordIndex: 5},
		},
		Stats: stats,
	}
	jobs := []*api.JobListStub{
		{ID: "running", Namespace: "ml", Meta: map[string]string{"gpujob": "train", "gpujob_queue": "team-a"}},
		{ID: "stopping", Namespace: "ml", Meta: map[string]string{"gpujob": "train", "gpujob_queue": "team-a"}},
		{ID: "svc", Namespace: "ml", Meta: map[string]string{"gpujob": "service"}}, // the default queue
		{ID: "outsider", Namespace: "ml", Meta: map[string]string{"gpujob_queue": "team-b"}},
		{ID: "evil", Namespace: "ml", Meta: map[string]string{"gpujob": "train", "gpujob_queue": "x\x1b[2J"}},
	}
	allocs := []*api.AllocationListStub{
		gpuAlloc("r0", "ml", "running", "running", 3), gpuAlloc("r1", "ml", "running", "pending", 3),
		gpuAlloc("r2", "ml", "running", "complete", 3), // holds nothing any more
		gpuAlloc("s0", "ml", "stopping", "running", 1),
		gpuAlloc("v0", "ml", "svc", "running", 1),
		gpuAlloc("o0", "ml", "outsider", "running", 2), // not a gpujob job: in no queue
		gpuAlloc("e0", "ml", "evil", "running", 1),
		nil,
	}
	got := SummarizeQueues(recs, jobs, allocs)
	if len(got) != 4 {
		t.Fatalf("%d summaries, want team-a, team-b, default and the undeclared: %+v", len(got), got)
	}
	a, b, d, u := got[0], got[1], got[2], got[3]
	if a.Name != "team-a" || !a.Declared || a.QuotaGPUs != 4 || !a.Borrow || a.UsedGPUs != 7 || a.BorrowedGPUs != 3 ||
		a.WaitingJobs != 2 || a.WaitingGPUs != 6 || a.PreemptedJobs != 2 || a.RefusedJobs != 0 ||
		a.OldestWaitSince == nil || !a.OldestWaitSince.Equal(t0.Add(-10*time.Minute)) {
		t.Errorf("team-a: %+v", a)
	}
	if a.Counters == nil || a.Counters.Admissions != 3 || a.Counters.Preemptions != 1 {
		t.Errorf("team-a counters: %+v", a.Counters)
	}
	if b.Name != "team-b" || b.UsedGPUs != 0 || b.WaitingJobs != 1 || b.WaitingGPUs != 1 || b.RefusedJobs != 2 ||
		!b.OldestWaitSince.Equal(t0.Add(-30*time.Minute)) || b.Counters == nil || b.Counters.Admissions != 0 {
		t.Errorf("team-b: %+v", b)
	}
	if d.Name != "default" || d.QuotaGPUs != 0 || d.UsedGPUs != 1 || d.BorrowedGPUs != 0 || d.WaitingJobs != 0 || d.OldestWaitSince != nil {
		t.Errorf("default: %+v", d)
	}
	if u.Name != admit.UndeclaredQueue || u.Declared || u.UsedGPUs != 1 || u.WaitingJobs != 1 {
		t.Errorf("undeclared: %+v", u)
	}
	for _, s := range got {
		if strings.ContainsAny(s.Name, "\x1b") {
			t.Errorf("a queue named from a job's meta: %q", s.Name)
		}
	}
	// The summary copied the counters: the watcher's stay as read.
	a.Counters.Admissions = 99
	if len(stats.Queues) != 1 || stats.Queues["team-a"].Admissions != 3 {
		t.Errorf("summarizing changed the stats read: %+v", stats.Queues)
	}

	// Counters that could not be read: none shown, the rest stands.
	recs.Stats = nil
	if got := SummarizeQueues(recs, jobs, allocs); got[0].Counters != nil || got[0].UsedGPUs != 7 {
		t.Errorf("without stats: %+v", got[0])
	}
	// Nothing undeclared: no such summary.
	recs.Jobs = recs.Jobs[:1]
	if got := SummarizeQueues(recs, jobs[:1], allocs[:2]); len(got) != 3 {
		t.Errorf("%d summaries with nothing undeclared: %+v", len(got), got)
	}
	// No configuration: not in queue mode, no summary at all.
	if got := SummarizeQueues(&QueueRecords{}, jobs, allocs); got != nil {
		t.Errorf("without a configuration: %+v", got)
	}
	if got := SummarizeQueues(nil, jobs, allocs); got != nil {
		t.Errorf("nothing read: %+v", got)
	}
	// A configuration without queues: the default queue alone, no quota.
	got = SummarizeQueues(&QueueRecords{Config: &queuekv.Record{}}, jobs, allocs)
	if len(got) != 2 || got[0].Name != "default" || got[0].UsedGPUs != 1 || !got[0].Borrow {
		t.Errorf("an empty configuration: %+v", got)
	}
}
