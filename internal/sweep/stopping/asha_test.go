package stopping

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

func TestASHARungs(t *testing.T) {
	classic := ASHA{GracePeriod: 1, ReductionFactor: 3}
	if got, want := classic.Rungs(100), []int{1, 3, 9, 27, 81}; !slices.Equal(got, want) {
		t.Errorf("Rungs(100) = %v, want %v", got, want)
	}
	if got, want := (ASHA{MaxStep: 30}).Rungs(1000), []int{1, 3, 9, 27}; !slices.Equal(got, want) {
		t.Errorf("defaults with MaxStep 30: Rungs = %v, want %v", got, want)
	}
	// Ray's float rung count drops 1000 here; integers do not.
	if got, want := (ASHA{GracePeriod: 1, ReductionFactor: 10, MaxStep: 1000}).Rungs(1<<20), []int{1, 10, 100, 1000}; !slices.Equal(got, want) {
		t.Errorf("eta 10: Rungs = %v, want %v", got, want)
	}
	issue := ASHA{GracePeriod: 40, ReductionFactor: 3}
	for _, tt := range []struct {
		a    ASHA
		step int
		rung int
		ok   bool
	}{
		{classic, 0, 0, false},
		{classic, 1, 1, true},
		{classic, 2, 1, true},
		{classic, 8, 3, true},
		{classic, 9, 9, true},
		{classic, math.MaxInt, 4052555153018976267, true},
		{issue, 39, 0, false},
		{issue, 119, 40, true},
		{issue, 120, 120, true},
		{ASHA{GracePeriod: 40, MaxStep: 100}, 500, 40, true},
	} {
		rung, ok := tt.a.rungAt(tt.step)
		if rung != tt.rung || ok != tt.ok {
			t.Errorf("%+v.rungAt(%d) = %d, %v; want %d, %v", tt.a, tt.step, rung, ok, tt.rung, tt.ok)
		}
	}
}

func TestASHAValidate(t *testing.T) {
	for _, a := range []ASHA{{}, {GracePeriod: 40, ReductionFactor: 3, MaxStep: 400}, {ReductionFactor: 2}} {
		if err := a.Validate(); err != nil {
			t.Errorf("%+v: %v", a, err)
		}
	}
	for _, a := range []ASHA{{GracePeriod: -1}, {ReductionFactor: 1}, {ReductionFactor: -2}, {MaxStep: -1}, {GracePeriod: 10, MaxStep: 5}} {
		if err := a.Validate(); err == nil {
			t.Errorf("%+v: no error", a)
		}
	}
}

// TestASHAClassic sends nine trials to the first rung (eta 3, grace 1) one
// after another and checks each against the (2/3) quantile of the values
// recorded before it.
func TestASHAClassic(t *testing.T) {
	a := ASHA{GracePeriod: 1, ReductionFactor: 3}
	tests := []struct {
		value float64
		stop  bool
		cut   float64 // when stopped
	}{
		{0.5, false, 0},      // first at the rung: nothing to compare with
		{0.4, true, 0.5},     // one value recorded: the cut is that value
		{0.6, false, 0},      // cut of [0.4 0.5] is 0.4667
		{0.3, true, 0.5333},  // cut of [0.4 0.5 0.6]
		{0.7, false, 0},      // cut of [0.3 0.4 0.5 0.6] is 0.5
		{0.55, true, 0.5667}, // cut of [0.3 0.4 0.5 0.6 0.7]
		{0.2, true, 0.5667},  // cut of [0.3 0.4 0.5 0.55 0.6 0.7]
		{0.9, false, 0},      // best so far
		{0.65, false, 0},     // cut of eight values is 0.5833
	}
	r := newRec(Max)
	for i, tt := range tests {
		id := "t" + strconv.Itoa(i+1)
		r.report(id, 1, tt.value)
		d := a.Decide(id, r.h)
		if d.Stop != tt.stop {
			t.Fatalf("%s (%v): Stop = %v, want %v (%+v)", id, tt.value, d.Stop, tt.stop, d)
		}
		if d.Stop && (math.Abs(d.Cut-tt.cut) > 1e-4 || d.Rung != 1 || d.Step != 1 || d.Value != tt.value) {
			t.Errorf("%s: decision %+v, want cut %v at rung 1", id, d, tt.cut)
		}
	}
}

func TestASHARules(t *testing.T) {
	classic := ASHA{GracePeriod: 1, ReductionFactor: 3}
	type ev struct {
		id    string
		step  int
		value float64
	}
	tests := []struct {
		name       string
		a          ASHA
		mode       Mode
		events     []ev
		decide     string
		wantStop   bool
		wantReason string
	}{
		{
			name:   "issue example",
			a:      ASHA{GracePeriod: 40, ReductionFactor: 3},
			mode:   Max,
			events: []ev{{"a", 40, 0.5}, {"b", 40, 0.5}, {"a", 120, 0.78}, {"b", 120, 0.71}},
			decide: "b", wantStop: true,
			wantReason: "stopped by ASHA at step 120: 0.71 < rung cut 0.78",
		},
		{
			name:   "min mode compares the other way",
			a:      classic,
			mode:   Min,
			events: []ev{{"a", 1, 0.5}, {"b", 1, 0.6}},
			decide: "b", wantStop: true,
			wantReason: "stopped by ASHA at step 1: 0.6 > rung cut 0.5",
		},
		{
			name:   "min mode: lower loss continues",
			a:      classic,
			mode:   Min,
			events: []ev{{"a", 1, 0.5}, {"b", 1, 0.4}},
			decide: "b",
		},
		{
			name:   "equal to the cut continues",
			a:      classic,
			mode:   Max,
			events: []ev{{"a", 1, 0.5}, {"b", 1, 0.5}},
			decide: "b",
		},
		{
			name:   "judged only on reaching a rung, not between rungs",
			a:      classic,
			mode:   Max,
			events: []ev{{"a", 1, 0.5}, {"a", 2, 0.9}, {"b", 1, 0.6}, {"b", 2, 0.1}},
			decide: "b",
		},
		{
			name:   "a jump past rungs is judged at the highest",
			a:      classic,
			mode:   Max,
			events: []ev{{"a", 9, 0.8}, {"b", 10, 0.7}},
			decide: "b", wantStop: true,
			wantReason: "stopped by ASHA at step 10 (rung 9): 0.7 < rung cut 0.8",
		},
		{
			name:   "a stop is sticky: later points do not undo it",
			a:      classic,
			mode:   Max,
			events: []ev{{"a", 1, 0.8}, {"b", 1, 0.7}, {"b", 2, 0.99}},
			decide: "b", wantStop: true,
			wantReason: "stopped by ASHA at step 1: 0.7 < rung cut 0.8",
		},
		{
			name:   "later arrivals at a rung do not change an earlier decision",
			a:      classic,
			mode:   Max,
			events: []ev{{"a", 1, 0.1}, {"b", 1, 0.2}, {"c", 1, 0.9}, {"d", 1, 0.95}},
			decide: "b",
		},
		{
			name:   "trials ranked only at their own rung",
			a:      classic,
			mode:   Max,
			events: []ev{{"a", 1, 0.9}, {"a", 3, 0.95}, {"b", 1, 0.9}, {"b", 3, 0.2}, {"c", 3, 0.3}},
			decide: "c", wantStop: true,
			wantReason: "stopped by ASHA at step 3: 0.3 < rung cut 0.7",
		},
		{
			name:   "NaN at a rung continues",
			a:      classic,
			mode:   Max,
			events: []ev{{"a", 1, 0.9}, {"b", 1, math.NaN()}},
			decide: "b",
		},
		{
			name:   "NaN recorded values are ignored by the cut",
			a:      classic,
			mode:   Max,
			events: []ev{{"a", 1, math.NaN()}, {"b", 1, 0.5}, {"c", 1, 0.4}},
			decide: "c", wantStop: true,
			wantReason: "stopped by ASHA at step 1: 0.4 < rung cut 0.5",
		},
		{
			name:   "before the grace period nothing is judged",
			a:      ASHA{GracePeriod: 5},
			mode:   Max,
			events: []ev{{"a", 4, 0.9}, {"b", 4, 0.1}},
			decide: "b",
		},
		{
			name:   "unknown trial",
			a:      classic,
			mode:   Max,
			events: []ev{{"a", 1, 0.9}},
			decide: "zz",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRec(tt.mode)
			for _, e := range tt.events {
				r.report(e.id, e.step, e.value)
			}
			d := tt.a.Decide(tt.decide, r.h)
			if d.Stop != tt.wantStop || d.Reason != tt.wantReason {
				t.Errorf("Decide = %+v, want Stop %v, Reason %q", d, tt.wantStop, tt.wantReason)
			}
		})
	}
}

func TestASHAOnlyStopsRunningTrials(t *testing.T) {
	a := ASHA{}
	r := newRec(Max)
	r.report("a", 1, 0.9)
	r.report("b", 1, 0.1)
	r.end("a", Failed) // a failed trial's rung record still counts, as in Ray
	if d := a.Decide("b", r.h); !d.Stop {
		t.Fatalf("running b not stopped: %+v", d)
	}
	for _, s := range []State{Completed, Stopped, Failed} {
		r.find("b").State = s
		if d := a.Decide("b", r.h); d.Stop {
			t.Errorf("%v trial stopped: %+v", s, d)
		}
	}
}

// TestASHADeterministicReplay checks that decisions depend only on the
// recorded points: deciding live after each point, deciding afterwards on the
// full history, and deciding on the full history with the trials listed in
// another order all agree.
func TestASHADeterministicReplay(t *testing.T) {
	a := ASHA{GracePeriod: 1, ReductionFactor: 3}
	rng := rand.New(rand.NewPCG(7, 9))
	for _, mode := range []Mode{Max, Min} {
		r := newRec(mode)
		live := map[string]Decision{}
		quality := map[string]float64{}
		var running []string
		next := 0
		for step := 1; step <= 30; step++ {
			for len(running) < 4 && next < 12 {
				id := "t" + strconv.Itoa(next)
				quality[id] = rng.Float64()
				running = append(running, id)
				next++
			}
			rng.Shuffle(len(running), func(i, j int) { running[i], running[j] = running[j], running[i] })
			var still []string
			for _, id := range running {
				v := quality[id] * (1 - math.Exp(-float64(step)/5))
				if mode == Min {
					v = 1 - v
				}
				r.report(id, step, v)
				if d := a.Decide(id, r.h); d.Stop {
					live[id] = d
					r.end(id, Stopped)
					r.find(id).State = Running // keep judging it in the replays below
					continue
				}
				still = append(still, id)
			}
			running = still
		}
		if len(live) == 0 {
			t.Fatalf("%s: nothing stopped; the test proves nothing", mode)
		}
		shuffled := History{Mode: mode, Trials: slices.Clone(r.h.Trials)}
		rng.Shuffle(len(shuffled.Trials), func(i, j int) {
			shuffled.Trials[i], shuffled.Trials[j] = shuffled.Trials[j], shuffled.Trials[i]
		})
		for _, tr := range r.h.Trials {
			for _, h := range []History{r.h, shuffled} {
				if got := a.Decide(tr.ID, h); got != live[tr.ID] {
					t.Errorf("%s %s: replay decided %+v, live %+v", mode, tr.ID, got, live[tr.ID])
				}
			}
		}
	}
}
