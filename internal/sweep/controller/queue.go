package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// Queue mode: when a queue configuration exists (gpujob queue apply), a
// trial's job is not registered by the controller but queued, as an
// admit.JobRecord of kind trial, for the admission controller to register
// once its whole gang fits. The sweep's own logic is unchanged: the
// queueLauncher below only translates. A trial whose record waits reads as
// a queued job (so it counts against parallel, as a launched trial), a
// refused one as a failed job with the queue's reason, and stopping a
// trial withdraws its record before stopping its job. Without a queue
// configuration the controller registers its trials as it always did; it
// reads the queue only for a trial whose job Nomad does not have (one
// queued before the configuration was removed).

// TrialJobs is what a Launcher offers for queue mode: the trial's Nomad
// job, exactly as Launch would register it.
type TrialJobs interface {
	TrialJob(t Trial) (*nomad.Job, error)
}

// nomadDefaultPriority is a job's priority when its spec sets none (the
// spec's default): such a trial gets its queue's priority (0).
const nomadDefaultPriority = 50

func (c *Controller) queuePrefix() string {
	if c.QueuePrefix == "" {
		return contract.QueuePrefix
	}
	return strings.TrimSuffix(c.QueuePrefix, "/")
}

// queueJobsPrefix is where the sweep's trials' records live: every key
// under it is "<sweep>-trial-<digits>" (others, of a sweep whose name
// extends this one's, are ignored).
func (c *Controller) queueJobsPrefix() string {
	return c.queuePrefix() + "/jobs/" + c.Plan.Namespace + "/" + c.Plan.Sweep + "-trial-"
}

func (c *Controller) queueStatusPrefix() string {
	return c.queuePrefix() + "/state/status/" + c.Plan.Namespace + "/" + c.Plan.Sweep + "-trial-"
}

// queueMode says whether a queue configuration exists. One that is not
// valid still means queue mode (the admission controller acts on nothing
// until it is fixed; the trials wait). A token that may not read it (a
// controller whose credentials were issued before queues existed) runs
// the sweep as without queues, and says so once.
func (r *runner) queueMode(ctx context.Context) (bool, error) {
	c := r.c
	var rec *queuekv.Record
	var invalid *queuekv.InvalidError
	refused := false
	err := retry(ctx, c.logf, func() error {
		var err error
		rec, _, err = queuekv.New(c.Consul, c.queuePrefix()).Read(ctx)
		invalid, refused = nil, forbidden(err)
		if errors.As(err, &invalid) || refused {
			return nil
		}
		return err
	})
	switch {
	case err != nil:
		return false, err
	case invalid != nil:
		if !r.queueWarned {
			r.queueWarned = true
			c.logf("sweep %s: the queue configuration is not valid (%v); trials are queued and wait until it is fixed", c.Plan.Sweep, invalid)
		}
		return true, nil
	case refused && !r.queueWarned:
		r.queueWarned = true
		c.logf("sweep %s: this controller's Consul token may not read the queue configuration %s: trials are registered directly, "+
			"outside any queue (submit the sweep again with this gpujob to give its controller the queue rights)",
			c.Plan.Sweep, queuekv.ConfigKey(c.queuePrefix()))
	}
	return rec != nil, nil
}

// forbidden is Consul refusing the token.
func forbidden(err error) bool {
	var se api.StatusError
	return err != nil && (errors.As(err, &se) && se.Code == http.StatusForbidden || strings.Contains(err.Error(), "Permission denied"))
}

// queueEntry is one trial's record and status in the queue.
type queueEntry struct {
	record *api.KVPair
	// queue, submittedAt, run: what the record says (loosely read: the
	// admission controller judges it; this only tells whose it is).
	queue       string
	submittedAt time.Time
	run         string
	status      *admit.Status // nil: none yet, unreadable, or of an earlier record
}

// looseRecord is what queueEntries reads of a record.
type looseRecord struct {
	Queue       string    `json:"queue"`
	SubmittedAt time.Time `json:"submitted_at"`
	Job         struct {
		Meta map[string]string `json:"Meta"`
	} `json:"job"`
}

// queueEntries reads the sweep's trials' records and statuses, by job
// ID, retrying Consul's errors.
func (c *Controller) queueEntries(ctx context.Context) (map[string]*queueEntry, error) {
	var out map[string]*queueEntry
	err := retry(ctx, c.logf, func() error {
		var err error
		out, err = c.readQueue(ctx)
		return err
	})
	return out, err
}

// readQueue reads the sweep's trials' records and statuses once.
func (c *Controller) readQueue(ctx context.Context) (map[string]*queueEntry, error) {
	q := (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx)
	recs, _, err := c.Consul.KV().List(c.queueJobsPrefix(), q)
	if forbidden(err) {
		// A token issued before queues existed: it queued nothing.
		return map[string]*queueEntry{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the sweep's queued trials (%s): %w", c.queueJobsPrefix(), err)
	}
	stats, _, err := c.Consul.KV().List(c.queueStatusPrefix(), q)
	if forbidden(err) {
		stats, err = nil, nil // no status is believed: the records read as waiting
	}
	if err != nil {
		return nil, fmt.Errorf("reading the sweep's queued trials' statuses (%s): %w", c.queueStatusPrefix(), err)
	}
	out := map[string]*queueEntry{}
	jobsRoot := c.queuePrefix() + "/jobs/" + c.Plan.Namespace + "/"
	for _, p := range recs {
		id := strings.TrimPrefix(p.Key, jobsRoot)
		if !isTrialJobID(c.Plan.Sweep, id) {
			continue
		}
		e := &queueEntry{record: p}
		var lr looseRecord
		if json.Unmarshal(p.Value, &lr) == nil {
			e.queue, e.submittedAt, e.run = lr.Queue, lr.SubmittedAt, lr.Job.Meta[contract.MetaRun]
		}
		// The namespace's users may write records: what of one goes into
		// the sweep's state (and onto terminals) must be a queue's name.
		if e.queue == "" {
			e.queue = policy.DefaultQueue
		} else if queuefile.CheckName(e.queue) != nil {
			e.queue = "its queue"
		}
		out[id] = e
	}
	statusRoot := c.queuePrefix() + "/state/status/" + c.Plan.Namespace + "/"
	for _, p := range stats {
		e := out[strings.TrimPrefix(p.Key, statusRoot)]
		if e == nil {
			continue
		}
		// A status is believed only as admit.DecodeStatus checks it, and
		// only for this record (not one deleted and written again).
		if s, err := admit.DecodeStatus(p.Value); err == nil && s.RecordIndex == e.record.CreateIndex {
			e.status = s
		}
	}
	return out, nil
}

// isTrialJobID says whether id is one of sweep's trial jobs (TrialJobID).
func isTrialJobID(sweep, id string) bool {
	n, ok := strings.CutPrefix(id, sweep+"-trial-")
	if !ok || len(n) < 3 {
		return false
	}
	for _, ch := range n {
		if ch < '0' || ch > '9' {
			return false
		}
	}
	return true
}

// queueLauncher is the Launcher of a round in queue mode: Launch queues,
// Observe folds the queue's word into Nomad's, StopJob withdraws the
// record, then stops the job.
type queueLauncher struct {
	c     *Controller
	inner Launcher
	// queue: a queue configuration exists, and Launch queues. Without
	// one, Launch registers (inner) and the queue is read only for trials
	// whose job Nomad does not have: a trial queued before the
	// configuration was removed is still the queue's.
	queue bool
	// trials are the state's, by job ID: a record is a trial's only if
	// it was submitted when the trial was created (owns).
	trials map[string]Trial
	// entries is what the round's Observe read; Launch and StopJob read
	// the record again.
	entries map[string]*queueEntry
}

// owns says whether e is the record of trial t (not of another
// submission of a sweep of the same name): submitted when t was created.
func owns(e *queueEntry, t Trial) bool {
	return e != nil && !t.Created.IsZero() && e.submittedAt.Equal(t.Created)
}

// Launch writes the trial's record, create-only. A record already there
// is this launch's earlier try when it carries the same submission (run
// stamp) and creation time; anything else there is refused.
func (q *queueLauncher) Launch(ctx context.Context, t Trial) error {
	if !q.queue {
		return q.inner.Launch(ctx, t)
	}
	c := q.c
	if err := t.Check(c.Plan.Sweep, t.Index); err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	tj, ok := q.inner.(TrialJobs)
	if !ok {
		return fmt.Errorf("%w: a queue configuration exists, and this controller cannot queue trials (its launcher renders no job)", ErrRefused)
	}
	job, err := tj.TrialJob(t)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	rec, run, err := c.trialRecord(t, job)
	if err != nil {
		return fmt.Errorf("%w: queueing it: %v", ErrRefused, err)
	}
	b, err := admit.EncodeJobRecord(rec, c.now())
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	key := c.queuePrefix() + "/jobs/" + rec.Namespace + "/" + rec.ID
	ok, _, err = c.Consul.KV().CAS(&api.KVPair{Key: key, Value: b}, (&api.WriteOptions{}).WithContext(ctx))
	if forbidden(err) {
		return fmt.Errorf("%w: writing its queue record %s: %v (the controller's Consul token lacks write there: submit the sweep again with this gpujob)", ErrRefused, key, err)
	}
	if err != nil {
		return fmt.Errorf("writing its queue record %s: %w", key, err)
	}
	if ok {
		c.logf("sweep %s: %s: queued job %s in queue %s", c.Plan.Sweep, t.ID, t.JobID, rec.Queue)
		return nil
	}
	entries, err := c.queueEntries(ctx)
	if err != nil {
		return err
	}
	e := entries[t.JobID]
	switch {
	case e == nil:
		return fmt.Errorf("its queue record %s appeared and went while queueing it", key) // retried
	case e.run != run || !e.submittedAt.Equal(rec.SubmittedAt):
		return fmt.Errorf("%w: a queued job %s of another submission is in the queue (%s, run %q submitted %s): withdraw it (gpujob stop %s)",
			ErrRefused, t.JobID, key, e.run, e.submittedAt.Format(time.RFC3339), t.JobID)
	}
	return nil
}

// trialRecord is the trial's queue record: its job's gang as the
// admission controller counts it, its queue and priority from its job
// (the spec's train block rendered them), submitted when the trial was
// proposed, so the sweep's trials keep their order in the queue.
func (c *Controller) trialRecord(t Trial, job *nomad.Job) (rec *admit.JobRecord, run string, err error) {
	ns := c.Plan.Namespace
	if ns == "" {
		ns = "default"
	}
	if job.Namespace != nil && *job.Namespace != "" && *job.Namespace != ns {
		return nil, "", fmt.Errorf("its job is in namespace %q, the sweep in %q", *job.Namespace, ns)
	}
	job.Namespace = &ns
	members, per, err := admit.Gang(job, false)
	if err != nil {
		return nil, "", err
	}
	queue := job.Meta[contract.MetaQueue]
	if queue == "" {
		queue = policy.DefaultQueue
	}
	prio := 0
	if job.Priority != nil && *job.Priority != nomadDefaultPriority {
		prio = *job.Priority
	}
	b, err := json.Marshal(job)
	if err != nil {
		return nil, "", fmt.Errorf("encoding job %s: %w", t.JobID, err)
	}
	by := c.Plan.SubmittedBy
	if by == "" {
		by = "sweep " + ns + "/" + c.Plan.Sweep
	}
	return &admit.JobRecord{
		Format: admit.Format, ID: t.JobID, Namespace: ns, Queue: queue, Kind: admit.KindTrial,
		Priority: prio, Members: members, PerMember: per, SubmittedAt: t.Created.UTC(), SubmittedBy: by, Job: b,
	}, job.Meta[contract.MetaRun], nil
}

// Observe is Nomad's word, corrected by the queue's for the trials that
// have a record: waiting in the queue is a queued job, refused a failed
// one, preempted (its job stopped by the queue) a queued one again. Once
// admitted, Nomad's word stands.
func (q *queueLauncher) Observe(ctx context.Context, jobIDs []string) (map[string]JobObservation, error) {
	out, err := q.inner.Observe(ctx, jobIDs)
	if err != nil {
		return nil, err
	}
	if !q.queue {
		missing := false
		for _, id := range jobIDs {
			missing = missing || out[id].Phase == JobMissing
		}
		if !missing {
			return out, nil // as without queues: no read of the queue
		}
	}
	entries, err := q.c.queueEntries(ctx)
	if err != nil {
		return nil, err
	}
	q.entries = entries
	for _, id := range jobIDs {
		e := entries[id]
		if !owns(e, q.trials[id]) {
			continue // none, or another's: Launch says so
		}
		o := out[id]
		s := e.status
		queue := e.queue
		switch {
		case s == nil:
			o = JobObservation{Phase: JobQueued, Reason: fmt.Sprintf("queued in %s; the admission controller has not placed it in the queue yet", queue)}
		case s.State == admit.StateRefused:
			o = JobObservation{Phase: JobFailed, Reason: "the queue refused it: " + orDefault(s.Reason, "no reason given")}
		case s.State == admit.StateAdmitted && o.Phase == JobMissing:
			o = JobObservation{Phase: JobQueued, Reason: fmt.Sprintf("admitted by queue %s; Nomad has not registered it yet", queue)}
		case s.State == admit.StateAdmitted:
			// Nomad's word.
		case s.State == admit.StatePreempted:
			o = JobObservation{Phase: JobQueued, Reason: fmt.Sprintf("preempted by %s (%s); it queues again at its place in %s once its members have stopped",
				orDefault(s.PreemptedBy, "another job"), orDefault(s.PreemptedWhy, "no reason given"), queue)}
		case o.Phase == JobRunning:
			// Queued again, but a member still runs: Nomad's word.
		default:
			why := fmt.Sprintf("waits in queue %s", queue)
			if s.Position > 0 {
				why += fmt.Sprintf(" (position %d)", s.Position)
			}
			if s.Reason != "" {
				why += ": " + s.Reason
			}
			o = JobObservation{Phase: JobQueued, Reason: why}
		}
		out[id] = o
	}
	return out, nil
}

// StopJob withdraws the trial's record (check-and-set on what was read:
// the queue admits nothing more of it), then stops its job, which the
// queue may have admitted; a job that was never registered is success.
func (q *queueLauncher) StopJob(ctx context.Context, jobID string) error {
	if !isTrialJobID(q.c.Plan.Sweep, jobID) {
		return fmt.Errorf("%w: job %q is not a trial job of sweep %s", ErrRefused, jobID, q.c.Plan.Sweep)
	}
	if q.queue || q.entries[jobID] != nil {
		if err := q.c.withdraw(ctx, jobID, q.trials[jobID]); err != nil {
			return err
		}
	}
	return q.inner.StopJob(ctx, jobID)
}

func (q *queueLauncher) WaitJobs(ctx context.Context, index uint64) (uint64, error) {
	return q.inner.WaitJobs(ctx, index)
}

// withdraw deletes a trial's queue record, if any and if it is t's (any,
// with t zero), with check-and-set.
func (c *Controller) withdraw(ctx context.Context, jobID string, t Trial) error {
	key := c.queuePrefix() + "/jobs/" + c.Plan.Namespace + "/" + jobID
	for try := 0; try < 5; try++ {
		p, _, err := c.Consul.KV().Get(key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("reading the queue record %s: %w", key, err)
		}
		if p == nil {
			return nil
		}
		if t.ID != "" {
			var lr looseRecord
			if json.Unmarshal(p.Value, &lr) != nil || !lr.SubmittedAt.Equal(t.Created) {
				return nil // another submission's: not this trial's to withdraw
			}
		}
		ok, _, err := c.Consul.KV().DeleteCAS(p, (&api.WriteOptions{}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("withdrawing the queue record %s: %w", key, err)
		}
		if ok {
			c.logf("sweep %s: withdrew %s from the queue", c.Plan.Sweep, jobID)
			return nil
		}
	}
	return fmt.Errorf("withdrawing the queue record %s: it kept changing", key)
}

// forgetEnded withdraws the records of trials that have ended (refused,
// completed, stopped, failed): the queue must not keep, or admit, what
// the sweep is done with. The admission controller forgets an admitted
// job's record itself once its job has ended; this covers the rest.
func (r *runner) forgetEnded(ctx context.Context, st *State, entries map[string]*queueEntry) {
	for _, t := range st.Trials {
		if !t.State.Terminal() || !owns(entries[t.JobID], t) {
			continue
		}
		if err := r.c.withdraw(ctx, t.JobID, t); err != nil && ctx.Err() == nil {
			r.c.logf("sweep %s: %s: %v (retried next round)", r.c.Plan.Sweep, t.ID, err)
		}
	}
}

// DeleteTrialRecords withdraws every queue record of sweep's trials in
// namespace ns (queuePrefix "" is contract.QueuePrefix): gpujob sweep stop
// does it for a sweep without a running controller, and purge. It returns
// how many it deleted.
func DeleteTrialRecords(ctx context.Context, c *api.Client, queuePrefix, ns, sweep string) (int, error) {
	ctl := &Controller{Consul: c, QueuePrefix: queuePrefix, Plan: &Plan{Namespace: ns, Sweep: sweep}}
	entries, err := ctl.readQueue(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for id := range entries {
		if err := ctl.withdraw(ctx, id, Trial{}); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
