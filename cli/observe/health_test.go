package observe

import (
	"math"
	"testing"
)

func TestMeanUtilization(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	if m := MeanUtilization([]*float64{nil, nil}); m != nil {
		t.Errorf("no figures: mean %v, want nil", *m)
	}
	m := MeanUtilization([]*float64{f(90), nil, f(60)})
	if m == nil || *m != 75 {
		t.Fatalf("mean of 90, unknown, 60 = %v, want 75", m)
	}
	if !LowUtilization(*m) || LowUtilization(LowUtilizationPct) || !LowUtilization(LowUtilizationPct-0.1) {
		t.Errorf("LowUtilization: the bar is %v, strictly under it is low", float64(LowUtilizationPct))
	}
}

func TestLossSpread(t *testing.T) {
	for _, tc := range []struct {
		name     string
		losses   []RankLoss
		ok       bool
		spread   float64
		differ   bool
		high     bool
		min, max int
	}{
		{name: "one rank", losses: []RankLoss{{Rank: 0, Step: 10, Loss: 1}, {Rank: 0, Step: 20, Loss: 2}}},
		{name: "lines of no rank are skipped", losses: []RankLoss{{Rank: 0, Step: 10, Loss: 1}, {Rank: -1, Step: 10, Loss: 9}}},
		{name: "agreeing ranks at one step", ok: true, spread: 0.01, min: 40, max: 40,
			losses: []RankLoss{{Rank: 0, Step: 40, Loss: 0.70}, {Rank: 1, Step: 40, Loss: 0.69}, {Rank: 1, Step: 30, Loss: 5}}},
		{name: "disagreeing ranks at one step", ok: true, spread: 0.5, high: true, min: 40, max: 40,
			losses: []RankLoss{{Rank: 0, Step: 40, Loss: 0.2}, {Rank: 1, Step: 40, Loss: 0.7}}},
		{name: "a wide spread across steps is not disagreement", ok: true, spread: 0.5, differ: true, min: 30, max: 40,
			losses: []RankLoss{{Rank: 0, Step: 40, Loss: 0.2}, {Rank: 1, Step: 30, Loss: 0.7}}},
	} {
		s, ok := LossSpread(tc.losses)
		if ok != tc.ok {
			t.Errorf("%s: ok %v, want %v", tc.name, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		if math.Abs(s.Spread-tc.spread) > 1e-9 || s.StepsDiffer() != tc.differ || s.High() != tc.high || s.MinStep != tc.min || s.MaxStep != tc.max {
			t.Errorf("%s: %+v (differ %v, high %v), want spread %v steps %d..%d differ %v high %v",
				tc.name, s, s.StepsDiffer(), s.High(), tc.spread, tc.min, tc.max, tc.differ, tc.high)
		}
	}
}
