package stopping

import (
	"fmt"
	"math"
)

// Median is the median stopping rule with the exact decisions of Optuna
// 3.1's MedianPruner, which is PercentilePruner(50) in
// optuna/pruners/_percentile.py. The comments in Decide name the line of
// PercentilePruner.prune each rule mirrors.
type Median struct {
	// GracePeriod is Optuna's n_warmup_steps: no stop before this step.
	GracePeriod int
	// MinTrials is Optuna's n_startup_trials: no stop until this many trials
	// have COMPLETED (stopped and failed trials do not count). Zero means
	// zero; Optuna's own default is 5, which a spec layer may apply.
	MinTrials int
	// Interval is Optuna's interval_steps: judge only at the first report
	// in each window of Interval steps after the grace period. Zero means 1.
	Interval int
	// MinReported is Optuna's n_min_trials: how many completed trials must
	// have reported the very step being judged. Zero means 1, Optuna's
	// default.
	MinReported int
}

// medianPercentile is the percentile MedianPruner passes to PercentilePruner.
const medianPercentile = 50.0

func (m Median) interval() int    { return max(m.Interval, 1) }
func (m Median) minReported() int { return max(m.MinReported, 1) }

// Validate reports settings Optuna's PercentilePruner constructor rejects
// (zero Interval and MinReported are read as the defaults instead).
func (m Median) Validate() error {
	switch {
	case m.GracePeriod < 0:
		return errorf("grace_period must not be negative, got %d", m.GracePeriod)
	case m.MinTrials < 0:
		return errorf("min_trials must not be negative, got %d", m.MinTrials)
	case m.Interval < 0:
		return errorf("interval must be at least 1, got %d", m.Interval)
	case m.MinReported < 0:
		return errorf("min_reported must be at least 1, got %d", m.MinReported)
	}
	return nil
}

// completedTrial is a COMPLETE trial's intermediate values as Optuna holds
// them.
type completedTrial struct {
	endSeq int64
	values map[int]float64
}

// intermediate mirrors Trial.report: one value per step, and a second report
// of a step is ignored (Optuna keeps the first and warns).
func intermediate(points []Point) map[int]float64 {
	values := map[int]float64{}
	for _, p := range ordered(points) {
		if _, seen := values[p.Step]; !seen {
			values[p.Step] = p.Value
		}
	}
	return values
}

// Decide says whether the trial should stop now. It replays the trial's
// points in Seq order and asks, after each one, what Optuna's
// trial.should_prune() would answer at that moment: its intermediate values
// are the points so far, and the completed trials are those whose EndSeq is
// below the point's Seq. The first yes is returned. Only a Running trial can
// be stopped.
func (m Median) Decide(trialID string, h History) Decision {
	t := h.trial(trialID)
	if t == nil || t.State != Running {
		return Decision{}
	}
	var completed []completedTrial
	for _, u := range h.Trials {
		// prune(): study.get_trials(states=(TrialState.COMPLETE,)).
		if u.State == Completed && u.ID != trialID {
			completed = append(completed, completedTrial{endSeq: u.EndSeq, values: intermediate(u.Points)})
		}
	}
	own := map[int]float64{}
	for _, p := range ordered(t.Points) {
		if _, seen := own[p.Step]; !seen {
			own[p.Step] = p.Value
		}
		if d := m.judge(h.Mode, own, completed, p.Seq); d.Stop {
			return d
		}
	}
	return Decision{}
}

// judge is PercentilePruner.prune for one moment: own holds the trial's
// intermediate values, and completed trials count if they ended before seq.
func (m Median) judge(mode Mode, own map[int]float64, completed []completedTrial, seq int64) Decision {
	var done []completedTrial
	for _, c := range completed {
		if c.endSeq < seq {
			done = append(done, c)
		}
	}
	// "if n_trials == 0: return False", then
	// "if n_trials < self._n_startup_trials: return False".
	if len(done) == 0 || len(done) < m.MinTrials {
		return Decision{}
	}
	// "step = trial.last_step": the largest step reported, not the latest.
	step, second := lastTwoSteps(own)
	// "if step < n_warmup_steps: return False".
	if step < m.GracePeriod {
		return Decision{}
	}
	// _is_first_in_interval_step: judge only if the step reported before
	// this one (the largest other step, -1 if none) lies below the start of
	// the interval window holding step; a window with no report is judged at
	// its first later report. step >= GracePeriod here, so integer division
	// is Python's floor division.
	windowStart := (step-m.GracePeriod)/m.interval()*m.interval() + m.GracePeriod
	if second >= windowStart {
		return Decision{}
	}
	// _get_best_intermediate_result_over_steps: nanmax (max mode) or
	// nanmin (min mode) over every step so far; all NaN gives NaN, and
	// "if math.isnan(best_intermediate_result): return True".
	best := bestValue(mode, own)
	if math.IsNaN(best) {
		return Decision{
			Stop:   true,
			Reason: fmt.Sprintf("stopped by median stopping at step %d: every value reported so far is NaN", step),
			Step:   step,
			Value:  best,
			Cut:    math.NaN(),
		}
	}
	// _get_percentile_intermediate_result_over_trials: the completed
	// trials' values at exactly this step (trials that did not report it
	// are left out; NaN values are kept here and count towards
	// n_min_trials); fewer than n_min_trials gives NaN; else nanpercentile
	// at 100-50 (max mode) or 50 (min mode), both the median.
	var atStep []float64
	for _, c := range done {
		if v, ok := c.values[step]; ok {
			atStep = append(atStep, v)
		}
	}
	if len(atStep) < m.minReported() {
		return Decision{}
	}
	p := medianPercentile
	if mode != Min {
		p = 100 - medianPercentile
	}
	cut := nanPercentile(atStep, p)
	// "if math.isnan(p): return False", then "best < p" (maximize) or
	// "best > p" (minimize). worse is false for NaN, which covers both.
	if !worse(mode, best, cut) {
		return Decision{}
	}
	b, c := formatPair(best, cut)
	return Decision{
		Stop: true,
		Reason: fmt.Sprintf("stopped by median stopping at step %d: best %s %s median %s of %d completed trials",
			step, b, worseSign(mode), c, len(atStep)),
		Step:  step,
		Value: best,
		Cut:   cut,
	}
}

// lastTwoSteps returns the largest step and the largest other step (-1 if
// none).
func lastTwoSteps(values map[int]float64) (last, second int) {
	last, second = -1, -1
	for s := range values {
		switch {
		case s > last:
			last, second = s, last
		case s > second:
			second = s
		}
	}
	return last, second
}

// bestValue is numpy's nanmax (max mode) or nanmin (min mode): NaNs are
// skipped, and only NaNs give NaN.
func bestValue(mode Mode, values map[int]float64) float64 {
	best := math.NaN()
	for _, v := range values {
		switch {
		case math.IsNaN(v):
		case math.IsNaN(best), mode == Min && v < best, mode != Min && v > best:
			best = v
		}
	}
	return best
}
