package sweepops

import (
	"context"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// Status is the document `gpujob sweep status -json` prints. Fields are
// stable; new ones may be added.
type Status struct {
	Sweep     string   `json:"sweep"`
	Namespace string   `json:"namespace"`
	Status    string   `json:"status"` // running, completed, failed, stopped
	Reason    string   `json:"reason,omitempty"`
	Metric    string   `json:"metric"`
	Mode      string   `json:"mode"` // max or min
	Goal      *float64 `json:"goal,omitempty"`
	MaxTrials int      `json:"max_trials"`
	Parallel  int      `json:"parallel"`
	// Counts is the trials by state (pending, running, stopping,
	// completed, stopped, failed).
	Counts map[string]int `json:"counts"`
	Best   *Trial         `json:"best"`
	// Controller is its job's Nomad status (running, dead, missing) and
	// how many controllers have held the sweep.
	Controller Controller `json:"controller"`
	Trials     []Trial    `json:"trials"`
}

// Controller is the sweep's controller job.
type Controller struct {
	Job    string `json:"job"`
	Status string `json:"status"`
	Starts int    `json:"starts"`
}

// Trial is one trial.
type Trial struct {
	ID        string            `json:"id"`
	Job       string            `json:"job"`
	State     string            `json:"state"`
	Params    search.Assignment `json:"params"`
	Step      int               `json:"step"`
	Value     *float64          `json:"value"`
	StoppedBy string            `json:"stopped_by,omitempty"`
	Reason    string            `json:"reason,omitempty"`
	// Waiting says in plain words why a trial's job is not running yet.
	Waiting string `json:"waiting,omitempty"`
	// Held is what the trial's metric reporting budgets held back (its
	// rank 0 printed metric or result lines faster, or larger, than they
	// allow): counts of results deferred to the next write, writes delayed
	// by the byte budget, and lines over 64 KiB skipped. Absent when none.
	Held *sweepkv.Reporting `json:"held,omitempty"`
}

// ReadStatus gathers sweep name's status: its record and state from
// Consul, and from Nomad whether its controller runs and why its queued
// trials wait.
func (s *Sweeps) ReadStatus(ctx context.Context, name string) (*Status, error) {
	rec, st, _, err := s.Load(ctx, name)
	if err != nil {
		return nil, err
	}
	out := NewStatus(rec, st)
	out.Controller.Job = controller.ControllerJobID(name)
	out.Controller.Status = "missing"
	if j, err := s.Nomad.Job(out.Controller.Job); err == nil && j.Status != nil {
		out.Controller.Status = *j.Status
	} else if err != nil && !gpujobs.IsNotFound(err) {
		return nil, err
	}
	if err := s.explainWaiting(rec, out); err != nil {
		return nil, err
	}
	return out, nil
}

// NewStatus is the status a sweep's record and state say, without what
// Nomad adds (the controller's job and why trials wait).
func NewStatus(rec *sweepjob.Record, st *controller.State) *Status {
	s := &Status{Sweep: rec.Sweep, Namespace: rec.Namespace, Status: string(st.Status), Reason: st.Reason, Metric: rec.Metric,
		Mode: string(rec.Mode), Goal: rec.Goal, MaxTrials: st.MaxTrials, Parallel: rec.Parallel, Counts: map[string]int{},
		Controller: Controller{Starts: st.Starts}, Trials: []Trial{}}
	if s.Mode == "" {
		s.Mode = "max"
	}
	for _, t := range st.Trials {
		s.Counts[string(t.State)]++
		s.Trials = append(s.Trials, Trial{ID: t.ID, Job: t.JobID, State: string(t.State), Params: t.Params, Step: t.Step,
			Value: t.Value, StoppedBy: t.StoppedBy, Reason: t.Reason, Waiting: t.Waiting, Held: t.Held})
	}
	if b := st.Best(rec.Maximize()); b != nil {
		for i := range s.Trials {
			if s.Trials[i].ID == b.ID {
				s.Best = &s.Trials[i]
			}
		}
	}
	return s
}

// explainWaiting says why the running trials whose jobs have nothing
// running wait: Nomad's plan of the job, in the words `gpujob submit` uses.
func (s *Sweeps) explainWaiting(rec *sweepjob.Record, out *Status) error {
	stubs, _, err := s.Nomad.Jobs(&api.QueryOptions{Prefix: rec.Sweep + "-trial-"})
	if err != nil {
		return err
	}
	queued := map[string]bool{}
	for _, j := range stubs {
		if j.Stop || j.Status == "dead" || j.JobSummary == nil {
			continue
		}
		for _, g := range j.JobSummary.Summary {
			if g.Queued > 0 {
				queued[j.ID] = true
			}
		}
	}
	if len(queued) == 0 {
		return nil
	}
	nodes, err := observe.ClusterGPUs(s.Nomad)
	if err != nil {
		return err
	}
	ask := explain.Ask{Workers: rec.Workers, GPUsPerWorker: rec.GPUsPerWorker}
	if t := rec.Template; t != nil && t.NodePool != nil {
		ask.NodePool = *t.NodePool
	}
	for i := range out.Trials {
		t := &out.Trials[i]
		if !queued[t.Job] {
			continue
		}
		job, err := s.Nomad.Job(t.Job)
		if err != nil {
			continue
		}
		plan, err := s.Nomad.Plan(job)
		if err != nil {
			continue
		}
		if why := explain.Placement(ask, plan.FailedTGAllocs[render.Group], nodes); why != "" {
			t.Waiting = why
		} else {
			t.Waiting = "Nomad has not placed it yet"
		}
	}
	return nil
}
