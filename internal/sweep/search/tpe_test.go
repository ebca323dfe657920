package search

import (
	"math"
	"sort"
	"strings"
	"testing"
)

// synthSpace and synthObjective: a sharp optimum at lr = 1e-3, layers = 4,
// maximised. The lr term dominates, as a learning rate usually does.
var synthSpace = Space{
	LogUniform("lr", 1e-5, 1e-1),
	Choice("layers", IntValue(2), IntValue(4), IntValue(8)),
}

func synthObjective(a Assignment) float64 {
	lr, _ := a["lr"].Float64()
	layers, _ := a["layers"].Float64()
	d := math.Log10(lr) + 3
	return -d*d - 0.1*math.Abs(layers-4)
}

func bestOf(history []Trial) float64 {
	best := math.Inf(-1)
	for _, tr := range history {
		best = math.Max(best, tr.Value)
	}
	return best
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func maximizing() TPEOptions {
	o := DefaultTPEOptions()
	o.Maximize = true
	return o
}

func TestTPEStartupMatchesRandom(t *testing.T) {
	opts := maximizing()
	tpe, err := NewTPE(mixedSpace, 3, opts)
	if err != nil {
		t.Fatal(err)
	}
	rnd, _ := NewRandom(mixedSpace, 3)
	ht := replay(t, tpe, opts.NStartupTrials, zero)
	hr := replay(t, rnd, opts.NStartupTrials, zero)
	for i := range ht {
		if !ht[i].Params.Equal(hr[i].Params) {
			t.Fatalf("startup trial %d: TPE %v, Random %v", i, ht[i].Params, hr[i].Params)
		}
	}
	// Running and failed trials do not count towards the startup phase.
	pending := append(ht[:opts.NStartupTrials-1:opts.NStartupTrials-1], Trial{Params: ht[0].Params}, Trial{Params: ht[1].Params, Failed: true})
	got, _ := tpe.Next(pending)
	want, _ := rnd.Next(pending)
	if !got.Equal(want) {
		t.Fatalf("with %d completed trials TPE left the startup phase: %v vs random %v", opts.NStartupTrials-1, got, want)
	}
}

func TestTPEWithinBoundsAndDeterministic(t *testing.T) {
	obj := func(a Assignment) float64 {
		d, _ := a["dropout"].Float64()
		b, _ := a["batch"].Float64()
		return d + b
	}
	tpe, err := NewTPE(mixedSpace, 11, maximizing())
	if err != nil {
		t.Fatal(err)
	}
	h := replay(t, tpe, 60, obj)
	for i, tr := range h {
		if err := mixedSpace.Contains(tr.Params); err != nil {
			t.Fatalf("trial %d %v outside the space: %v", i, tr.Params, err)
		}
	}
	again, _ := NewTPE(mixedSpace, 11, maximizing())
	other, _ := NewTPE(mixedSpace, 12, maximizing())
	for _, i := range []int{10, 30, 59} {
		got, _ := again.Next(h[:i])
		if !got.Equal(h[i].Params) {
			t.Fatalf("replayed trial %d = %v, want %v", i, got, h[i].Params)
		}
		if o, _ := other.Next(h[:i]); o.Equal(got) {
			t.Fatalf("trial %d: seeds 11 and 12 proposed the same %v", i, o)
		}
	}
	// int_uniform's upper bound is reachable and favoured once it scores best.
	last := h[40:]
	top := 0
	for _, tr := range last {
		if b, _ := tr.Params["batch"].Int64(); b == 4 {
			top++
		}
	}
	if top < len(last)/2 {
		t.Fatalf("batch=4 maximises the objective but TPE chose it %d of %d times late in the sweep", top, len(last))
	}
}

func TestTPEDirection(t *testing.T) {
	// The same objective, minimised instead: TPE must head for the other end.
	space := Space{Uniform("x", 0, 1)}
	x := func(a Assignment) float64 { f, _ := a["x"].Float64(); return f }
	for _, maximize := range []bool{true, false} {
		opts := DefaultTPEOptions()
		opts.Maximize = maximize
		tpe, _ := NewTPE(space, 5, opts)
		h := replay(t, tpe, 40, x)
		var late []float64
		for _, tr := range h[20:] {
			late = append(late, tr.Value)
		}
		m := median(late)
		if maximize && m < 0.8 || !maximize && m > 0.2 {
			t.Fatalf("maximize=%v: median x of trials 20..40 = %.3f", maximize, m)
		}
	}
}

func TestTPEBeatsRandom(t *testing.T) {
	// Everything is seeded, so this cannot flake; the thresholds are set
	// well inside what was measured (regret ratio TPE/random at 20 trials:
	// 0.56 on seeds 0-9, 0.08-0.25 on other windows of 10, ~0.24 over 100
	// seeds; TPE at least as good on ~76% of seeds) so that they catch a
	// model that stops learning, not a change of random stream.
	const trials = 20
	run := func(seeds uint64) (tpeRegret, rndRegret float64, wins int) {
		var tb, rb []float64
		for seed := range seeds {
			tpe, _ := NewTPE(synthSpace, seed, maximizing())
			rnd, _ := NewRandom(synthSpace, seed)
			bt := bestOf(replay(t, tpe, trials, synthObjective))
			br := bestOf(replay(t, rnd, trials, synthObjective))
			tb, rb = append(tb, bt), append(rb, br)
			if bt >= br {
				wins++
			}
		}
		// The optimum is 0, so regret is minus the best value.
		return -median(tb), -median(rb), wins
	}

	tr, rr, _ := run(10)
	t.Logf("10 seeds, best after %d trials: median regret TPE %.4f, random %.4f", trials, tr, rr)
	// The first 10 trials are shared (TPE's startup draws are Random's), so
	// the gain comes from only 10 model-guided trials.
	if !(tr < 0.75*rr) {
		t.Errorf("10 seeds: TPE median regret %.4f is not clearly below random's %.4f", tr, rr)
	}
	tr, rr, wins := run(50)
	t.Logf("50 seeds: median regret TPE %.4f, random %.4f; TPE at least as good on %d", tr, rr, wins)
	if !(tr < 0.5*rr) {
		t.Errorf("50 seeds: TPE median regret %.4f is not under half of random's %.4f", tr, rr)
	}
	if wins < 30 {
		t.Errorf("50 seeds: TPE at least as good as random on only %d", wins)
	}
}

func TestNewTPEOptions(t *testing.T) {
	tests := []struct {
		name string
		edit func(*TPEOptions)
		want string
	}{
		{"negative startup", func(o *TPEOptions) { o.NStartupTrials = -1 }, "n_startup_trials"},
		{"no candidates", func(o *TPEOptions) { o.NEICandidates = 0 }, "n_ei_candidates"},
		{"zero prior", func(o *TPEOptions) { o.PriorWeight = 0 }, "prior_weight"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultTPEOptions()
			tt.edit(&o)
			if _, err := NewTPE(synthSpace, 1, o); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewTPE() = %v, want error about %s", err, tt.want)
			}
		})
	}
	if _, err := NewTPE(Space{}, 1, DefaultTPEOptions()); err == nil {
		t.Fatal("NewTPE accepted an empty space")
	}
}

func TestTPEIgnoresForeignHistory(t *testing.T) {
	// History from an edited space (missing params, out-of-range values,
	// NaN objectives) must not break or skew the sampler.
	tpe, _ := NewTPE(synthSpace, 2, DefaultTPEOptions())
	var h []Trial
	for i := range 15 {
		h = append(h, Trial{Params: Assignment{"lr": FloatValue(10), "layers": IntValue(16)}, Value: float64(i), Done: true})
	}
	h = append(h, Trial{Params: Assignment{}, Value: math.NaN(), Done: true})
	a, err := tpe.Next(h)
	if err != nil {
		t.Fatal(err)
	}
	if err := synthSpace.Contains(a); err != nil {
		t.Fatalf("proposal %v outside the space: %v", a, err)
	}
}

func TestRampWeights(t *testing.T) {
	if w := rampWeights(3); w[0] != 1 || w[2] != 1 {
		t.Fatalf("rampWeights(3) = %v, want all ones", w)
	}
	w := rampWeights(30)
	if math.Abs(w[0]-1.0/30) > 1e-12 || w[4] != 1 || w[25] != 1 || !(w[1] > w[0]) {
		t.Fatalf("rampWeights(30) = %v: want a ramp from 1/30 to 1 over the 5 oldest, then ones", w)
	}
}

func TestGamma(t *testing.T) {
	for n, want := range map[int]int{1: 1, 10: 1, 11: 2, 100: 10, 251: 25, 1000: 25} {
		if got := gamma(n); got != want {
			t.Errorf("gamma(%d) = %d, want %d", n, got, want)
		}
	}
}

func BenchmarkTPENext(b *testing.B) {
	space := Space{LogUniform("lr", 1e-5, 1e-1), IntUniform("batch", 8, 256), Choice("layers", IntValue(2), IntValue(4), IntValue(8))}
	tpe, _ := NewTPE(space, 1, DefaultTPEOptions())
	rnd, _ := NewRandom(space, 1)
	obj := func(a Assignment) float64 { return synthObjective(a) }
	history := replay(b, rnd, 100, obj)
	b.ResetTimer()
	for b.Loop() {
		if _, err := tpe.Next(history); err != nil {
			b.Fatal(err)
		}
	}
}
