package sweep

import (
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/sweepjob/fixture"
	"github.com/gpujob/gpujob/cli/sweepops"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// What a trial's reporting budgets held back shows in its note and -json.
func TestStatusShowsWhatTheBudgetsHeldBack(t *testing.T) {
	rec, _ := fixture.Record(t)
	st := &controller.State{Namespace: "default", Sweep: "lr", Status: controller.StatusRunning, MaxTrials: 2,
		Trials: []controller.Trial{{ID: "trial-001", JobID: "lr-trial-001", State: controller.TrialRunning,
			Held: &sweepkv.Reporting{ResultsDeferred: 4, ByteBudgetWaits: 2}}}}
	s := sweepops.NewStatus(rec, st)
	var b strings.Builder
	if err := printStatus(&b, s); err != nil {
		t.Fatal(err)
	}
	if want := "metrics reporting throttled: 4 result write(s) deferred, 2 write(s) delayed by the byte budget"; !strings.Contains(b.String(), want) {
		t.Errorf("the status table lacks %q:\n%s", want, b.String())
	}
	if s.Trials[0].Held == nil || s.Trials[0].Held.ResultsDeferred != 4 {
		t.Errorf("-json's trial lacks what was held back: %+v", s.Trials[0])
	}
}
