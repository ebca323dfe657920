package sweepjob

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/hashicorp/nomad/api"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
)

const sweepSrc = `sweep "toy" {
  train {
    workers = 2
    command = "/usr/bin/python3"
    args    = ["/w/toy.py", "--lr", param.lr, "--tag=${param.tag}-x"]
    env = {
      WIDTH = param.width
    }
  }
  param "lr" {
    loguniform = [1e-4, 1]
  }
  param "width" {
    int_uniform = [4, 64]
  }
  param "tag" {
    choice = ["a", "b c"]
  }
  objective {
    metric = "score"
  }
  max_trials = 4
}
`

// parse stands in for the agent's HCL2 parser (whose own package needs
// Nomad's fork of HCL): it reads the few parts of a rendered job the tests
// compare — job ID, meta, and the first task's config command, args, env,
// sweep and trial — as the agent would put them in an api.Job. The real
// agent parses the template in the e2e tests.
func parse(t *testing.T, src []byte) *api.Job {
	t.Helper()
	f, diags := hclwrite.ParseConfig(src, "t.nomad.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("%s\n%s", diags.Error(), src)
	}
	jb := f.Body().Blocks()[0]
	id := jb.Labels()[0]
	job := &api.Job{ID: &id, Name: &id, Meta: map[string]string{}}
	eval := func(a *hclwrite.Attribute) cty.Value {
		expr, d := hclsyntax.ParseExpression(a.Expr().BuildTokens(nil).Bytes(), "x", hcl.InitialPos)
		if d.HasErrors() {
			t.Fatal(d.Error())
		}
		v, d := expr.Value(nil)
		if d.HasErrors() {
			t.Fatal(d.Error())
		}
		return v
	}
	for k, v := range eval(jb.Body().GetAttribute("meta")).AsValueMap() {
		job.Meta[k] = v.AsString()
	}
	task := jb.Body().Blocks()[0].Body().FirstMatchingBlock("task", []string{"train"})
	config := map[string]any{}
	for name, a := range task.Body().FirstMatchingBlock("config", nil).Body().Attributes() {
		config[name] = toGo(eval(a))
	}
	job.TaskGroups = []*api.TaskGroup{{Tasks: []*api.Task{{Name: "train", Config: config}}}}
	return job
}

func toGo(v cty.Value) any {
	switch {
	case v.Type() == cty.String:
		return v.AsString()
	case v.Type() == cty.Number:
		f, _ := v.AsBigFloat().Float64()
		return f
	case v.Type().IsTupleType() || v.Type().IsListType():
		var out []any
		for _, e := range v.AsValueSlice() {
			out = append(out, toGo(e))
		}
		return out
	case v.Type().IsObjectType() || v.Type().IsMapType():
		out := map[string]any{}
		for k, e := range v.AsValueMap() {
			out[k] = toGo(e)
		}
		return out
	}
	return v.GoString()
}

func TestTrialJobEqualsTheTrialRenderedDirectly(t *testing.T) {
	sw, diags := spec.ParseSweep([]byte(sweepSrc), "toy.hcl", spec.Options{})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	tmplHCL, err := TemplateHCL(sw, render.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := parse(t, tmplHCL)
	for i, a := range []search.Assignment{
		{"lr": search.FloatValue(0.003), "width": search.IntValue(17), "tag": search.StringValue("b c")},
		{"lr": search.FloatValue(1), "width": search.IntValue(4), "tag": search.StringValue("a")},
	} {
		trial := controller.Trial{ID: controller.TrialID(i), JobID: controller.TrialJobID(sw.Name, i), Params: a}
		got, err := TrialJob(tmpl, trial, "1764662400")
		if err != nil {
			t.Fatal(err)
		}
		direct, err := TrialHCL(sw, render.Options{}, i, a)
		if err != nil {
			t.Fatal(err)
		}
		want := parse(t, direct)
		gt, wt := got.TaskGroups[0].Tasks[0], want.TaskGroups[0].Tasks[0]
		if *got.ID != *want.ID || *got.Name != *want.ID {
			t.Errorf("job ID %s / name %s, want %s", *got.ID, *got.Name, *want.ID)
		}
		for _, k := range []string{"args", "env", "sweep", "trial", "command"} {
			if g, w := fmtAny(gt.Config[k]), fmtAny(wt.Config[k]); g != w {
				t.Errorf("trial %d config %s = %s, want %s", i, k, g, w)
			}
		}
		if got.Meta[contract.MetaTrial] != trial.ID || got.Meta[contract.MetaSweep] != "toy" || got.Meta[contract.MetaRun] != "1764662400" {
			t.Errorf("meta %v", got.Meta)
		}
	}
}

func fmtAny(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestTemplateRefusesTheReservedMarker(t *testing.T) {
	src := strings.Replace(sweepSrc, `"/w/toy.py"`, `"@@gpujob-param:lr@@"`, 1)
	sw, diags := spec.ParseSweep([]byte(src), "toy.hcl", spec.Options{})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	if _, err := TemplateHCL(sw, render.Options{}); err == nil || !strings.Contains(err.Error(), "reserves") {
		t.Fatalf("want the reserved-marker error, got %v", err)
	}
}

func TestTrialJobRefusesAStaleTemplate(t *testing.T) {
	sw, _ := spec.ParseSweep([]byte(sweepSrc), "toy.hcl", spec.Options{})
	tmplHCL, err := TemplateHCL(sw, render.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// A trial without the tag param (the spec changed): its stand-in stays.
	_, err = TrialJob(parse(t, tmplHCL), controller.Trial{ID: "trial-001", JobID: "toy-trial-001",
		Params: search.Assignment{"lr": search.FloatValue(0.1), "width": search.IntValue(8)}}, "1")
	if err == nil || !strings.Contains(err.Error(), "stand-in") {
		t.Fatalf("want a stand-in error, got %v", err)
	}
}
