package stopping

import (
	"math"
	"strconv"
	"testing"
)

// rec builds a History by replaying events in order, stamping each with the
// next sequence number, the way the controller records them.
type rec struct {
	h   History
	seq int64
}

func newRec(mode Mode) *rec { return &rec{h: History{Mode: mode}} }

func (r *rec) find(id string) *Trial {
	if t := r.h.trial(id); t != nil {
		return t
	}
	r.h.Trials = append(r.h.Trials, Trial{ID: id, State: Running})
	return &r.h.Trials[len(r.h.Trials)-1]
}

// report records a point and returns its sequence number.
func (r *rec) report(id string, step int, value float64) int64 {
	r.seq++
	t := r.find(id)
	t.Points = append(t.Points, Point{Seq: r.seq, Step: step, Value: value})
	return r.seq
}

// end moves a trial out of Running.
func (r *rec) end(id string, s State) {
	r.seq++
	t := r.find(id)
	t.State, t.EndSeq = s, r.seq
}

// complete records a whole finished trial: one point per step from 0.
func (r *rec) complete(id string, values ...float64) {
	for step, v := range values {
		r.report(id, step, v)
	}
	r.end(id, Completed)
}

func TestNanPercentileMatchesNumpy(t *testing.T) {
	inf := math.Inf(1)
	nan := math.NaN()
	// Expected values printed by numpy 1.24 np.nanpercentile.
	tests := []struct {
		values []float64
		p      float64
		want   float64
	}{
		{[]float64{0.1, 0.2, 0.7}, 50, 0.2},
		{[]float64{0.1, 0.2, 0.7}, (1 - 1.0/3) * 100, 0.3666666666666667},
		{[]float64{1, 2}, 50, 1.5},
		{[]float64{1, 2}, (1 - 1.0/3) * 100, 1.6666666666666667},
		{[]float64{2, nan, 1}, 50, 1.5},
		{[]float64{5}, 50, 5},
		{[]float64{nan}, 50, nan},
		{nil, 50, nan},
		{[]float64{inf}, 50, nan},
		{[]float64{1, inf}, 50, nan},
		{[]float64{1, 2, inf}, 50, nan},
		{[]float64{1, 2, inf}, (1 - 1.0/3) * 100, inf},
		{[]float64{-inf, 1}, 50, -inf},
	}
	for _, tt := range tests {
		got := nanPercentile(tt.values, tt.p)
		if !(got == tt.want || math.IsNaN(got) && math.IsNaN(tt.want)) {
			t.Errorf("nanPercentile(%v, %v) = %v, want %v", tt.values, tt.p, got, tt.want)
		}
	}
}

func TestFormatPairTellsValuesApart(t *testing.T) {
	for _, tt := range []struct {
		a, b   float64
		wa, wb string
	}{
		{0.71, 0.78, "0.71", "0.78"},
		{0.712341, 0.712342, "0.712341", "0.712342"},
		{1.0 / 3, 0.5, "0.3333", "0.5"},
	} {
		ga, gb := formatPair(tt.a, tt.b)
		if ga != tt.wa || gb != tt.wb {
			t.Errorf("formatPair(%v, %v) = %q, %q; want %q, %q", tt.a, tt.b, ga, gb, tt.wa, tt.wb)
		}
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Running: "running", Completed: "completed", Stopped: "stopped", Failed: "failed", 9: "State(" + strconv.Itoa(9) + ")"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(s), s.String(), want)
		}
	}
}
