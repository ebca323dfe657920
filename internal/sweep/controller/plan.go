package controller

import (
	"fmt"

	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/stopping"
)

// Rule is an early-stopping rule: stopping.ASHA or stopping.Median.
type Rule interface {
	Decide(trialID string, h stopping.History) stopping.Decision
}

// Plan is what a sweep's spec decides: the controller's fixed inputs.
type Plan struct {
	Namespace string
	Sweep     string
	// Metric is the objective; Mode its direction; Goal, when set, ends
	// the sweep once a completed trial reaches it.
	Metric string
	Mode   stopping.Mode
	Goal   *float64
	// Sampler proposes each trial's parameters, deterministic in the
	// history, so a restarted controller proposes what its predecessor
	// would have.
	Sampler search.Sampler
	// Rule, RuleName: the early-stopping rule, or nil.
	Rule     Rule
	RuleName string // StoppedByASHA or StoppedByMedian
	// MaxTrials is the spec's; State.MaxTrials (raised by extend) wins.
	MaxTrials       int
	Parallel        int
	MaxFailedTrials int
	// Space, when set, is the search space every trial's parameters must
	// be a point of (State.Check): a trial's values become its job's
	// command, args and env, so a value the sampler could not have
	// proposed must never reach Nomad.
	Space search.Space
	// Refused, when set, is why this controller must run nothing for the
	// sweep: its record failed the controller's checks (not the sweep's
	// template, or changed since it was submitted). The first round fails
	// the sweep with it as the reason and stops the trials that run; no
	// trial is proposed or launched.
	Refused string
	// SubmittedBy is who submitted the sweep: its trials' queue records
	// name them (queue mode).
	SubmittedBy string
}

// MaxTrialsLimit bounds a sweep's trials, whatever its state says: the
// spec's limit (cli/spec.MaxTrials), which gpujob sweep extend keeps too.
const MaxTrialsLimit = 500

func (p *Plan) maximize() bool { return p.Mode != stopping.Min }

// Validate reports a Plan the controller cannot run.
func (p *Plan) Validate() error {
	switch {
	case p.Sweep == "":
		return fmt.Errorf("sweep plan: no sweep name")
	case p.Refused != "":
		// It only fails the sweep: nothing else of it is used.
		return nil
	case p.Metric == "":
		return fmt.Errorf("sweep %q: no objective metric", p.Sweep)
	case p.Sampler == nil:
		return fmt.Errorf("sweep %q: no sampler", p.Sweep)
	case p.MaxTrials < 1 || p.Parallel < 1 || p.MaxFailedTrials < 0:
		return fmt.Errorf("sweep %q: max_trials %d, parallel %d, max_failed_trials %d: need >= 1, >= 1, >= 0",
			p.Sweep, p.MaxTrials, p.Parallel, p.MaxFailedTrials)
	}
	return nil
}

// TrialID names the index-th trial (0-based): "trial-001" for the first.
func TrialID(index int) string { return fmt.Sprintf("trial-%03d", index+1) }

// TrialJobID is the Nomad job of a trial: "<sweep>-trial-001".
func TrialJobID(sweep string, index int) string { return sweep + "-" + TrialID(index) }

// ControllerJobID is the Nomad job that runs the controller.
func ControllerJobID(sweep string) string { return sweep + "-controller" }
