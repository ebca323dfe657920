package search

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// TPEOptions tunes the Tree-structured Parzen Estimator. Start from
// DefaultTPEOptions; the zero value is not usable (zero candidates).
type TPEOptions struct {
	// Maximize says whether larger objective values are better.
	Maximize bool
	// NStartupTrials is how many completed trials are needed before the
	// model is used; until then TPE proposes exactly what Random would.
	NStartupTrials int
	// NEICandidates is how many candidates are drawn from the good model to
	// pick the best l(x)/g(x) from.
	NEICandidates int
	// PriorWeight is the weight of each estimator's prior component.
	PriorWeight float64
}

// DefaultTPEOptions returns Optuna's defaults (n_startup_trials=10,
// n_ei_candidates=24, prior_weight=1), minimizing.
func DefaultTPEOptions() TPEOptions {
	return TPEOptions{NStartupTrials: 10, NEICandidates: 24, PriorWeight: 1}
}

// TPE is the Tree-structured Parzen Estimator of Bergstra et al. (2011), in
// the univariate (independent per param) form that is Optuna's default.
type TPE struct {
	space Space
	seed  uint64
	opts  TPEOptions
}

var _ Sampler = (*TPE)(nil)

// NewTPE returns a TPE search over space.
func NewTPE(space Space, seed uint64, opts TPEOptions) (*TPE, error) {
	if err := space.Validate(); err != nil {
		return nil, fmt.Errorf("tpe search: %w", err)
	}
	switch {
	case opts.NStartupTrials < 0:
		return nil, fmt.Errorf("tpe search: n_startup_trials must be >= 0, got %d", opts.NStartupTrials)
	case opts.NEICandidates < 1:
		return nil, fmt.Errorf("tpe search: n_ei_candidates must be >= 1, got %d", opts.NEICandidates)
	case !(opts.PriorWeight > 0) || math.IsInf(opts.PriorWeight, 0):
		return nil, errors.New("tpe search: prior_weight must be a positive finite number")
	}
	return &TPE{space: space, seed: seed, opts: opts}, nil
}

// observation is a completed trial with its position in the history, which
// orders the weights (recent trials weigh more once there are many).
type observation struct {
	index int
	trial Trial
}

// Next proposes trial len(history). It draws from the same per-trial
// generator as Random, so the first NStartupTrials proposals of a sequential
// sweep are identical to Random's with the same seed.
func (t *TPE) Next(history []Trial) (Assignment, error) {
	r := trialRand(t.seed, len(history))
	var obs []observation
	for i, tr := range history {
		// Failed and running trials carry no objective; they do not shape the model.
		if tr.Done && !tr.Failed && !math.IsNaN(tr.Value) && !math.IsInf(tr.Value, 0) {
			obs = append(obs, observation{index: i, trial: tr})
		}
	}
	if len(obs) < t.opts.NStartupTrials {
		return sampleSpace(t.space, r), nil
	}
	good, bad := t.split(obs)
	a := make(Assignment, len(t.space))
	for _, p := range t.space {
		if p.Kind == KindChoice || p.Kind == KindGrid {
			a[p.Name] = t.sampleCategorical(p, good, bad, r)
		} else {
			a[p.Name] = t.sampleNumeric(p, good, bad, r)
		}
	}
	return a, nil
}

// gamma is Optuna's default split: the best ceil(10%) of trials, at most 25,
// form the "good" group.
func gamma(n int) int { return min(int(math.Ceil(0.1*float64(n))), 25) }

// split sorts the observations best first (ties by index, for determinism)
// and returns the good and bad groups, each back in history order.
func (t *TPE) split(obs []observation) (good, bad []observation) {
	sorted := append([]observation(nil), obs...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i].trial.Value, sorted[j].trial.Value
		if t.opts.Maximize {
			return a > b
		}
		return a < b
	})
	n := gamma(len(sorted))
	good, bad = sorted[:n], sorted[n:]
	byIndex := func(s []observation) {
		sort.Slice(s, func(i, j int) bool { return s[i].index < s[j].index })
	}
	byIndex(good)
	byIndex(bad)
	return good, bad
}

// rampWeights is Optuna's default_weights: equal weights up to 25
// observations, beyond that the oldest are ramped down linearly so the model
// follows where the search has moved.
func rampWeights(n int) []float64 {
	w := make([]float64, n)
	for i := range w {
		w[i] = 1
	}
	if n < 25 {
		return w
	}
	ramp := n - 25
	for i := range ramp {
		// numpy.linspace(1/n, 1, ramp)
		if ramp == 1 {
			w[i] = 1 / float64(n)
		} else {
			w[i] = 1/float64(n) + float64(i)*(1-1/float64(n))/float64(ramp-1)
		}
	}
	return w
}

// numericObs extracts p's values, in the estimator's space, from the
// observations that hold a valid value for it.
func numericObs(p Param, obs []observation) []float64 {
	xs := make([]float64, 0, len(obs))
	for _, o := range obs {
		v, ok := o.trial.Params[p.Name]
		if !ok || !p.Contains(v) {
			continue
		}
		f, _ := v.Float64()
		if p.Kind == KindLogUniform {
			f = math.Log(f)
		}
		xs = append(xs, f)
	}
	return xs
}

// sampleNumeric fits l (good) and g (bad) and returns the candidate from l
// with the largest l/g, the expected-improvement maximiser under TPE.
func (t *TPE) sampleNumeric(p Param, good, bad []observation, r *rand.Rand) Value {
	lo, hi := p.Lo, p.Hi
	switch p.Kind {
	case KindLogUniform:
		lo, hi = math.Log(lo), math.Log(hi)
	case KindIntUniform:
		// Each integer owns the unit bin around it, the end ones included.
		lo, hi = lo-0.5, hi+0.5
	}
	gx, bx := numericObs(p, good), numericObs(p, bad)
	l := newParzen(gx, rampWeights(len(gx)), lo, hi, t.opts.PriorWeight)
	g := newParzen(bx, rampWeights(len(bx)), lo, hi, t.opts.PriorWeight)

	best, bestScore := 0.0, math.Inf(-1)
	for range t.opts.NEICandidates {
		x := l.sample(r)
		var score float64
		if p.Kind == KindIntUniform {
			x = clamp(math.Round(x), p.Lo, p.Hi)
			score = l.logProbBin(x-0.5, x+0.5) - g.logProbBin(x-0.5, x+0.5)
		} else {
			score = l.logPDF(x) - g.logPDF(x)
		}
		if score > bestScore {
			best, bestScore = x, score
		}
	}
	switch p.Kind {
	case KindLogUniform:
		return FloatValue(clamp(math.Exp(best), p.Lo, p.Hi))
	case KindIntUniform:
		return IntValue(int64(best))
	default:
		return FloatValue(best)
	}
}

// sampleCategorical is sampleNumeric for choice and grid params.
func (t *TPE) sampleCategorical(p Param, good, bad []observation, r *rand.Rand) Value {
	fit := func(obs []observation) categorical {
		idx := make([]int, 0, len(obs))
		for _, o := range obs {
			if v, ok := o.trial.Params[p.Name]; ok {
				if i := p.index(v); i >= 0 {
					idx = append(idx, i)
				}
			}
		}
		return newCategorical(len(p.Values), idx, rampWeights(len(idx)), t.opts.PriorWeight)
	}
	l, g := fit(good), fit(bad)
	best, bestScore := 0, math.Inf(-1)
	for range t.opts.NEICandidates {
		k := l.sample(r)
		if s := l.logP[k] - g.logP[k]; s > bestScore {
			best, bestScore = k, s
		}
	}
	return p.Values[best]
}
