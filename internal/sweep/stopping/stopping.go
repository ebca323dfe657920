// Package stopping decides whether a running sweep trial should be stopped
// early. It implements two rules: asynchronous successive halving (ASHA, as in
// Li et al. 2018 and Ray Tune's ASHAScheduler) and median stopping (the same
// decisions as Optuna 3.1's MedianPruner).
//
// Every decision is a pure function of a History: the points each trial has
// reported, each stamped with a history-wide sequence number, and each trial's
// state. Nothing is kept between calls. A controller that restarts and replays
// the same recorded points therefore reaches the same decisions, which is what
// lets the sweep controller die at any moment without changing the outcome.
//
// Decisions are "sticky": Decide replays the trial's own points in sequence
// order, judging each one against only the evidence that existed when it
// arrived (points and trial ends with a smaller sequence number), and returns
// the first stop. Points that arrive after a stop decision (the job takes a
// moment to die) thus never un-stop a trial, and points recorded later for
// other trials never change an earlier decision.
package stopping

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// Mode says which direction of the objective metric is better.
type Mode string

const (
	// Max means larger values are better (accuracy).
	Max Mode = "max"
	// Min means smaller values are better (loss).
	Min Mode = "min"
)

// State is a trial's lifecycle state as the sweep controller records it.
type State int

const (
	// Running trials are the only ones Decide may stop.
	Running State = iota
	// Completed trials ran to their end; only these feed the median rule,
	// as only COMPLETE trials feed Optuna's pruners.
	Completed
	// Stopped trials were ended early by a rule or by the user.
	Stopped
	// Failed trials ended with an error.
	Failed
)

func (s State) String() string {
	switch s {
	case Running:
		return "running"
	case Completed:
		return "completed"
	case Stopped:
		return "stopped"
	case Failed:
		return "failed"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Point is one reported value of the objective metric.
type Point struct {
	// Seq orders every event of a sweep (points and trial ends) in one
	// sequence: the controller assigns it, strictly increasing, when it
	// records the event (a counter kept in KV, or a Consul ModifyIndex).
	// Ordering by Seq rather than by wall-clock time keeps decisions
	// independent of clock skew between nodes.
	Seq   int64
	Step  int
	Value float64
}

// Trial is one trial's record in the History.
type Trial struct {
	ID    string
	State State
	// EndSeq is the sequence number at which the trial left Running. The
	// median rule counts a Completed trial only for points with a larger
	// Seq, exactly as Optuna counts only trials already told COMPLETE.
	EndSeq int64
	// Points in the order they were recorded.
	Points []Point
}

// History is everything the rules look at.
type History struct {
	Mode   Mode
	Trials []Trial
}

// Decision is the outcome of one Decide call. Only a Stop decision carries a
// Reason and the numbers behind it.
type Decision struct {
	Stop bool
	// Reason is the plain-words text for the stopped task's event, e.g.
	// "stopped by ASHA at step 120: 0.71 < rung cut 0.78".
	Reason string
	// Rung is the ASHA rung (a step count) the trial was judged at; 0 for
	// the median rule.
	Rung int
	// Step is the reported step at which the trial was judged.
	Step int
	// Value is the trial's value that was judged: its value at the rung
	// (ASHA) or its best value so far (median rule).
	Value float64
	// Cut is the threshold it failed: the rung cut or the median.
	Cut float64
}

// trial returns the trial with the given ID, or nil.
func (h History) trial(id string) *Trial {
	for i := range h.Trials {
		if h.Trials[i].ID == id {
			return &h.Trials[i]
		}
	}
	return nil
}

// ordered returns the trial's points sorted by Seq; the stable sort keeps
// recording order for equal Seq so a malformed history still gives one answer.
func ordered(points []Point) []Point {
	out := slices.Clone(points)
	slices.SortStableFunc(out, func(a, b Point) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}

// nanPercentile returns what numpy.nanpercentile(values, p) returns with its
// default "linear" method (numpy 1.24, the one Debian ships with Optuna 3.1;
// Ray Tune's ASHA cutoff uses the same function). NaNs are dropped; no values
// left gives NaN. The arithmetic mirrors numpy's step for step, including its
// quirks with infinities (the median of [1, +Inf] is NaN, not +Inf), so that
// decisions match Optuna's bit for bit.
func nanPercentile(values []float64, p float64) float64 {
	a := make([]float64, 0, len(values))
	for _, v := range values {
		if !math.IsNaN(v) {
			a = append(a, v)
		}
	}
	n := len(a)
	if n == 0 {
		return math.NaN()
	}
	slices.Sort(a)
	q := p / 100 // numpy divides the percentile by 100 first.
	virtual := float64(n-1) * q
	prev := math.Floor(virtual)
	lo, hi := int(prev), int(prev)+1
	switch {
	case virtual >= float64(n-1):
		// numpy points both neighbours at the last element and, because it
		// computes gamma from the clipped index -1, gets gamma = virtual+1.
		lo, hi = n-1, n-1
		prev = -1
	case virtual < 0:
		lo, hi = 0, 0
		prev = 0
	}
	return lerp(a[lo], a[hi], virtual-prev)
}

// lerp mirrors numpy's _lerp: a+(b-a)*t below t=0.5, b-(b-a)*(1-t) from 0.5
// on. The explicit float64 conversions forbid fused multiply-add, which Go may
// otherwise use on arm64 and which would change the last bit.
func lerp(a, b, t float64) float64 {
	d := b - a
	if t >= 0.5 {
		return b - float64(d*(1-t))
	}
	return a + float64(d*t)
}

// worse reports whether v is strictly worse than cut in the given mode. NaN on
// either side is never worse, as in Python's comparisons.
func worse(mode Mode, v, cut float64) bool {
	if mode == Min {
		return v > cut
	}
	return v < cut
}

// worseSign is the comparison sign Reason texts use.
func worseSign(mode Mode) string {
	if mode == Min {
		return ">"
	}
	return "<"
}

// formatPair formats two numbers with the fewest significant digits (at least
// 4) that tell them apart, so a reason never reads "0.7123 < 0.7123".
func formatPair(a, b float64) (string, string) {
	for prec := 4; prec < 17; prec++ {
		sa := strconv.FormatFloat(a, 'g', prec, 64)
		sb := strconv.FormatFloat(b, 'g', prec, 64)
		if sa != sb {
			return sa, sb
		}
	}
	return strconv.FormatFloat(a, 'g', -1, 64), strconv.FormatFloat(b, 'g', -1, 64)
}

// errorf builds validation errors with the package prefix.
func errorf(format string, args ...any) error {
	return fmt.Errorf("early_stop: "+format, args...)
}
