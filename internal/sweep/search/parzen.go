package search

import (
	"math"
	"math/rand/v2"
	"sort"

	"gonum.org/v1/gonum/floats"
	"gonum.org/v1/gonum/stat/distuv"
)

// parzen is a univariate Parzen estimator: a weighted mixture of Gaussians,
// each truncated to [lo, hi], one per observation plus a broad prior
// component centred on the range. Without the prior a handful of close
// observations would give the model no mass elsewhere, and TPE would stop
// exploring.
type parzen struct {
	lo, hi float64
	comps  []distuv.Normal
	logW   []float64 // normalised log mixture weights
	logZ   []float64 // log of each component's mass inside [lo, hi]
	cumW   []float64 // cumulative weights, for picking a component
}

// newParzen builds the estimator with Optuna's (<= 3.1) univariate defaults:
// consider_prior, prior_weight, consider_magic_clip, no consider_endpoints.
// weights[i] belongs to obs[i].
func newParzen(obs, weights []float64, lo, hi, priorWeight float64) parzen {
	m := len(obs) + 1
	mus := make([]float64, m)
	copy(mus, obs)
	mus[m-1] = (lo + hi) / 2
	w := make([]float64, m)
	copy(w, weights)
	w[m-1] = priorWeight

	// Bandwidth of each component: the larger gap to its sorted neighbours
	// (the bounds acting as outer neighbours), so dense regions get narrow
	// kernels and isolated points wide ones.
	order := make([]int, m)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return mus[order[a]] < mus[order[b]] })
	e := make([]float64, m+2) // sorted mus with the bounds as endpoints
	e[0], e[m+1] = lo, hi
	for k, i := range order {
		e[k+1] = mus[i]
	}
	sorted := make([]float64, m)
	for k := range m {
		sorted[k] = math.Max(e[k+1]-e[k], e[k+2]-e[k+1])
	}
	if m >= 2 {
		// Without consider_endpoints the outermost kernels ignore the bound
		// and look only inward, so a point near a bound is not over-smoothed.
		sorted[0] = e[2] - e[1]
		sorted[m-1] = e[m] - e[m-1]
	}
	// The "magic clip": no kernel narrower than range/min(100, m+1), so a
	// few coincident observations cannot collapse to a spike.
	maxSigma := hi - lo
	minSigma := (hi - lo) / math.Min(100, float64(m)+1)
	sigmas := make([]float64, m)
	for k, i := range order {
		sigmas[i] = clamp(sorted[k], minSigma, maxSigma)
	}
	sigmas[m-1] = hi - lo // the prior is as wide as the range

	p := parzen{lo: lo, hi: hi, comps: make([]distuv.Normal, m), logW: make([]float64, m), logZ: make([]float64, m), cumW: make([]float64, m)}
	total := floats.Sum(w)
	acc := 0.0
	for i := range m {
		n := distuv.Normal{Mu: mus[i], Sigma: sigmas[i]}
		p.comps[i] = n
		p.logW[i] = math.Log(w[i] / total)
		p.logZ[i] = logMass(n, lo, hi)
		acc += w[i] / total
		p.cumW[i] = acc
	}
	return p
}

// logMass returns log P(a < X < b) for X ~ n, floored to stay finite.
func logMass(n distuv.Normal, a, b float64) float64 {
	return math.Log(math.Max(n.CDF(b)-n.CDF(a), 1e-300))
}

// sample draws one point: a component by weight, then a point of that
// component truncated to [lo, hi] by inverting its CDF.
func (p parzen) sample(r *rand.Rand) float64 {
	u := r.Float64()
	k := sort.SearchFloat64s(p.cumW, u)
	if k >= len(p.comps) {
		k = len(p.comps) - 1
	}
	n := p.comps[k]
	a, b := n.CDF(p.lo), n.CDF(p.hi)
	q := a + r.Float64()*(b-a)
	return clamp(n.Quantile(clamp(q, 0, 1)), p.lo, p.hi)
}

// logPDF returns the log density of the truncated mixture at x.
func (p parzen) logPDF(x float64) float64 {
	terms := make([]float64, len(p.comps))
	for i, n := range p.comps {
		terms[i] = p.logW[i] + n.LogProb(x) - p.logZ[i]
	}
	return floats.LogSumExp(terms)
}

// logProbBin returns log P(a < X < b) under the truncated mixture; integer
// params score the bin [k-0.5, k+0.5] so that l and g compare probabilities
// of the value actually proposed, not densities at a point rounded away.
func (p parzen) logProbBin(a, b float64) float64 {
	terms := make([]float64, len(p.comps))
	for i, n := range p.comps {
		terms[i] = p.logW[i] + logMass(n, a, b) - p.logZ[i]
	}
	return floats.LogSumExp(terms)
}

// categorical is the estimator for choice and grid params: weighted counts
// plus priorWeight pseudo-observations per option (+1 smoothing with the
// default), so an option that was never tried keeps some probability.
type categorical struct {
	logP []float64
	cum  []float64
}

func newCategorical(nOptions int, obs []int, weights []float64, priorWeight float64) categorical {
	counts := make([]float64, nOptions)
	for i := range counts {
		counts[i] = priorWeight
	}
	for i, o := range obs {
		counts[o] += weights[i]
	}
	total := floats.Sum(counts)
	c := categorical{logP: make([]float64, nOptions), cum: make([]float64, nOptions)}
	acc := 0.0
	for i, n := range counts {
		c.logP[i] = math.Log(n / total)
		acc += n / total
		c.cum[i] = acc
	}
	return c
}

func (c categorical) sample(r *rand.Rand) int {
	k := sort.SearchFloat64s(c.cum, r.Float64())
	return min(k, len(c.cum)-1)
}
