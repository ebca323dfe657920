package queues

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// Status is each queue's configuration and what it uses now (`gpujob
// queue status -json`).
type Status struct {
	// Applied says where the configuration came from; null when no queue
	// file was applied (then the default queue is the one queue).
	Applied *Applied `json:"applied"`
	// Implicit is true when no queue is declared.
	Implicit bool          `json:"implicit"`
	Queues   []QueueStatus `json:"queues"`
	Cluster  ClusterUse    `json:"cluster"`
	// Warnings are what could not be read; the rest stands.
	Warnings []string `json:"warnings"`
}

// QueueStatus is one queue: its settings, the GPUs its jobs hold and the
// jobs Nomad has not placed yet.
type QueueStatus struct {
	queuekv.Queue
	// Configured is false for a queue jobs name that the configuration
	// does not declare (removed since they were submitted, or never
	// declared); its settings are then empty.
	Configured bool `json:"configured"`
	// UsedGPUs is the GPUs its jobs' live allocations hold (the inventory
	// `gpujob gpus` shows: held until the client reports the allocation
	// complete, failed or lost).
	UsedGPUs int          `json:"used_gpus"`
	Jobs     []JobUse     `json:"jobs"`
	Waiting  []WaitingJob `json:"waiting"`
	// Queued are the jobs in the queue's records that the admission
	// controller has not admitted (queued, waiting for its first answer,
	// refused) or is preempting, next first; absent without any.
	Queued []QueuedJob `json:"queued,omitempty"`
}

// QueuedJob is a job in a queue's records: its name and its queue fields.
type QueuedJob struct {
	Namespace string `json:"namespace"`
	JobID     string `json:"job_id"`
	Kind      string `json:"kind"`
	Members   int    `json:"members"`
	*Info
	line string
}

// JobUse is a job holding GPUs.
type JobUse struct {
	Namespace string `json:"namespace"`
	JobID     string `json:"job_id"`
	Kind      string `json:"kind"` // train, trial, service
	GPUs      int    `json:"gpus"`
}

// WaitingJob is a job with allocations Nomad could not place yet.
type WaitingJob struct {
	Namespace string `json:"namespace"`
	JobID     string `json:"job_id"`
	Kind      string `json:"kind"`
	// Queued is how many of its allocations wait.
	Queued int       `json:"queued"`
	Since  time.Time `json:"since"`
}

// ClusterUse counts the cluster's GPUs.
type ClusterUse struct {
	GPUs    int `json:"gpus"`
	Healthy int `json:"healthy"`
	InUse   int `json:"in_use"`
	Free    int `json:"free"`
	// Outside is the GPUs held by jobs gpujob did not submit: in no queue.
	Outside int `json:"outside"`
}

// ReadStatus reads the configuration and the cluster's inventory (nodes,
// allocations and jobs; no GPU stats) and counts each queue's use. only,
// when set, keeps that queue; one neither declared nor used by a job is
// an *policy.UnknownQueueError.
func ReadStatus(ctx context.Context, store queuekv.Store, nomad observe.Config, only string) (*Status, error) {
	r, index, err := store.Read(ctx)
	if err != nil {
		return nil, err
	}
	nomad.NoStats = true
	snap, err := observe.Once(ctx, nomad)
	if err != nil {
		return nil, err
	}
	return StatusOf(r, index, snap, only)
}

// StatusOf counts each queue's use in snap. A job that names no queue is
// in the default queue; a GPU held by a job gpujob did not submit is in
// none (ClusterUse.Outside).
func StatusOf(r *queuekv.Record, index uint64, snap *observe.Snapshot, only string) (*Status, error) {
	l := listOf(r, index)
	st := &Status{Applied: l.Applied, Implicit: l.Implicit, Queues: []QueueStatus{}, Warnings: append([]string{}, snap.Warnings...)}
	byName := map[string]*QueueStatus{}
	var order []string
	get := func(name string) *QueueStatus {
		if name == "" {
			name = policy.DefaultQueue
		}
		if q, ok := byName[name]; ok {
			return q
		}
		q := &QueueStatus{Queue: queuekv.Queue{Name: name}, Jobs: []JobUse{}, Waiting: []WaitingJob{}}
		byName[name] = q
		order = append(order, name)
		return q
	}
	for _, c := range l.Queues {
		q := get(c.Name)
		q.Queue, q.Configured = c, true
	}
	type jobKey struct{ queue, ns, job string }
	held := map[jobKey]*JobUse{}
	for _, n := range snap.Nodes {
		for _, g := range n.GPUs {
			st.Cluster.GPUs++
			if g.Healthy {
				st.Cluster.Healthy++
			}
			h := g.Holder
			switch {
			case h == nil && g.Healthy:
				st.Cluster.Free++
				continue
			case h == nil:
				continue
			}
			st.Cluster.InUse++
			if h.Kind == "" {
				st.Cluster.Outside++
				continue
			}
			q := get(h.Queue)
			q.UsedGPUs++
			k := jobKey{q.Name, h.Namespace, h.JobID}
			if held[k] == nil {
				held[k] = &JobUse{Namespace: h.Namespace, JobID: h.JobID, Kind: h.Kind}
			}
			held[k].GPUs++
		}
	}
	for k, j := range held {
		byName[k.queue].Jobs = append(byName[k.queue].Jobs, *j)
	}
	for _, w := range snap.Queue {
		q := get(w.Queue)
		q.Waiting = append(q.Waiting, WaitingJob{Namespace: w.Namespace, JobID: w.JobID, Kind: w.Kind, Queued: w.Queued, Since: w.Since})
	}
	// Declared queues in the configuration's order, then the others by
	// name.
	declared := len(l.Queues)
	rest := order[declared:]
	sort.Strings(rest)
	for _, name := range order {
		q := byName[name]
		sort.Slice(q.Jobs, func(i, k int) bool {
			if q.Jobs[i].Namespace != q.Jobs[k].Namespace {
				return q.Jobs[i].Namespace < q.Jobs[k].Namespace
			}
			return q.Jobs[i].JobID < q.Jobs[k].JobID
		})
	}
	for _, name := range order {
		if only == "" || name == only {
			st.Queues = append(st.Queues, *byName[name])
		}
	}
	if only != "" && len(st.Queues) == 0 {
		var names []string
		for _, q := range l.Queues {
			names = append(names, q.Name)
		}
		sort.Strings(names)
		return nil, &policy.UnknownQueueError{Queue: only, Queues: names}
	}
	return st, nil
}

// AddQueued puts the queued jobs of entries (Records.List) under their
// queues, next first; admitted jobs are counted by their GPUs already.
// A queue named only by queued jobs shows as not declared; only, when
// set, keeps that queue's.
func (st *Status) AddQueued(entries []*Entry, only string, now time.Time) {
	for _, e := range entries {
		in := e.Info()
		if in.State == "admitted" || (only != "" && in.Queue != only) {
			continue
		}
		i := -1
		for k := range st.Queues {
			if st.Queues[k].Name == in.Queue {
				i = k
			}
		}
		if i < 0 {
			st.Queues = append(st.Queues, QueueStatus{Queue: queuekv.Queue{Name: in.Queue}, Jobs: []JobUse{}, Waiting: []WaitingJob{}})
			i = len(st.Queues) - 1
		}
		st.Queues[i].Queued = append(st.Queues[i].Queued, QueuedJob{Namespace: e.Record.Namespace, JobID: e.Record.ID,
			Kind: e.Record.Kind, Members: e.Record.Members, Info: in, line: e.Line(now)})
	}
}

// Print writes the status for people: a table of the queues and, for a
// status of one queue, its jobs.
func (st *Status) Print(w io.Writer, detail bool) error {
	switch {
	case st.Applied == nil:
		fmt.Fprintln(w, "No queue file applied: every job is in the default queue.")
	default:
		fmt.Fprintf(w, "Queues %s.\n", st.Applied.Line())
	}
	c := st.Cluster
	fmt.Fprintf(w, "Cluster: %d GPUs (%d healthy), %d in use, %d free", c.GPUs, c.Healthy, c.InUse, c.Free)
	if c.Outside > 0 {
		fmt.Fprintf(w, "; %d held by jobs gpujob did not submit (in no queue)", c.Outside)
	}
	fmt.Fprintln(w)
	for _, warn := range st.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	fmt.Fprintln(w)
	t := gpujobs.NewTable(w, "QUEUE", "QUOTA", "USED", "JOBS", "WAITING", "WEIGHT", "BORROW", "PRIORITY", "COHORT")
	var over []string
	for _, q := range st.Queues {
		if !q.Configured {
			t.Row(q.Name+" (not declared)", "", fmt.Sprint(q.UsedGPUs), fmt.Sprint(len(q.Jobs)), fmt.Sprint(len(q.Waiting)), "", "", "", "")
			continue
		}
		t.Row(q.Name, quota(q.GPUs), fmt.Sprint(q.UsedGPUs), fmt.Sprint(len(q.Jobs)), fmt.Sprint(len(q.Waiting)),
			fmt.Sprint(q.Weight), onOff(q.Borrow), fmt.Sprint(q.Priority), q.Cohort)
		if q.GPUs > 0 && q.UsedGPUs > q.GPUs {
			over = append(over, fmt.Sprintf("queue %s uses %d GPUs, over its quota of %d: running jobs are not stopped for a quota", q.Name, q.UsedGPUs, q.GPUs))
		}
	}
	if err := t.Flush(); err != nil {
		return err
	}
	for _, o := range over {
		fmt.Fprintf(w, "note: %s\n", o)
	}
	for _, q := range st.Queues {
		if !q.Configured {
			fmt.Fprintf(w, "note: jobs name queue %s, which the configuration does not declare; submit refuses new jobs into it\n", q.Name)
		}
	}
	for _, q := range st.Queues {
		if len(q.Queued) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nQueued in %s (next first):\n", q.Name)
		t := gpujobs.NewTable(w, "POS", "JOB", "NAMESPACE", "KIND", "GPUS", "STATE", "SUBMITTED BY")
		for _, j := range q.Queued {
			pos := "-"
			if j.Position > 0 {
				pos = fmt.Sprint(j.Position)
			}
			t.Row(pos, j.JobID, j.Namespace, j.Kind, fmt.Sprint(j.GPUs), j.State, j.SubmittedBy)
		}
		if err := t.Flush(); err != nil {
			return err
		}
		for _, j := range q.Queued {
			fmt.Fprintf(w, "  %s: %s\n", j.JobID, j.line)
		}
	}
	if !detail {
		return nil
	}
	for _, q := range st.Queues {
		fmt.Fprintln(w)
		if len(q.Jobs) == 0 {
			fmt.Fprintf(w, "No job of queue %s holds GPUs.\n", q.Name)
		} else {
			fmt.Fprintf(w, "Jobs of queue %s holding GPUs:\n", q.Name)
			t := gpujobs.NewTable(w, "JOB", "NAMESPACE", "KIND", "GPUS")
			for _, j := range q.Jobs {
				t.Row(j.JobID, j.Namespace, j.Kind, fmt.Sprint(j.GPUs))
			}
			if err := t.Flush(); err != nil {
				return err
			}
		}
		if len(q.Waiting) > 0 {
			fmt.Fprintf(w, "\nJobs of queue %s Nomad has not placed yet (oldest first):\n", q.Name)
			t := gpujobs.NewTable(w, "JOB", "NAMESPACE", "KIND", "WAITING ALLOCS", "SUBMITTED")
			for _, j := range q.Waiting {
				t.Row(j.JobID, j.Namespace, j.Kind, fmt.Sprint(j.Queued), j.Since.UTC().Format(time.RFC3339))
			}
			if err := t.Flush(); err != nil {
				return err
			}
		}
	}
	return nil
}
