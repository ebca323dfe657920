// Package controller runs one sweep: it proposes trials, has them launched
// as Nomad jobs (through a Launcher), reads their metrics from Consul KV,
// stops the bad ones early and ends the sweep. Its whole memory is a State
// record in Consul KV, written with check-and-set, so a controller that is
// killed at any moment is replaced by one that resumes where it stopped.
//
// The decisions are a pure function (Reconcile) of the state and what was
// observed; the Controller only gathers observations, saves the state and
// carries out the actions Reconcile asks for.
package controller

import (
	"fmt"
	"time"

	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// Status is the sweep's lifecycle.
type Status string

const (
	StatusRunning   Status = "running"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusStopped   Status = "stopped"
)

// Terminal says the sweep will propose no more trials.
func (s Status) Terminal() bool { return s != StatusRunning && s != "" }

// TrialState is one trial's lifecycle.
type TrialState string

const (
	// TrialPending: recorded (its parameters are final) but its job is not
	// yet seen registered. The record comes first, so a controller killed
	// between the two launches the same trial, never a second one.
	TrialPending TrialState = "pending"
	// TrialRunning: its job is registered (Nomad may still be queueing it).
	TrialRunning TrialState = "running"
	// TrialStopping: asked to stop (early stopping, or the sweep ended);
	// its job is not dead yet.
	TrialStopping  TrialState = "stopping"
	TrialCompleted TrialState = "completed"
	TrialStopped   TrialState = "stopped"
	TrialFailed    TrialState = "failed"
)

// Terminal says the trial has ended for good.
func (s TrialState) Terminal() bool {
	return s == TrialCompleted || s == TrialStopped || s == TrialFailed
}

// Active says the trial holds (or is about to hold) its job's resources.
func (s TrialState) Active() bool { return !s.Terminal() }

// Who ends a trial early (Trial.StoppedBy).
const (
	StoppedByASHA   = "asha"
	StoppedByMedian = "median"
	StoppedByGoal   = "goal"   // another trial reached the objective's goal
	StoppedByUser   = "user"   // gpujob sweep stop, or its job stopped by hand
	StoppedBySweep  = "failed" // the sweep failed (too many failed trials)
)

// State is the sweep's record in KV (sweepkv.StateKey).
type State struct {
	Namespace string `json:"namespace"`
	Sweep     string `json:"sweep"`
	Status    Status `json:"status"`
	// Reason says in plain words why the sweep ended.
	Reason string `json:"reason,omitempty"`
	// MaxTrials is the spec's max_trials, raised by gpujob sweep extend.
	MaxTrials int `json:"max_trials"`
	// StopRequested is set by gpujob sweep stop.
	StopRequested bool `json:"stop_requested,omitempty"`
	// Seq counts the saved reconcile rounds: a trial's EndSeq says in
	// which round it ended, so the stopping rules (the median rule) know
	// which trials had ended before a point arrived, independent of clocks.
	Seq int64 `json:"seq"`
	// Trials in the order they were proposed.
	Trials []Trial `json:"trials"`
	// Controller is the Nomad allocation of the controller that last held
	// the lock; Starts counts controllers that took the lock.
	Controller string    `json:"controller,omitempty"`
	Starts     int       `json:"starts"`
	Created    time.Time `json:"created"`
	Updated    time.Time `json:"updated"`
	Ended      time.Time `json:"ended,omitzero"`
}

// Trial is one trial's record.
type Trial struct {
	ID     string            `json:"id"` // "trial-007"
	Index  int               `json:"index"`
	JobID  string            `json:"job_id"`
	Params search.Assignment `json:"params"`
	State  TrialState        `json:"state"`
	// Reason: why it was stopped or failed, in plain words.
	Reason    string `json:"reason,omitempty"`
	StoppedBy string `json:"stopped_by,omitempty"`
	// Waiting says in plain words why a trial that has not ended makes no
	// progress: Nomad's reason while its job waits to be placed, or that
	// its supervisor stopped reporting (its node may be lost). Empty
	// otherwise.
	Waiting string `json:"waiting,omitempty"`
	// Step and Value are the last reported step and objective value
	// (the final result's once completed); Value is nil until reported.
	// After a rewind (a restart from a checkpoint) Step goes back too.
	Step  int      `json:"step"`
	Value *float64 `json:"value,omitempty"`
	// Seen is one past the largest step the controller has seen the trial
	// report, across rewinds (0 before its first report). The stopping
	// rule judges each point once, in the round that first sees a step
	// past Seen, against what the other trials had reported in earlier
	// rounds; a point re-reported after a rewind is not judged again, as
	// Ray's ASHA records a trial once per rung and Optuna keeps the first
	// report of a step.
	Seen int `json:"seen,omitempty"`
	// Rewinds is the metrics record's rewind count last seen.
	Rewinds int `json:"rewinds,omitempty"`
	// Held is what the trial's reporting budgets held back, as its
	// metrics record last said (only those counts: the record's points and
	// writes change with every write, and the state is rewritten only when
	// something changed); nil while nothing was.
	Held *sweepkv.Reporting `json:"held,omitempty"`
	// EndSeq is the round the trial ended in.
	EndSeq int64 `json:"end_seq,omitempty"`
	// StopAt is when the trial was asked to stop (TrialStopping): its job
	// is stopped StopGrace later unless it has ended by then.
	StopAt  time.Time `json:"stop_at,omitzero"`
	Created time.Time `json:"created"`
	Started time.Time `json:"started,omitzero"` // first seen running in Nomad
	Ended   time.Time `json:"ended,omitzero"`
}

// Counts is how many trials are in each state.
func (s *State) Counts() map[TrialState]int {
	c := map[TrialState]int{}
	for _, t := range s.Trials {
		c[t.State]++
	}
	return c
}

// Best returns the best completed trial, else the best trial with any
// value, or nil. Ties go to the earlier trial.
func (s *State) Best(maximize bool) *Trial {
	var best *Trial
	better := func(a, b *Trial) bool {
		if b == nil {
			return true
		}
		if maximize {
			return *a.Value > *b.Value
		}
		return *a.Value < *b.Value
	}
	for _, onlyCompleted := range []bool{true, false} {
		for i := range s.Trials {
			t := &s.Trials[i]
			if t.Value == nil || (onlyCompleted && t.State != TrialCompleted) {
				continue
			}
			if better(t, best) {
				best = t
			}
		}
		if best != nil {
			return best
		}
	}
	return nil
}

// Trial returns the trial with the given ID, or nil.
func (s *State) Trial(id string) *Trial {
	for i := range s.Trials {
		if s.Trials[i].ID == id {
			return &s.Trials[i]
		}
	}
	return nil
}

// Check reports a state that this sweep's controller (or gpujob sweep stop)
// must not act on: one of another sweep, more trials than any sweep may
// have, or a trial whose ID or job is not what its index makes it, or whose
// parameters are not a point of p.Space. Every writer gpujob runs keeps
// these; a state that breaks one was written by something else, and acting
// on it would stop or register jobs the sweep does not own.
func (s *State) Check(p *Plan) error {
	switch {
	case s.Namespace != "" && s.Namespace != p.Namespace || s.Sweep != "" && s.Sweep != p.Sweep:
		return fmt.Errorf("it is the state of sweep %q in namespace %q, not of %q in %q", s.Sweep, s.Namespace, p.Sweep, p.Namespace)
	case s.MaxTrials > MaxTrialsLimit || len(s.Trials) > MaxTrialsLimit:
		return fmt.Errorf("it asks for %d trials and holds %d: a sweep has at most %d", s.MaxTrials, len(s.Trials), MaxTrialsLimit)
	}
	for i, t := range s.Trials {
		if err := t.Check(p.Sweep, i); err != nil {
			return err
		}
		if p.Space != nil {
			if err := p.Space.Contains(t.Params); err != nil {
				return fmt.Errorf("trial %s: its parameters %s are not a point of the sweep's search space: %w", t.ID, t.Params, err)
			}
		}
	}
	return nil
}

// Check reports a trial that is not the index-th of sweep: its ID and job
// ID follow from the index alone (TrialID, TrialJobID).
func (t Trial) Check(sweep string, index int) error {
	if t.Index != index || t.ID != TrialID(index) || t.JobID != TrialJobID(sweep, index) {
		return fmt.Errorf("trial %d of the state is %q (index %d) with job %q; the %s trial of sweep %s is %s with job %s",
			index+1, t.ID, t.Index, t.JobID, ordinal(index+1), sweep, TrialID(index), TrialJobID(sweep, index))
	}
	return nil
}

func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return fmt.Sprintf("%d%s", n, suffix)
}
