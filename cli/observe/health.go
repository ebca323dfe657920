package observe

// LowUtilizationPct is the GPU utilisation under which a training job's
// GPUs count as starved (`gpujob status` warns, `top` flags them): the
// target the seeds' training runs meet.
const LowUtilizationPct = 80

// LowUtilization reports whether a utilisation is under LowUtilizationPct.
func LowUtilization(pct float64) bool { return pct < LowUtilizationPct }

// MeanUtilization is the mean of the utilisations that could be read (nil
// ones are skipped), nil when none could.
func MeanUtilization(pcts []*float64) *float64 {
	var sum float64
	n := 0
	for _, p := range pcts {
		if p != nil {
			sum += *p
			n++
		}
	}
	if n == 0 {
		return nil
	}
	mean := sum / float64(n)
	return &mean
}

// LossSpreadBar is the spread of the ranks' latest losses (at one step)
// over which the ranks disagree: the seeds' bar.
const LossSpreadBar = 0.05

// Spread compares the latest loss of each rank: Max − Min, and the lowest
// and highest step of those losses.
type Spread struct {
	Spread           float64
	MinStep, MaxStep int
}

// StepsDiffer says the latest losses are not all at one step: the spread
// then partly measures the training between them.
func (s Spread) StepsDiffer() bool { return s.MinStep != s.MaxStep }

// High says the ranks disagree: a spread over LossSpreadBar at one step.
func (s Spread) High() bool { return s.Spread > LossSpreadBar && !s.StepsDiffer() }

// LossSpread compares each rank's latest loss (its highest step) among
// losses; ok is false with fewer than two ranks. Losses of a negative rank
// (a line no rank could be told for) are skipped. No attempt is made to
// find a step every rank logged (a log tail may not hold one); a
// difference of steps is reported instead.
func LossSpread(losses []RankLoss) (s Spread, ok bool) {
	latest := map[int]RankLoss{}
	for _, l := range losses {
		if l.Rank < 0 {
			continue
		}
		if old, seen := latest[l.Rank]; !seen || l.Step > old.Step {
			latest[l.Rank] = l
		}
	}
	if len(latest) < 2 {
		return Spread{}, false
	}
	first := true
	var lo, hi float64
	for _, l := range latest {
		if first {
			lo, hi, s.MinStep, s.MaxStep, first = l.Loss, l.Loss, l.Step, l.Step, false
			continue
		}
		lo, hi = min(lo, l.Loss), max(hi, l.Loss)
		s.MinStep, s.MaxStep = min(s.MinStep, l.Step), max(s.MaxStep, l.Step)
	}
	s.Spread = hi - lo
	return s, true
}
