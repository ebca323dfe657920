package stopping

import (
	"math"
	"testing"
)

// TestMedianRules has one case per rule of Optuna 3.1's
// PercentilePruner.prune (MedianPruner is PercentilePruner(50)).
func TestMedianRules(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name  string
		m     Median
		mode  Mode
		setup func(r *rec) // records everything; "x" is the trial judged
		stop  bool
		why   string
	}{
		{
			name: "no completed trial: never stop",
			mode: Max,
			setup: func(r *rec) {
				r.report("a", 0, 0.9)
				r.report("x", 0, 0.1)
			},
		},
		{
			name: "fewer completed trials than MinTrials",
			m:    Median{MinTrials: 3},
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.9)
				r.complete("b", 0.9)
				r.report("x", 0, 0.1)
			},
		},
		{
			name: "MinTrials reached",
			m:    Median{MinTrials: 2},
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.8)
				r.complete("b", 0.9)
				r.report("x", 0, 0.1)
			},
			stop: true,
			why:  "stopped by median stopping at step 0: best 0.1 < median 0.85 of 2 completed trials",
		},
		{
			name: "stopped and failed trials are not completed",
			m:    Median{MinTrials: 2},
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.8)
				r.report("b", 0, 0.9)
				r.end("b", Stopped)
				r.report("c", 0, 0.9)
				r.end("c", Failed)
				r.report("x", 0, 0.1)
			},
		},
		{
			name: "a trial completed after the point does not count for it",
			mode: Max,
			setup: func(r *rec) {
				r.report("a", 0, 0.9)
				r.report("x", 0, 0.1)
				r.end("a", Completed)
			},
		},
		{
			name: "before the grace period",
			m:    Median{GracePeriod: 2},
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.9, 0.9, 0.9)
				r.report("x", 0, 0.1)
				r.report("x", 1, 0.1)
			},
		},
		{
			name: "at the grace period step",
			m:    Median{GracePeriod: 2},
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.9, 0.9, 0.9)
				r.report("x", 0, 0.1)
				r.report("x", 1, 0.1)
				r.report("x", 2, 0.1)
			},
			stop: true,
			why:  "stopped by median stopping at step 2: best 0.1 < median 0.9 of 1 completed trials",
		},
		{
			name: "off-interval step is not judged",
			m:    Median{Interval: 3},
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.1, 0.9, 0.9, 0.9, 0.9)
				r.report("x", 0, 0.5) // judged: 0.5 > 0.1
				r.report("x", 1, 0.2) // steps 1, 2 are in window [0, 3)
				r.report("x", 2, 0.2)
			},
		},
		{
			name: "first report in a new window is judged",
			m:    Median{Interval: 3},
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.1, 0.9, 0.9, 0.9, 0.9)
				r.report("x", 0, 0.5)
				r.report("x", 1, 0.2)
				r.report("x", 3, 0.2)
			},
			stop: true,
			why:  "stopped by median stopping at step 3: best 0.5 < median 0.9 of 1 completed trials",
		},
		{
			name: "a window with no report is judged at the next report",
			m:    Median{Interval: 3, GracePeriod: 1},
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.1, 0.1, 0.9, 0.9, 0.9, 0.9)
				r.report("x", 1, 0.5) // window [1, 4)
				r.report("x", 5, 0.2) // window [4, 7): step 4 never reported
			},
			stop: true,
			why:  "stopped by median stopping at step 5: best 0.5 < median 0.9 of 1 completed trials",
		},
		{
			name: "the best value so far is judged, not the latest",
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.5, 0.5)
				r.report("x", 0, 0.8)
				r.report("x", 1, 0.1)
			},
		},
		{
			name: "only completed trials that reported this step count",
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.9) // reported step 0 only
				r.report("x", 0, 0.95)
				r.report("x", 1, 0.1)
			},
		},
		{
			name: "MinReported not met at this step",
			m:    Median{MinReported: 3},
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.9, 0.9)
				r.complete("b", 0.9, 0.9)
				r.complete("c", 0.9) // did not reach step 1
				r.report("x", 1, 0.1)
			},
		},
		{
			name: "NaN values count towards MinReported but not the median",
			m:    Median{MinReported: 2},
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", nan)
				r.complete("b", 0.9)
				r.report("x", 0, 0.1)
			},
			stop: true,
			why:  "stopped by median stopping at step 0: best 0.1 < median 0.9 of 2 completed trials",
		},
		{
			name: "all completed values NaN: no median, no stop",
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", nan)
				r.report("x", 0, 0.1)
			},
		},
		{
			name: "own values all NaN: stop",
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.1)
				r.report("x", 0, nan)
			},
			stop: true,
			why:  "stopped by median stopping at step 0: every value reported so far is NaN",
		},
		{
			name: "own NaN skipped for the best",
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.5, 0.5)
				r.report("x", 0, 0.6)
				r.report("x", 1, nan)
			},
		},
		{
			name: "min mode",
			mode: Min,
			setup: func(r *rec) {
				r.complete("a", 0.2)
				r.complete("b", 0.4)
				r.report("x", 0, 0.5)
			},
			stop: true,
			why:  "stopped by median stopping at step 0: best 0.5 > median 0.3 of 2 completed trials",
		},
		{
			name: "equal to the median continues",
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.25) // numpy's median of 0.2 and 0.4 is 0.30000000000000004
				r.complete("b", 0.75)
				r.report("x", 0, 0.5)
			},
		},
		{
			name: "a repeated step keeps its first value",
			mode: Max,
			setup: func(r *rec) {
				r.report("x", 0, 0.9)
				r.complete("a", 0.5)
				r.report("x", 0, 0.1)
			},
		},
		{
			name: "a stop is sticky",
			mode: Max,
			setup: func(r *rec) {
				r.complete("a", 0.5, 0.5)
				r.report("x", 0, 0.1)
				r.report("x", 1, 0.9)
			},
			stop: true,
			why:  "stopped by median stopping at step 0: best 0.1 < median 0.5 of 1 completed trials",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRec(tt.mode)
			tt.setup(r)
			d := tt.m.Decide("x", r.h)
			if d.Stop != tt.stop || d.Reason != tt.why {
				t.Errorf("Decide = %+v, want Stop %v, Reason %q", d, tt.stop, tt.why)
			}
		})
	}
}

func TestMedianOnlyStopsRunningTrials(t *testing.T) {
	r := newRec(Max)
	r.complete("a", 0.9)
	r.report("x", 0, 0.1)
	if d := (Median{}).Decide("x", r.h); !d.Stop {
		t.Fatalf("running trial not stopped: %+v", d)
	}
	for _, s := range []State{Completed, Stopped, Failed} {
		r.find("x").State = s
		if d := (Median{}).Decide("x", r.h); d.Stop {
			t.Errorf("%v trial stopped: %+v", s, d)
		}
	}
	if d := (Median{}).Decide("nobody", r.h); d.Stop {
		t.Errorf("unknown trial stopped: %+v", d)
	}
}

func TestMedianValidate(t *testing.T) {
	if err := (Median{GracePeriod: 5, MinTrials: 5, Interval: 2, MinReported: 1}).Validate(); err != nil {
		t.Error(err)
	}
	for _, m := range []Median{{GracePeriod: -1}, {MinTrials: -1}, {Interval: -1}, {MinReported: -1}} {
		if m.Validate() == nil {
			t.Errorf("%+v: no error", m)
		}
	}
}
