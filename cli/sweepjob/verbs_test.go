package sweepjob_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/cli/sweepcreds"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/cli/sweepjob/fixture"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/safename"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// The controller runs its record's plan only when the record passes its
// checks; otherwise a plan that fails the sweep with the reason.
func TestControllerPlanRefusesRecordsItCannotVouchFor(t *testing.T) {
	rec, d := fixture.Record(t)
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
		p, err := sweepjob.ControllerPlan(&r, "default", "lr", tc.digest, tc.creds)
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

func TestParseMaxTrials(t *testing.T) {
	for _, tc := range []struct {
		in      string
		cur     int
		want    int
		wantErr bool
	}{{"+4", 10, 14, false}, {"12", 10, 12, false}, {"+0", 3, 3, false}, {"-1", 3, 0, true}, {"x", 3, 0, true}, {"", 3, 0, true}} {
		m, err := sweepjob.ParseMaxTrials(tc.in)
		if (err != nil) != tc.wantErr || err == nil && m.Of(tc.cur) != tc.want {
			t.Errorf("ParseMaxTrials(%q).Of(%d) = %d, %v", tc.in, tc.cur, m.Of(tc.cur), err)
		}
	}
}

// Extend raises max_trials within the bounds and reopens an ended sweep.
func TestExtend(t *testing.T) {
	ended := func() *controller.State {
		return &controller.State{MaxTrials: 2, Status: controller.StatusCompleted, Reason: "max_trials reached",
			Ended: time.Unix(1700000000, 0), StopRequested: true,
			Trials: []controller.Trial{{ID: controller.TrialID(0)}, {ID: controller.TrialID(1)}}}
	}
	st := ended()
	if err := sweepjob.Extend(st, "lr", sweepjob.MaxTrials{N: 2, Add: true}); err != nil {
		t.Fatal(err)
	}
	if st.MaxTrials != 4 || st.Status != controller.StatusRunning || st.Reason != "" || !st.Ended.IsZero() || st.StopRequested {
		t.Errorf("after +2: %+v", st)
	}
	for _, tc := range []struct {
		m    sweepjob.MaxTrials
		want string
	}{
		{sweepjob.MaxTrials{N: 1}, "sweep lr already has 2 trials; --max-trials must be at least that"},
		{sweepjob.MaxTrials{N: spec.MaxTrials + 1}, "a sweep holds at most"},
	} {
		st := ended()
		if err := sweepjob.Extend(st, "lr", tc.m); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.m, err, tc.want)
		}
		if st.Status != controller.StatusCompleted || st.MaxTrials != 2 {
			t.Errorf("%+v: a refused extend changed the state: %+v", tc.m, st)
		}
	}
}

func TestCurves(t *testing.T) {
	rec, _ := fixture.Record(t)
	rec.Metric = "score"
	v := func(f float64) *float64 { return &f }
	st := &controller.State{Trials: []controller.Trial{
		{ID: controller.TrialID(0), State: controller.TrialCompleted, Value: v(0.5)},
		{ID: controller.TrialID(1), State: controller.TrialStopped, Value: v(0.1), Reason: "stopped by ASHA at step 10: below the rung"},
		{ID: controller.TrialID(2), State: controller.TrialCompleted, Value: v(0.9)},
	}}
	metrics := map[string][]byte{}
	for i, steps := range []int{4, 2, 0} {
		m := sweepkv.Metrics{}
		for s := 1; s <= steps; s++ {
			m.Points = append(m.Points, sweepkv.Point{Step: 10 * s, Values: map[string]float64{"score": float64(i*s) / 10, "loss": 1}})
		}
		if steps > 0 {
			metrics[safename.Encode(controller.TrialID(i))], _ = json.Marshal(m)
		}
	}
	curves, err := sweepjob.Curves(rec, st, metrics)
	if err != nil {
		t.Fatal(err)
	}
	if len(curves) != 3 || len(curves[0].Points) != 4 || len(curves[1].Points) != 2 || len(curves[2].Points) != 0 ||
		!curves[2].Best || curves[0].Best || curves[1].StopNote != "ASHA at step 10" || curves[1].State != "stopped" {
		t.Fatalf("curves: %+v", curves)
	}
	metrics[safename.Encode(controller.TrialID(0))] = []byte("{")
	if _, err := sweepjob.Curves(rec, st, metrics); err == nil || !strings.Contains(err.Error(), "reading the metrics of "+controller.TrialID(0)) {
		t.Errorf("a broken metrics record: %v", err)
	}
}
