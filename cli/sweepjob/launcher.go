package sweepjob

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
)

// Launcher is the controller's Nomad: trial jobs from the template,
// registered create-only.
type Launcher struct {
	Nomad    nomadapi.API
	Template *api.Job
	Sweep    string
	// Run stamps every trial job (TrialJob): the sweep's submission.
	Run string
}

var _ controller.Launcher = (*Launcher)(nil)

// jobPrefix lists the sweep's trial jobs (and no other sweep's: a sweep
// named "a" does not see "a-b"'s trials, whose IDs go on "-b-trial-").
func (l *Launcher) jobPrefix() string { return l.Sweep + "-trial-" }

var _ controller.TrialJobs = (*Launcher)(nil)

// TrialJob is the trial's job, as Launch registers it (and, in queue mode,
// as the controller queues it).
func (l *Launcher) TrialJob(t controller.Trial) (*api.Job, error) {
	// The trial comes from the state in Consul: its job must be this
	// sweep's trial of its index, never a name the state made up.
	if err := t.Check(l.Sweep, t.Index); err != nil {
		return nil, err
	}
	return TrialJob(l.Template, t, l.Run)
}

// Launch registers the trial's job unless one of its ID exists.
func (l *Launcher) Launch(ctx context.Context, t controller.Trial) error {
	job, err := l.TrialJob(t)
	if err != nil {
		return fmt.Errorf("%w: %v", controller.ErrRefused, err)
	}
	_, err = l.Nomad.RegisterNew(job)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nomadapi.ErrJobExists):
		return l.same(t.JobID)
	case refused(err):
		return fmt.Errorf("%w: %v", controller.ErrRefused, err)
	}
	return err
}

// same accepts an existing job of the trial's ID only if it is this
// sweep's (its run stamp): a job left by an earlier sweep of the same name
// must not pass for this trial.
func (l *Launcher) same(jobID string) error {
	job, err := l.Nomad.Job(jobID)
	if err != nil {
		return err
	}
	if run := job.Meta[contract.MetaRun]; run != l.Run {
		return fmt.Errorf("%w: a job %s from another submission of sweep %s exists (run %q, this one is %q): purge it (nomad job stop -purge %s)",
			controller.ErrRefused, jobID, l.Sweep, run, l.Run, jobID)
	}
	return nil
}

// refused tells Nomad's answers that retrying cannot change: the job is
// invalid (400) or not allowed (403).
func refused(err error) bool {
	s := err.Error()
	return strings.Contains(s, "response code: 400") || strings.Contains(s, "response code: 403") ||
		strings.Contains(s, "Permission denied")
}

// Observe lists the sweep's trial jobs once and reads the allocations of
// those that failed, for the reason.
func (l *Launcher) Observe(ctx context.Context, jobIDs []string) (map[string]controller.JobObservation, error) {
	stubs, _, err := l.Nomad.Jobs((&api.QueryOptions{Prefix: l.jobPrefix()}).WithContext(ctx))
	if err != nil {
		return nil, err
	}
	byID := map[string]*api.JobListStub{}
	for _, s := range stubs {
		byID[s.ID] = s
	}
	out := make(map[string]controller.JobObservation, len(jobIDs))
	for _, id := range jobIDs {
		s := byID[id]
		if s == nil {
			out[id] = controller.JobObservation{Phase: controller.JobMissing}
			continue
		}
		o := phase(s)
		if o.Phase == controller.JobFailed {
			if o, err = l.settle(id, o); err != nil {
				return nil, err // retried by the round: one error must not fail a trial
			}
		}
		out[id] = o
	}
	return out, nil
}

// phase reads a job's phase from its list entry and summary.
func phase(s *api.JobListStub) controller.JobObservation {
	var running, failed, queued int
	if s.JobSummary != nil {
		for _, g := range s.JobSummary.Summary {
			running += g.Running + g.Starting
			failed += g.Failed + g.Lost
			queued += g.Queued
		}
	}
	switch {
	case s.Stop:
		return controller.JobObservation{Phase: controller.JobStopped}
	case s.Status == "dead" && failed > 0:
		return controller.JobObservation{Phase: controller.JobFailed}
	case s.Status == "dead":
		return controller.JobObservation{Phase: controller.JobComplete}
	case running > 0:
		return controller.JobObservation{Phase: controller.JobRunning}
	}
	return controller.JobObservation{Phase: controller.JobQueued, Reason: "Nomad has not placed it yet"}
}

// settle looks at the allocations of a job the summary calls failed: a
// lost allocation counts as failed there even when its replacement then
// completed (a trial whose node was lost resumes elsewhere). The job failed
// only if the latest allocation of some member did.
func (l *Launcher) settle(jobID string, o controller.JobObservation) (controller.JobObservation, error) {
	stubs, _, err := l.Nomad.JobAllocations(jobID, nil)
	if err != nil {
		return o, err
	}
	latest := map[string]*api.AllocationListStub{}
	for _, a := range stubs {
		if cur := latest[a.Name]; cur == nil || a.CreateIndex > cur.CreateIndex {
			latest[a.Name] = a
		}
	}
	for _, a := range latest {
		if a.ClientStatus != "complete" {
			o.Reason = l.failure(stubs)
			return o, nil
		}
	}
	return controller.JobObservation{Phase: controller.JobComplete}, nil
}

// failure is the plain-words reason a failed trial job gives: the
// supervisor's failed event of its member task, else the last event.
func (l *Launcher) failure(stubs []*api.AllocationListStub) string {
	sort.Slice(stubs, func(i, j int) bool { return stubs[i].ModifyIndex > stubs[j].ModifyIndex })
	for _, a := range stubs {
		if a.ClientStatus != "failed" && a.ClientStatus != "lost" {
			continue
		}
		for _, ts := range a.TaskStates {
			for i := len(ts.Events) - 1; i >= 0; i-- {
				e := ts.Events[i]
				if d, ok := gpujobs.DriverEvent(e); ok && d.Kind == "failed" {
					return d.Message
				}
			}
		}
		for _, ts := range a.TaskStates {
			if n := len(ts.Events); n > 0 {
				return gpujobs.EventText(ts.Events[n-1])
			}
		}
		if a.ClientDescription != "" {
			return a.ClientDescription
		}
	}
	return "its job failed"
}

// StopJob stops a trial's job, keeping it for its record. It stops
// nothing but this sweep's trial jobs, whatever the state names.
func (l *Launcher) StopJob(ctx context.Context, jobID string) error {
	if !IsTrialJob(l.Sweep, jobID) {
		return fmt.Errorf("%w: job %q is not a trial job of sweep %s", controller.ErrRefused, jobID, l.Sweep)
	}
	_, err := l.Nomad.Deregister(jobID, false)
	if err != nil && gpujobs.IsNotFound(err) {
		return nil
	}
	return err
}

// WaitJobs blocks until the sweep's trial jobs change after index.
func (l *Launcher) WaitJobs(ctx context.Context, index uint64) (uint64, error) {
	_, meta, err := l.Nomad.Jobs((&api.QueryOptions{Prefix: l.jobPrefix(), WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx))
	if err != nil {
		return index, err
	}
	return meta.LastIndex, nil
}

// IsTrialJob says whether jobID is one of sweep's trial jobs (TrialJobID):
// "<sweep>-trial-" and three or more digits.
func IsTrialJob(sweep, jobID string) bool {
	n, ok := strings.CutPrefix(jobID, sweep+"-trial-")
	if !ok || len(n) < 3 {
		return false
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
