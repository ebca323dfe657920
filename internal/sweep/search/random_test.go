package search

import (
	"math"
	"sort"
	"testing"
)

var mixedSpace = Space{
	Uniform("dropout", 0.1, 0.5),
	LogUniform("lr", 1e-5, 1e-1),
	IntUniform("batch", 1, 4),
	Choice("opt", StringValue("adam"), StringValue("sgd"), IntValue(3)),
	GridParam("warmup", FloatValue(0), FloatValue(0.1)),
}

// replay runs s for n trials, feeding each proposal back as a completed
// trial scored by f, and returns the history.
func replay(t testing.TB, s Sampler, n int, f func(Assignment) float64) []Trial {
	t.Helper()
	var history []Trial
	for range n {
		a, err := s.Next(history)
		if err != nil {
			t.Fatalf("Next after %d trials: %v", len(history), err)
		}
		history = append(history, Trial{Params: a, Value: f(a), Done: true})
	}
	return history
}

func zero(Assignment) float64 { return 0 }

func TestRandomWithinBounds(t *testing.T) {
	r, err := NewRandom(mixedSpace, 1)
	if err != nil {
		t.Fatal(err)
	}
	seenBatch := map[int64]bool{}
	seenOpt := map[Value]bool{}
	for _, tr := range replay(t, r, 2000, zero) {
		if err := mixedSpace.Contains(tr.Params); err != nil {
			t.Fatalf("draw %v outside the space: %v", tr.Params, err)
		}
		b, _ := tr.Params["batch"].Int64()
		seenBatch[b] = true
		seenOpt[tr.Params["opt"]] = true
	}
	// int_uniform is inclusive at both ends; every option is reachable.
	if len(seenBatch) != 4 || !seenBatch[1] || !seenBatch[4] {
		t.Fatalf("int_uniform [1, 4] drew %v, want all of 1..4", seenBatch)
	}
	if len(seenOpt) != 3 {
		t.Fatalf("choice drew %v, want all 3 options", seenOpt)
	}
}

func TestRandomLogUniformSpread(t *testing.T) {
	r, err := NewRandom(Space{LogUniform("lr", 1e-6, 1e-2)}, 42)
	if err != nil {
		t.Fatal(err)
	}
	const n = 4000
	logs := make([]float64, 0, n)
	below := 0
	for _, tr := range replay(t, r, n, zero) {
		f, _ := tr.Params["lr"].Float64()
		logs = append(logs, math.Log10(f))
		if f < 1e-4 {
			below++
		}
	}
	sort.Float64s(logs)
	// Uniform in log space: the median sits at the geometric mean (1e-4)
	// and each decade gets a quarter of the draws; a linear draw would put
	// ~99% of them in the top decade.
	if med := logs[n/2]; math.Abs(med-(-4)) > 0.15 {
		t.Fatalf("median log10(lr) = %.3f, want about -4", med)
	}
	if frac := float64(below) / n; math.Abs(frac-0.5) > 0.05 {
		t.Fatalf("%.3f of draws below the geometric mean, want about 0.5", frac)
	}
	for decade := -6; decade < -2; decade++ {
		lo := sort.SearchFloat64s(logs, float64(decade))
		hi := sort.SearchFloat64s(logs, float64(decade+1))
		if frac := float64(hi-lo) / n; math.Abs(frac-0.25) > 0.04 {
			t.Fatalf("decade 1e%d holds %.3f of the draws, want about 0.25", decade, frac)
		}
	}
}

func TestRandomDeterminism(t *testing.T) {
	a, _ := NewRandom(mixedSpace, 7)
	b, _ := NewRandom(mixedSpace, 7)
	c, _ := NewRandom(mixedSpace, 8)
	ha, hb, hc := replay(t, a, 50, zero), replay(t, b, 50, zero), replay(t, c, 50, zero)
	same := 0
	for i := range ha {
		if !ha[i].Params.Equal(hb[i].Params) {
			t.Fatalf("trial %d: same seed gave %v and %v", i, ha[i].Params, hb[i].Params)
		}
		if ha[i].Params.Equal(hc[i].Params) {
			same++
		}
	}
	if same > 0 {
		t.Fatalf("seeds 7 and 8 agree on %d of 50 trials (continuous params make any agreement suspicious)", same)
	}
	// A restarted controller sees only the history: the next draw must match.
	fresh, _ := NewRandom(mixedSpace, 7)
	for _, i := range []int{0, 1, 17, 49} {
		got, err := fresh.Next(ha[:i])
		if err != nil {
			t.Fatal(err)
		}
		if !got.Equal(ha[i].Params) {
			t.Fatalf("replayed trial %d = %v, want %v", i, got, ha[i].Params)
		}
	}
	// Trials within one sweep differ from each other.
	if ha[0].Params.Equal(ha[1].Params) {
		t.Fatal("consecutive trials drew the same assignment")
	}
}

func TestNewRandomInvalidSpace(t *testing.T) {
	if _, err := NewRandom(Space{LogUniform("lr", 0, 1)}, 1); err == nil {
		t.Fatal("NewRandom accepted loguniform with lo = 0")
	}
}
