package sweepjob

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/search"
)

func trialTemplate(sweep string) *api.Job {
	batch := "batch"
	return &api.Job{Type: &batch,
		Meta: map[string]string{contract.MetaKind: contract.KindTrain, contract.MetaSweep: sweep, contract.MetaTrial: trialToken},
		TaskGroups: []*api.TaskGroup{{Tasks: []*api.Task{{Name: "train", Driver: render.Driver,
			Config: map[string]any{"command": "/usr/bin/python3", "sweep": sweep, "trial": trialToken}}}}}}
}

func record(sweep string) *Record {
	return &Record{Version: RecordVersion, Namespace: "team-b", Sweep: sweep, Metric: "acc", Algorithm: "random", MaxTrials: 2,
		Parallel: 1, Params: search.Space{search.Uniform("lr", 0, 1)}, Template: trialTemplate(sweep),
		Submitted: time.Unix(1700000000, 0)}
}

// The controller runs only a record of its own sweep and namespace whose
// trial template is that sweep's: what gpujob sweep submit writes passes;
// a template of another sweep, another namespace, another kind of job,
// without the trial's mark, or reporting elsewhere is refused, saying why;
// with a digest from the controller's variable, any change is refused.
func TestVerifyRecord(t *testing.T) {
	ok := record("lr")
	d, err := ok.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if err := ok.Verify("team-b", "lr", d, d); err != nil {
		t.Fatalf("the record submit writes: %v", err)
	}
	if err := ok.Verify("team-b", "lr", d, ""); err != nil {
		t.Fatalf("without ACLs (no digest to compare): %v", err)
	}
	other := "team-a"
	svc := "service"
	for _, tc := range []struct {
		name   string
		change func(r *Record)
		want   string
	}{
		{"another namespace's record", func(r *Record) { r.Namespace = "team-a" }, `the record is sweep "lr"'s of namespace "team-a", not "lr"'s of "team-b"`},
		{"another sweep's record", func(r *Record) { r.Sweep = "x" }, `the record is sweep "x"'s`},
		{"no template", func(r *Record) { r.Template = nil }, "the record has no trial template"},
		{"another sweep's template", func(r *Record) { r.Template = trialTemplate("x") },
			`the trial template is not sweep lr's: its job meta gpujob_sweep is "x", want "lr"`},
		{"a template without the mark", func(r *Record) { delete(r.Template.Meta, contract.MetaSweep) }, `its job meta gpujob_sweep is ""`},
		{"a plain job for a template", func(r *Record) { r.Template.Meta = map[string]string{"owner": "mallory"} }, "its job meta gpujob is"},
		{"a template of another namespace", func(r *Record) { r.Template.Namespace = &other }, `the trial template is for namespace "team-a"`},
		{"a service for a template", func(r *Record) { r.Template.Type = &svc }, "the trial template is a service job"},
		{"a task reporting elsewhere", func(r *Record) { r.Template.TaskGroups[0].Tasks[0].Config["sweep"] = "x" },
			"the trial template's task train reports to sweep x"},
		{"no task reporting", func(r *Record) {
			delete(r.Template.TaskGroups[0].Tasks[0].Config, "sweep")
			delete(r.Template.TaskGroups[0].Tasks[0].Config, "trial")
		}, "no task of the trial template reports to sweep lr"},
	} {
		r := record("lr")
		tc.change(r)
		got, err := r.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Verify("team-b", "lr", got, ""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}

	// A change that keeps every mark is caught by the digest alone.
	r := record("lr")
	r.Template.TaskGroups[0].Tasks[0].Config["command"] = "/tmp/evil"
	got, _ := r.Digest()
	if err := r.Verify("team-b", "lr", got, d); err == nil || !strings.Contains(err.Error(), "the record changed since gpujob sweep submit wrote it") {
		t.Errorf("a rewritten command with the digest: %v", err)
	}
	if p, err := record("lr").Plan(); err != nil || p.Space == nil {
		t.Errorf("the plan carries no search space to check the trials with: %v", err)
	}
}
