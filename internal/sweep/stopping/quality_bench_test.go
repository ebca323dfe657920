package stopping

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The early-stopping quality benchmark: on a seeded synthetic family of
// learning curves, a random search of N trials run to the end (the anchor)
// against the same trials, in the same order, with ASHA and with the median
// rule stopping the bad ones. The arms see the same parameters per seed and
// run interleaved (the order rotates with the seed). Run:
//
//	go test -run '^$' -bench '^BenchmarkEarlyStoppingQuality$' -benchtime 1x ./internal/sweep/stopping/
//
// Each trial reports every reportEvery steps up to maxSteps; parallel trials
// run at once, one step per time unit, so decisions are made as they would be
// by the controller: asynchronously, on what other trials had reported by
// then. The figures a user cares about are the best final value found (as a
// gap to the anchor's best) and the trial-steps spent (as a fraction of the
// anchor's).

const (
	qTrials      = 27
	qParallel    = 4
	qMaxSteps    = 100
	qReportEvery = 10
	qSeeds       = 20
)

// curveParams is one trial's point of the search space: lr in [1e-4, 1]
// (log-uniform) and width in {16, 32, 64, 128}.
type curveParams struct {
	lr    float64
	width int
}

// curve is the synthetic learning curve: accuracy rises towards a ceiling
// set by lr (a bowl in log lr, best near 0.05) and width (wider is a little
// better), at a speed that grows with lr, so a slow starter (small lr) can
// end above a fast one: the case that makes early stopping hard. Above lr
// 0.4 training becomes unstable and the curve falls back after its peak. A
// seeded per-(trial, step) noise of ±0.005 makes ties and rung orders
// realistic.
func curve(p curveParams, step int, noise *rand.Rand) float64 {
	x := math.Log10(p.lr) - math.Log10(0.05)
	ceiling := 0.95 - 0.08*x*x + 0.01*math.Log2(float64(p.width)/16)
	speed := 0.01 + 0.25*p.lr
	if speed > 0.2 {
		speed = 0.2
	}
	v := ceiling * (1 - math.Exp(-speed*float64(step)))
	if p.lr > 0.4 {
		v -= (p.lr - 0.4) * 0.004 * float64(step)
	}
	return v + (noise.Float64()-0.5)*0.01
}

// sample draws a trial's params (the same for every arm of a seed).
func sample(r *rand.Rand) curveParams {
	return curveParams{lr: math.Pow(10, -4+4*r.Float64()), width: []int{16, 32, 64, 128}[r.IntN(4)]}
}

// rule decides one trial; nil runs every trial to its end.
type rule interface {
	Decide(trialID string, h History) Decision
}

// outcome is one arm's result on one seed.
type outcome struct {
	best    float64 // best final value of a trial that ran to its end
	steps   int     // trial-steps run, stopped trials' included
	stopped int
}

// event is a trial's next report, due at time t.
type event struct {
	t     int
	trial int
	step  int
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if e[i].t != e[j].t {
		return e[i].t < e[j].t
	}
	return e[i].trial < e[j].trial
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// runSweep runs the trials with at most qParallel at a time, stopping them
// with r (nil: never).
func runSweep(params []curveParams, seed uint64, r rule) outcome {
	h := History{Mode: Max}
	var seq int64
	q := &events{}
	next, running := 0, 0
	start := func(now int) {
		for running < qParallel && next < len(params) {
			h.Trials = append(h.Trials, Trial{ID: fmt.Sprintf("trial-%03d", next+1), State: Running})
			heap.Push(q, event{t: now + qReportEvery, trial: next, step: qReportEvery})
			next++
			running++
		}
	}
	start(0)
	out := outcome{best: math.Inf(-1)}
	for q.Len() > 0 {
		e := heap.Pop(q).(event)
		// The noise of a (trial, step) is the same in every arm.
		noise := rand.New(rand.NewPCG(seed, uint64(e.trial)<<16|uint64(e.step)))
		v := curve(params[e.trial], e.step, noise)
		seq++
		tr := &h.Trials[e.trial]
		tr.Points = append(tr.Points, Point{Seq: seq, Step: e.step, Value: v})
		stop := r != nil && r.Decide(tr.ID, h).Stop
		if stop || e.step >= qMaxSteps {
			seq++
			out.steps += e.step
			tr.EndSeq = seq
			if stop {
				tr.State = Stopped
				out.stopped++
			} else {
				tr.State = Completed
				out.best = max(out.best, v)
			}
			running--
			start(e.t)
			continue
		}
		heap.Push(q, event{t: e.t + qReportEvery, trial: e.trial, step: e.step + qReportEvery})
	}
	return out
}

func BenchmarkEarlyStoppingQuality(b *testing.B) {
	arms := []struct {
		name string
		rule rule
	}{
		{"full", nil},
		{"asha", ASHA{GracePeriod: qReportEvery, ReductionFactor: 3, MaxStep: qMaxSteps}},
		{"median", Median{MinTrials: 5, GracePeriod: qReportEvery}},
	}
	type row struct{ gap, steps, stopped []float64 }
	for i := 0; i < b.N; i++ {
		res := map[string]*row{}
		for _, a := range arms {
			res[a.name] = &row{}
		}
		for seed := uint64(0); seed < qSeeds; seed++ {
			r := rand.New(rand.NewPCG(seed, 0x5eed))
			params := make([]curveParams, qTrials)
			for j := range params {
				params[j] = sample(r)
			}
			got := map[string]outcome{}
			// Interleaved: the arms' order rotates with the seed.
			for k := range arms {
				a := arms[(k+int(seed))%len(arms)]
				got[a.name] = runSweep(params, seed, a.rule)
			}
			full := got["full"]
			for _, a := range arms {
				o := got[a.name]
				res[a.name].gap = append(res[a.name].gap, (full.best-o.best)/math.Abs(full.best)*100)
				res[a.name].steps = append(res[a.name].steps, float64(o.steps)/float64(full.steps)*100)
				res[a.name].stopped = append(res[a.name].stopped, float64(o.stopped))
			}
		}
		if i > 0 {
			continue
		}
		var t strings.Builder
		fmt.Fprintf(&t, "\n%d seeds, %d trials each, %d in parallel, %d steps, a report every %d; median (min-max) over seeds\n\n",
			qSeeds, qTrials, qParallel, qMaxSteps, qReportEvery)
		t.WriteString("| arm | best's gap to full search (%) | seeds within 1 % | trial-steps (% of full) | trials stopped early |\n|---|---|---|---|---|\n")
		for _, a := range arms {
			r := res[a.name]
			within := 0
			for _, g := range r.gap {
				if g <= 1 {
					within++
				}
			}
			fmt.Fprintf(&t, "| %s | %s | %d of %d | %s | %s |\n", a.name, spread(r.gap, "%.2f"), within, len(r.gap),
				spread(r.steps, "%.1f"), spread(r.stopped, "%.0f"))
		}
		b.Log(t.String())
	}
}

// spread is "median (min-max)".
func spread(xs []float64, f string) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf(f+" ("+f+"–"+f+")", m, s[0], s[len(s)-1])
}
