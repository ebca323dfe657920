package observe

import (
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// QueueSummary is one queue of the applied queue configuration: its quota,
// what its jobs hold, what waits in it, and the admission controller's
// counters. A last summary, named admit.UndeclaredQueue, gathers what
// names a queue the configuration does not declare, when there is any.
type QueueSummary struct {
	Name string `json:"name"`
	// Declared is false for the admit.UndeclaredQueue summary.
	Declared bool `json:"declared"`
	// QuotaGPUs is the queue's quota (0: none, the cluster is its limit).
	QuotaGPUs int  `json:"quota_gpus"`
	Borrow    bool `json:"borrow"`
	// UsedGPUs is the GPUs the queue's jobs' allocations hold now (the
	// HoldsDevices rule), what the controller counts against the quota:
	// its admitted jobs, those it is preempting until they stop, and
	// gpujob jobs registered outside the queue that name it.
	UsedGPUs int `json:"used_gpus"`
	// BorrowedGPUs is the GPUs used beyond the quota (0 without one).
	BorrowedGPUs int `json:"borrowed_gpus"`
	// WaitingJobs are the queued jobs not admitted yet (queued, or not
	// answered yet by the controller), WaitingGPUs what they ask for.
	WaitingJobs int `json:"waiting_jobs"`
	WaitingGPUs int `json:"waiting_gpus"`
	// OldestWaitSince is when the longest-waiting job began to wait: its
	// submission, or its requeue after a preemption; nil when none waits.
	OldestWaitSince *time.Time `json:"oldest_wait_since,omitempty"`
	// PreemptedJobs are the jobs preempted and not admitted again: being
	// stopped, or waiting in the queue again.
	PreemptedJobs int `json:"preempted_jobs"`
	// RefusedJobs are the jobs the controller refused whose records stay
	// (until the queues change or gpujob stop withdraws them).
	RefusedJobs int `json:"refused_jobs"`
	// Counters are the controller's counters (admit.Stats; zero before it
	// counted anything), nil when they could not be read.
	Counters *admit.QueueStats `json:"counters,omitempty"`
}

// QueueRecords is the queues' tree as read from Consul.
type QueueRecords struct {
	// Config is the applied configuration; nil when none is (then there
	// is no queue summary: the cluster is not in queue mode).
	Config *queuekv.Record
	Jobs   []QueuedJob
	// Statuses are the controller's, by "namespace/id".
	Statuses map[string]*admit.Status
	// Stats are the controller's counters (admit.NewStats when it has
	// stored none), nil when they could not be read.
	Stats *admit.Stats
}

// QueuedJob is the part of a queued job's record a summary counts.
type QueuedJob struct {
	Namespace, ID string
	// RecordIndex is the record's Consul CreateIndex, which its status
	// names.
	RecordIndex uint64
	// Queue is the queue it names (admit.RecordQueue).
	Queue       string
	GPUs        int
	SubmittedAt time.Time
	// Invalid: the record cannot be read; the controller refuses it.
	Invalid bool
}

// SummarizeQueues counts each declared queue's use and waiting jobs; it
// returns nil without a configuration. jobs and allocs are Nomad's (every
// namespace): the GPUs a queue uses are those its jobs' live allocations
// hold, by their job's queue meta.
func SummarizeQueues(recs *QueueRecords, jobs []*api.JobListStub, allocs []*api.AllocationListStub) []QueueSummary {
	if recs == nil || recs.Config == nil {
		return nil
	}
	var order []string
	byName := map[string]*QueueSummary{}
	queues := recs.Config.Queues
	if len(queues) == 0 { // a file with no queue block: the default queue alone
		queues = []queuekv.Queue{{Name: policy.DefaultQueue, Borrow: true}}
	}
	for _, q := range queues {
		byName[q.Name] = &QueueSummary{Name: q.Name, Declared: true, QuotaGPUs: q.GPUs, Borrow: q.Borrow}
		order = append(order, q.Name)
	}
	other := &QueueSummary{Name: admit.UndeclaredQueue}
	of := func(name string) *QueueSummary {
		if name == "" {
			name = policy.DefaultQueue
		}
		if s := byName[name]; s != nil {
			return s
		}
		return other
	}

	queueOf := map[string]string{} // namespace/job → its queue, of gpujob's jobs
	for _, j := range jobs {
		if j != nil && JobKind(j.Meta) != "" {
			queueOf[j.Namespace+"/"+j.ID] = j.Meta[contract.MetaQueue]
		}
	}
	for _, a := range allocs {
		if a == nil || !HoldsDevices(a.ClientStatus) {
			continue
		}
		q, ok := queueOf[a.Namespace+"/"+a.JobID]
		if !ok {
			continue // not a gpujob train, trial or service job: in no queue
		}
		of(q).UsedGPUs += gpusOfAlloc(a)
	}

	for _, j := range recs.Jobs {
		s := of(j.Queue)
		if j.Invalid {
			s.RefusedJobs++
			continue
		}
		st := recs.Statuses[j.Namespace+"/"+j.ID]
		if st != nil && st.RecordIndex != j.RecordIndex {
			st = nil // about an earlier record of the name
		}
		state := admit.StateQueued // not answered yet: it waits
		if st != nil {
			state = st.State
		}
		switch state {
		case admit.StateQueued:
			s.WaitingJobs++
			s.WaitingGPUs += j.GPUs
			since := j.SubmittedAt
			if st != nil && st.QueuedAt != nil {
				since = *st.QueuedAt
			}
			if s.OldestWaitSince == nil || since.Before(*s.OldestWaitSince) {
				s.OldestWaitSince = &since
			}
			if st != nil && st.Preemptions > 0 {
				s.PreemptedJobs++
			}
		case admit.StatePreempted:
			s.PreemptedJobs++
		case admit.StateRefused:
			s.RefusedJobs++
		}
	}

	out := make([]QueueSummary, 0, len(order)+1)
	for _, name := range order {
		out = append(out, *byName[name])
	}
	if *other != (QueueSummary{Name: admit.UndeclaredQueue}) || (recs.Stats != nil && recs.Stats.Queues[admit.UndeclaredQueue] != nil) {
		out = append(out, *other)
	}
	for i := range out {
		s := &out[i]
		if s.QuotaGPUs > 0 {
			s.BorrowedGPUs = max(s.UsedGPUs-s.QuotaGPUs, 0)
		}
		if recs.Stats != nil {
			s.Counters = countersOf(recs.Stats, s.Name)
		}
	}
	return out
}

// gpusOfAlloc counts the GPUs Nomad reserved to an allocation.
func gpusOfAlloc(a *api.AllocationListStub) int {
	if a.AllocatedResources == nil {
		return 0
	}
	n := 0
	for _, tr := range a.AllocatedResources.Tasks {
		if tr == nil {
			continue
		}
		for _, d := range tr.Devices {
			if d != nil && d.Type == contract.GPUDeviceType {
				n += len(d.DeviceIDs)
			}
		}
	}
	return n
}

// countersOf is a copy of queue's counters in stats, zero when it has
// none yet.
func countersOf(stats *admit.Stats, queue string) *admit.QueueStats {
	c := stats.Queues[queue]
	if c == nil {
		return admit.NewStats().Queue(queue)
	}
	cp := *c
	cp.LatencyCounts = append([]uint64(nil), c.LatencyCounts...)
	return &cp
}
