package stopping

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// ASHA is asynchronous successive halving (Li et al. 2018, "A System for
// Massively Parallel Hyperparameter Tuning"), with the decision rule of Ray
// Tune's ASHAScheduler (one bracket). Rungs sit at GracePeriod*eta^k steps.
// When a trial reaches a rung it is compared with the values other trials
// recorded at that rung before it, and continues only if it is not worse than
// their (1-1/eta) quantile, i.e. if it would be in their top 1/eta.
type ASHA struct {
	// GracePeriod is the first rung, in the metric's step units. Zero means
	// 1, Ray's default.
	GracePeriod int
	// ReductionFactor is eta. Zero means 3, the default of Ray and of the
	// paper.
	ReductionFactor int
	// MaxStep, when positive, caps the rungs: no rung lies beyond it. It
	// does not end trials; their own training loop does that. Unlike Ray,
	// which counts rungs with floating-point logarithms and can drop the top
	// one (log(1000)/log(10) < 3), rungs are computed in integers.
	MaxStep int
}

func (a ASHA) grace() int {
	if a.GracePeriod <= 0 {
		return 1
	}
	return a.GracePeriod
}

func (a ASHA) eta() int {
	if a.ReductionFactor <= 0 {
		return 3
	}
	return a.ReductionFactor
}

// Validate reports settings that cannot describe a rung ladder. Decide itself
// never fails: it treats zero values as the defaults above.
func (a ASHA) Validate() error {
	switch {
	case a.GracePeriod < 0:
		return errorf("grace_period must not be negative, got %d", a.GracePeriod)
	case a.ReductionFactor < 0 || a.ReductionFactor == 1:
		return errorf("reduction_factor must be at least 2, got %d", a.ReductionFactor)
	case a.MaxStep < 0:
		return errorf("max_step must not be negative, got %d", a.MaxStep)
	case a.MaxStep > 0 && a.MaxStep < a.grace():
		return errorf("max_step %d is below grace_period %d, so there would be no rung", a.MaxStep, a.grace())
	}
	return nil
}

// Rungs lists the rungs up to and including limit (and MaxStep, if set), for
// status tables and plots.
func (a ASHA) Rungs(limit int) []int {
	var rungs []int
	for r := a.grace(); r <= limit && (a.MaxStep <= 0 || r <= a.MaxStep); r *= a.eta() {
		rungs = append(rungs, r)
		if r > math.MaxInt/a.eta() {
			break
		}
	}
	return rungs
}

// rungAt returns the highest rung at or below step. Ray walks its rungs from
// the top and acts only on the highest one the trial has reached: a trial that
// jumps past several rungs in one report is judged at the highest, and the
// lower ones are never recorded for it.
func (a ASHA) rungAt(step int) (int, bool) {
	g, eta := a.grace(), a.eta()
	if step < g || (a.MaxStep > 0 && g > a.MaxStep) {
		return 0, false
	}
	r := g
	for r <= math.MaxInt/eta {
		next := r * eta
		if next > step || (a.MaxStep > 0 && next > a.MaxStep) {
			break
		}
		r = next
	}
	return r, true
}

// rungEvent is one trial arriving at one rung.
type rungEvent struct {
	rung    int
	seq     int64
	trialID string
	index   int // position among the trial's ordered points, for a total order
	step    int
	value   float64
}

// Decide says whether the trial should stop now.
//
// A trial reaches a rung with the first point whose step is at or past the
// rung (Ray's "cur_iter >= milestone"), and the value recorded for it there is
// that point's value, not an earlier one: the decision is made when the trial
// gets there. Each trial is recorded at most once per rung; a point whose
// highest reached rung is already recorded changes nothing.
//
// The order in which trials reach a rung is the order of those points' Seq
// (ties, which a well-formed history does not have, by trial ID, then point
// position). A trial's value is compared with the values recorded at the rung
// before it, the trial itself not included, exactly as Ray computes its cutoff
// before adding the trial. Ray's cutoff is numpy's nanpercentile at
// (1-1/eta)*100 of those values (for min mode on negated values), so:
//   - the first trial at a rung always continues (nothing to compare with);
//   - with fewer than eta values recorded there is no grace: one recorded
//     value v gives the cut v, and a trial strictly worse than it stops;
//   - a NaN value is recorded but ignored by the quantile, and a NaN value
//     never compares worse, so a trial reporting NaN continues.
//
// Every point from every trial counts, whatever the trial's state now, as
// Ray keeps the rung records of trials that were stopped or have failed. Only
// a Running trial can be stopped; for others Decide returns no stop.
func (a ASHA) Decide(trialID string, h History) Decision {
	t := h.trial(trialID)
	if t == nil || t.State != Running || len(t.Points) == 0 {
		return Decision{}
	}
	var events []rungEvent
	for _, u := range h.Trials {
		recorded := map[int]bool{}
		for i, p := range ordered(u.Points) {
			r, ok := a.rungAt(p.Step)
			if !ok || recorded[r] {
				continue
			}
			recorded[r] = true
			events = append(events, rungEvent{rung: r, seq: p.Seq, trialID: u.ID, index: i, step: p.Step, value: p.Value})
		}
	}
	slices.SortFunc(events, func(x, y rungEvent) int {
		return cmp.Or(cmp.Compare(x.seq, y.seq), cmp.Compare(x.trialID, y.trialID), cmp.Compare(x.index, y.index))
	})

	// Ray turns every metric into "larger is better" by multiplying by -1 in
	// min mode; doing the same keeps the quantile arithmetic identical.
	sign := 1.0
	if h.Mode == Min {
		sign = -1
	}
	percentile := (1 - 1/float64(a.eta())) * 100
	recorded := map[int][]float64{}
	for _, e := range events {
		v := sign * e.value
		if e.trialID == trialID && len(recorded[e.rung]) > 0 {
			cut := nanPercentile(recorded[e.rung], percentile)
			if v < cut {
				return ashaStop(h.Mode, e, sign*cut)
			}
		}
		recorded[e.rung] = append(recorded[e.rung], v)
	}
	return Decision{}
}

func ashaStop(mode Mode, e rungEvent, cut float64) Decision {
	at := fmt.Sprintf("step %d", e.step)
	if e.step != e.rung {
		at = fmt.Sprintf("step %d (rung %d)", e.step, e.rung)
	}
	v, c := formatPair(e.value, cut)
	return Decision{
		Stop:   true,
		Reason: fmt.Sprintf("stopped by ASHA at %s: %s %s rung cut %s", at, v, worseSign(mode), c),
		Rung:   e.rung,
		Step:   e.step,
		Value:  e.value,
		Cut:    cut,
	}
}
