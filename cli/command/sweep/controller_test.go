package sweep

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/sweepcreds"
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

// The controller runs its record's plan only when the record passes its
// checks; otherwise a plan that fails the sweep with the reason.
func TestControllerPlanRefusesRecordsItCannotVouchFor(t *testing.T) {
	rec, d := testRecord(t)
	for _, tc := range []struct {
		name   string
		digest string
		creds  *sweepcreds.Credentials
		change func(*sweepjob.Record)
		want   string // "" = runs
	}{
		{name: "without ACLs, its own record", digest: d},
		{name: "with ACLs, the record submit wrote", digest: d, creds: &sweepcreds.Credentials{RecordDigest: d}},
		{name: "with ACLs, a record changed since", digest: "0123456789abcdef", creds: &sweepcreds.Credentials{RecordDigest: d},
			want: "the record changed since gpujob sweep submit wrote it"},
		{name: "with ACLs, no digest to check against", digest: d, creds: &sweepcreds.Credentials{},
			want: "holds no digest of the sweep's record"},
		{name: "without ACLs, another sweep's template", digest: d,
			change: func(r *sweepjob.Record) { r.Template.Meta[contract.MetaSweep] = "other" }, want: `its job meta gpujob_sweep is "other"`},
	} {
		r := *rec
		tmpl := *rec.Template
		tmpl.Meta = map[string]string{}
		for k, v := range rec.Template.Meta {
			tmpl.Meta[k] = v
		}
		r.Template = &tmpl
		if tc.change != nil {
			tc.change(&r)
		}
		p, err := controllerPlan(&r, "default", "lr", tc.digest, tc.creds)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		switch {
		case tc.want == "" && p.Refused != "":
			t.Errorf("%s: refused: %s", tc.name, p.Refused)
		case tc.want != "" && !strings.Contains(p.Refused, tc.want):
			t.Errorf("%s: refusal %q, want %q", tc.name, p.Refused, tc.want)
		case tc.want != "" && !strings.Contains(p.Refused, "gpujob sweep stop --purge lr"):
			t.Errorf("%s: the refusal does not say what to do: %s", tc.name, p.Refused)
		case tc.want != "" && p.Validate() != nil:
			t.Errorf("%s: the refusing plan does not validate: %v", tc.name, p.Validate())
		}
	}
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
