package sweep

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

func testRecord(t *testing.T) (*sweepjob.Record, string) {
	t.Helper()
	batch := "batch"
	const stand = "@@gpujob-trial@@" // sweepjob's trial stand-in
	rec := &sweepjob.Record{Version: sweepjob.RecordVersion, Namespace: "default", Sweep: "lr", Metric: "acc", Algorithm: "random",
		MaxTrials: 2, Parallel: 1, Params: search.Space{search.Uniform("lr", 0, 1)}, Submitted: time.Unix(1700000000, 0),
		Template: &api.Job{Type: &batch, Meta: map[string]string{contract.MetaKind: contract.KindTrain, contract.MetaSweep: "lr", contract.MetaTrial: stand},
			TaskGroups: []*api.TaskGroup{{Tasks: []*api.Task{{Name: "train", Driver: render.Driver,
				Config: map[string]any{"sweep": "lr", "trial": stand}}}}}}}
	d, err := rec.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return rec, d
}

// What a trial's reporting budgets held back shows in its note and -json.
func TestStatusShowsWhatTheBudgetsHeldBack(t *testing.T) {
	rec, _ := testRecord(t)
	st := &controller.State{Namespace: "default", Sweep: "lr", Status: controller.StatusRunning, MaxTrials: 2,
		Trials: []controller.Trial{{ID: "trial-001", JobID: "lr-trial-001", State: controller.TrialRunning,
			Held: &sweepkv.Reporting{ResultsDeferred: 4, ByteBudgetWaits: 2}}}}
	s := newStatus(rec, st)
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
