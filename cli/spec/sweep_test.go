package spec_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/stopping"
)

// issueSweep is the example of the sweep spec's issue.
const issueSweep = `sweep "bert-lr" {
  train {
    workers         = 1
    gpus_per_worker = 1
    command         = "/usr/bin/python3"
    args            = ["/opt/gpujob/workloads/bert_finetune.py", "--lr", param.lr, "--layers", param.layers]
  }
  param "lr"     { loguniform = [1e-5, 1e-2] }
  param "layers" { choice = [2, 4] }
  objective {
    metric = "accuracy"
    mode   = "max"
    goal   = 0.97
  }
  search {
    algorithm = "random"
    seed      = 7
  }
  early_stop "asha" {
    grace_period     = 40
    reduction_factor = 3
  }
  max_trials        = 24
  parallel          = 4
  max_failed_trials = 3
}
`

func parseSweep(t *testing.T, src, filename string, o spec.Options) (*spec.Sweep, string) {
	t.Helper()
	s, files, diags := spec.LoadSweepSource([]byte(src), filename, o)
	if diags.HasErrors() {
		if s != nil {
			t.Errorf("a sweep spec with errors returned a Sweep")
		}
		checkFormat(t, diags, files)
		return nil, spec.Format(diags, files)
	}
	if s == nil {
		t.Fatalf("no errors and no Sweep: %v", diags)
	}
	return s, ""
}

func TestSweepIssueExample(t *testing.T) {
	s, errs := parseSweep(t, issueSweep, "sweep.hcl", spec.Options{})
	if errs != "" {
		t.Fatal(errs)
	}
	goal := 0.97
	want := struct {
		Name            string
		Params          search.Space
		Objective       spec.Objective
		Search          spec.Search
		EarlyStop       *spec.EarlyStop
		MaxTrials       int
		Parallel        int
		MaxFailedTrials int
	}{
		"bert-lr",
		search.Space{search.LogUniform("lr", 1e-5, 1e-2), search.Choice("layers", search.IntValue(2), search.IntValue(4))},
		spec.Objective{Metric: "accuracy", Mode: stopping.Max, Goal: &goal},
		spec.Search{Algorithm: "random", Seed: 7},
		&spec.EarlyStop{Rule: "asha", ASHA: &stopping.ASHA{GracePeriod: 40, ReductionFactor: 3}},
		24, 4, 3,
	}
	got := want
	got.Name, got.Params, got.Objective, got.Search, got.EarlyStop = s.Name, s.Params, s.Objective, s.Search, s.EarlyStop
	got.MaxTrials, got.Parallel, got.MaxFailedTrials = s.MaxTrials, s.Parallel, s.MaxFailedTrials
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sweep:\n got %+v\nwant %+v", got, want)
	}
	if s.Template.Name != "bert-lr" || s.Template.Workers != 1 || s.Template.Command != "/usr/bin/python3" {
		t.Errorf("template %+v", s.Template)
	}
	if got, want := s.References(), map[string][]string{"args[2]": {"lr"}, "args[4]": {"layers"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("references %v, want %v", got, want)
	}
	if rng := s.Ranges.Of("max_trials"); rng.Start.Line != 23 {
		t.Errorf("max_trials at %s", rng)
	}

	tr, err := s.Train(search.Assignment{"lr": search.FloatValue(1e-5), "layers": search.IntValue(4)})
	if err != nil {
		t.Fatal(err)
	}
	wantArgs := []string{"/opt/gpujob/workloads/bert_finetune.py", "--lr", "1e-05", "--layers", "4"}
	if !reflect.DeepEqual(tr.Args, wantArgs) {
		t.Errorf("trial args %q, want %q", tr.Args, wantArgs)
	}
	if strings.Contains(s.Template.Args[2], "1e-05") {
		t.Error("Train changed the template")
	}
	checkTrain(t, tr)
	if _, err := s.Train(search.Assignment{"lr": search.FloatValue(1e-5)}); err == nil {
		t.Error("an assignment without layers was accepted")
	}
	if _, err := s.Train(search.Assignment{"lr": search.FloatValue(1e-5), "layers": search.IntValue(3)}); err == nil {
		t.Error("an assignment outside the space was accepted")
	}
}

func TestSweepDefaultsAndTrain(t *testing.T) {
	src := `variable "script" {
  default = "t.py"
}
sweep "s" {
  train {
    command = "/usr/bin/${param.py}"
    args    = [var.script, "--opt=${param.opt}", format("--wd=%s", param.wd)]
    env     = { LR = param.lr, N = "${param.n}x" }
  }
  param "py"  { grid = ["python3", "python3.11"] }
  param "opt" { grid = ["adam", "sgd"] }
  param "wd"  { choice = [0.0, 1, 2.5, 1e2] }
  param "lr"  { uniform = [0, 1] }
  param "n"   { int_uniform = [1, 8] }
  objective {
    metric = "loss"
    mode   = "min"
  }
  early_stop "median" {}
  max_trials = 5
}
`
	s, errs := parseSweep(t, src, "sweep.hcl", spec.Options{Vars: []string{"script=u.py"}})
	if errs != "" {
		t.Fatal(errs)
	}
	wantWD := []search.Value{search.FloatValue(0), search.IntValue(1), search.FloatValue(2.5), search.FloatValue(100)}
	if !reflect.DeepEqual(s.Params[2].Values, wantWD) {
		t.Errorf("wd values %v, want %v", s.Params[2].Values, wantWD)
	}
	if s.Parallel != 1 || s.MaxFailedTrials != 3 || s.Search.Algorithm != "random" || s.Search.Seed != 0 || s.Objective.Mode != stopping.Min || s.Objective.Goal != nil {
		t.Errorf("defaults: %+v", s)
	}
	if m := s.EarlyStop.Median; m == nil || *m != (stopping.Median{MinTrials: 5, Interval: 1}) {
		t.Errorf("median defaults %+v", s.EarlyStop)
	}
	tr, err := s.Train(search.Assignment{
		"py": search.StringValue("python3.11"), "opt": search.StringValue("sgd"),
		"wd": search.FloatValue(2.5), "lr": search.FloatValue(0.25), "n": search.IntValue(8),
	})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Command != "/usr/bin/python3.11" || !reflect.DeepEqual(tr.Args, []string{"u.py", "--opt=sgd", "--wd=2.5"}) ||
		!reflect.DeepEqual(tr.Env, map[string]string{"LR": "0.25", "N": "8x"}) {
		t.Errorf("trial %q %q %v", tr.Command, tr.Args, tr.Env)
	}
	checkTrain(t, tr)
}

func TestSweepGridDefaultsMaxTrials(t *testing.T) {
	src := `sweep "g" {
  train {
    command = "/bin/echo"
    args    = [param.a, param.b]
  }
  param "a" { grid = [1, 2, 3] }
  param "b" { choice = ["x", "y"] }
  objective {
    metric = "m"
  }
  search {
    algorithm = "grid"
  }
}
`
	s, errs := parseSweep(t, src, "sweep.hcl", spec.Options{})
	if errs != "" {
		t.Fatal(errs)
	}
	if s.MaxTrials != 6 {
		t.Errorf("max_trials %d, want the grid's 6", s.MaxTrials)
	}
}

func TestSweepJSON(t *testing.T) {
	src := `{"sweep": {"j": {
  "train": {"command": "/bin/echo", "args": ["${param.lr}"], "resources": {"cpu": 100}},
  "param": {"lr": {"choice": [1, 2.0]}},
  "objective": {"metric": "m"},
  "max_trials": 2
}}}`
	s, errs := parseSweep(t, src, "sweep.json", spec.Options{})
	if errs != "" {
		t.Fatal(errs)
	}
	if want := []search.Value{search.IntValue(1), search.FloatValue(2)}; !reflect.DeepEqual(s.Params[0].Values, want) {
		t.Errorf("values %v, want %v", s.Params[0].Values, want)
	}
	bad := `{"sweep": {"j": {
  "train": {"command": "/bin/echo", "resources": {"cpu": "${param.lr}"}},
  "param": {"lr": {"choice": [1]}},
  "objective": {"metric": "m"},
  "max_trials": 2
}}}`
	if _, errs := parseSweep(t, bad, "sweep.json", spec.Options{}); !strings.Contains(errs, "param.lr can only be used in command, args and env") {
		t.Errorf("a param in resources.cpu (JSON):\n%s", errs)
	}
}

func TestSweepErrors(t *testing.T) {
	const tail = `  param "lr" { loguniform = [1e-5, 1e-2] }
  objective {
    metric = "acc"
  }
  max_trials = 4
}
`
	const train = "  train {\n    command = \"/bin/true\"\n  }\n"
	for _, c := range []struct {
		name, src string
		want      []string // each must appear in the formatted errors
	}{
		{"param in a number field",
			"sweep \"s\" {\n  train {\n    command = \"/bin/true\"\n    workers = param.lr\n  }\n" + tail,
			[]string{"sweep.hcl:4:15: error: Invalid param reference", "param.lr can only be used in command, args and env"}},
		{"param in a nested block",
			"sweep \"s\" {\n  train {\n    command = \"/bin/true\"\n    resources {\n      memory = param.lr\n    }\n  }\n" + tail,
			[]string{"sweep.hcl:5:16: error: Invalid param reference"}},
		{"param in workdir",
			"sweep \"s\" {\n  train {\n    command = \"/bin/true\"\n    workdir = \"/d/${param.lr}\"\n  }\n" + tail,
			[]string{"sweep.hcl:4:21: error: Invalid param reference"}},
		{"param outside train",
			"sweep \"s\" {\n" + train + "  parallel = param.lr\n" + tail,
			[]string{"sweep.hcl:5:14: error: Invalid param reference"}},
		{"param in env name",
			"sweep \"s\" {\n  train {\n    command = \"/bin/true\"\n    env = { (param.lr) = \"1\" }\n  }\n" + tail,
			[]string{"sweep.hcl:4:11: error: Invalid param reference", "not in names"}},
		{"mangled placeholder",
			"sweep \"s\" {\n  train {\n    command = \"/bin/true\"\n    args = [upper(param.lr)]\n  }\n" + tail,
			[]string{"sweep.hcl:4:12: error: Invalid param reference", "as is"}},
		{"undeclared param",
			"sweep \"s\" {\n  train {\n    command = \"/bin/true\"\n    args = [\"--x\", param.lx]\n  }\n" + tail,
			[]string{"sweep.hcl:4:20: error: Undeclared param", `no param "lx"`, `did you mean "lr"`}},
		{"grid with a continuous param",
			"sweep \"s\" {\n" + train + "  search {\n    algorithm = \"grid\"\n  }\n" + tail,
			[]string{"sweep.hcl:6:17: error: Invalid grid search", `param "lr" is loguniform`}},
		{"grid smaller than max_trials",
			"sweep \"s\" {\n" + train + "  param \"a\" { grid = [1, 2] }\n  objective {\n    metric = \"m\"\n  }\n  search {\n    algorithm = \"grid\"\n  }\n  max_trials = 3\n}\n",
			[]string{"sweep.hcl:12:16: error: Invalid max_trials", "only 2 combinations"}},
		{"invalid param bounds",
			"sweep \"s\" {\n" + train + "  param \"x\" { loguniform = [0, 1] }\n" + tail,
			[]string{"sweep.hcl:5:28: error: Invalid param x", "loguniform needs lo > 0"}},
		{"int_uniform with a float bound",
			"sweep \"s\" {\n" + train + "  param \"x\" { int_uniform = [1, 2.0] }\n" + tail,
			[]string{"sweep.hcl:5:29: error: Invalid param x", "whole numbers"}},
		{"duplicate choice",
			"sweep \"s\" {\n" + train + "  param \"x\" { choice = [1, 1] }\n" + tail,
			[]string{"sweep.hcl:5:24: error: Invalid param x", "both 1"}},
		{"two kinds",
			"sweep \"s\" {\n" + train + "  param \"x\" {\n    choice = [1]\n    grid = [2]\n  }\n" + tail,
			[]string{"sweep.hcl:7:5: error: Conflicting param kinds"}},
		{"no kind",
			"sweep \"s\" {\n" + train + "  param \"x\" {}\n" + tail,
			[]string{"sweep.hcl:5:3: error: Missing param kind"}},
		{"duplicate param",
			"sweep \"s\" {\n" + train + "  param \"lr\" { choice = [1] }\n" + tail,
			[]string{"sweep.hcl:6:3: error: Duplicate param", "sweep.hcl:5,3-13"}},
		{"bool choice",
			"sweep \"s\" {\n" + train + "  param \"x\" { choice = [true] }\n" + tail,
			[]string{"sweep.hcl:5:25: error: Invalid param value"}},
		{"no params",
			"sweep \"s\" {\n" + train + "  objective {\n    metric = \"m\"\n  }\n  max_trials = 1\n}\n",
			[]string{"sweep.hcl:1:1: error: Missing param block"}},
		{"no train",
			"sweep \"s\" {\n" + tail,
			[]string{"sweep.hcl:1:1: error: Missing train block"}},
		{"no objective",
			"sweep \"s\" {\n" + train + "  param \"x\" { choice = [1] }\n  max_trials = 1\n}\n",
			[]string{"sweep.hcl:1:1: error: Missing objective block"}},
		{"no metric",
			"sweep \"s\" {\n" + train + "  param \"x\" { choice = [1] }\n  objective {}\n  max_trials = 1\n}\n",
			[]string{"sweep.hcl:6:13: error: Missing required argument"}},
		{"bad mode",
			"sweep \"s\" {\n" + train + "  param \"x\" { choice = [1] }\n  objective {\n    metric = \"m\"\n    mode = \"up\"\n  }\n  max_trials = 1\n}\n",
			[]string{"sweep.hcl:8:12: error: Invalid objective.mode"}},
		{"no max_trials",
			"sweep \"s\" {\n" + train + "  param \"x\" { choice = [1] }\n  objective {\n    metric = \"m\"\n  }\n}\n",
			[]string{"sweep.hcl:1:1: error: Missing required argument", "max_trials"}},
		{"bad counts",
			"sweep \"s\" {\n" + train + "  param \"x\" { choice = [1] }\n  objective {\n    metric = \"m\"\n  }\n  max_trials = 0\n  parallel = 0\n  max_failed_trials = -1\n}\n",
			[]string{"sweep.hcl:9:16: error: Invalid max_trials", "sweep.hcl:10:14: error: Invalid parallel", "sweep.hcl:11:23: error: Invalid max_failed_trials"}},
		{"bad algorithm",
			"sweep \"s\" {\n" + train + "  search {\n    algorithm = \"bayes\"\n  }\n" + tail,
			[]string{"sweep.hcl:6:17: error: Invalid search.algorithm"}},
		{"bad early_stop rule",
			"sweep \"s\" {\n" + train + "  early_stop \"hyperband\" {}\n" + tail,
			[]string{"sweep.hcl:5:14: error: Invalid early_stop rule"}},
		{"bad reduction_factor",
			"sweep \"s\" {\n" + train + "  early_stop \"asha\" {\n    reduction_factor = 1\n  }\n" + tail,
			[]string{"sweep.hcl:6:24: error: Invalid early_stop", "reduction_factor must be at least 2"}},
		{"median field on asha",
			"sweep \"s\" {\n" + train + "  early_stop \"asha\" {\n    min_trials = 1\n  }\n" + tail,
			[]string{"sweep.hcl:6:5: error: Unsupported argument"}},
		{"bad sweep name",
			"sweep \"a b\" {\n" + train + tail,
			[]string{"sweep.hcl:1:7: error: Invalid job name", "sweep block's name"}},
		{"train field error is positioned",
			"sweep \"s\" {\n  train {\n    command = \"/bin/true\"\n    workers = 0\n  }\n" + tail,
			[]string{"sweep.hcl:4:15: error: Invalid workers"}},
		{"a train spec",
			"train \"t\" {\n  command = \"/bin/true\"\n}\n",
			[]string{"sweep.hcl:1:1: error: A train spec where a sweep spec is expected"}},
		{"train and sweep",
			"sweep \"s\" {\n" + train + tail + "train \"t\" {\n  command = \"/bin/true\"\n}\n",
			[]string{"sweep.hcl:11:1: error: Both train and sweep blocks"}},
		{"undeclared var",
			"sweep \"s\" {\n" + train + "  parallel = nomad.p\n" + tail,
			[]string{"sweep.hcl:5:14: error: Unknown variable", "param.<name>"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, errs := parseSweep(t, c.src, "sweep.hcl", spec.Options{})
			if s != nil {
				t.Fatalf("accepted:\n%s", c.src)
			}
			for _, w := range c.want {
				if !strings.Contains(errs, w) {
					t.Errorf("errors lack %q:\n%s", w, errs)
				}
			}
			if strings.Contains(errs, "\\x00") || strings.Contains(errs, "\x00") {
				t.Errorf("errors show a placeholder:\n%s", errs)
			}
		})
	}
}

// A sweep spec is not a train spec: the train loader says so.
func TestTrainLoaderRefusesSweep(t *testing.T) {
	_, errs := parse(t, issueSweep, spec.Options{})
	if !strings.Contains(errs, "spec.hcl:1:1: error: A sweep spec where a train spec is expected") {
		t.Errorf("errors:\n%s", errs)
	}
}

func TestSweepVariables(t *testing.T) {
	src := `variable "trials" {
  type = number
}
sweep "s" {
  train {
    command = "/bin/echo"
    args    = [param.x]
  }
  param "x" { choice = var.xs }
  objective {
    metric = "m"
  }
  max_trials = var.trials
}
variable "xs" {
  default = [1, "b"]
}
`
	s, errs := parseSweep(t, src, "sweep.hcl", spec.Options{Vars: []string{"trials=9"}})
	if errs != "" {
		t.Fatal(errs)
	}
	if s.MaxTrials != 9 || !reflect.DeepEqual(s.Params[0].Values, []search.Value{search.IntValue(1), search.StringValue("b")}) {
		t.Errorf("max_trials %d, values %v", s.MaxTrials, s.Params[0].Values)
	}
	_, errs = parseSweep(t, src, "sweep.hcl", spec.Options{Vars: []string{"trials=x"}})
	if !strings.Contains(errs, "<-var trials=x>:1:8: error: Invalid value for variable") {
		t.Errorf("errors:\n%s", errs)
	}
}

func TestSweepRefusesAParamLostInACondition(t *testing.T) {
	src := `sweep "s" {
  train {
    command = "/usr/bin/python3"
    args    = ["x.py", param.opt == "adam" ? "--use-adam" : "--use-sgd", "--lr=${param.lr}"]
  }
  param "opt" {
    grid = ["adam", "sgd"]
  }
  param "lr" {
    grid = [0.1]
  }
  objective {
    metric = "score"
  }
}
`
	_, diags := spec.ParseSweep([]byte(src), "s.hcl", spec.Options{})
	if !diags.HasErrors() {
		t.Fatal("a param used in a condition was accepted: every trial would run --use-sgd")
	}
	var found bool
	for _, d := range diags {
		if d.Summary == "Invalid param reference" && strings.Contains(d.Detail, "param.opt") && d.Subject != nil && d.Subject.Start.Line == 4 {
			found = true
		} else if strings.Contains(d.Detail, "param.lr") {
			t.Errorf("param.lr in a template was refused: %s", d.Detail)
		}
	}
	if !found {
		t.Errorf("no error at line 4 naming param.opt: %s", diags.Error())
	}
}

func TestSweepLimits(t *testing.T) {
	base := `sweep "%s" {
  train {
    command = "x"
    args    = [param.lr]
  }
  param "lr" {
    uniform = [0, 1]
  }
  objective {
    metric = "score"
  }
  max_trials = %d
}
`
	for _, tc := range []struct {
		name   string
		trials int
		want   string
	}{
		{"ok", 500, ""},
		{"ok", 501, "at most 500"},
		{strings.Repeat("a", 118), 4, "at most 117"},
		{strings.Repeat("a", 117), 4, ""},
	} {
		_, diags := spec.ParseSweep([]byte(fmt.Sprintf(base, tc.name, tc.trials)), "s.hcl", spec.Options{})
		switch {
		case tc.want == "" && diags.HasErrors():
			t.Errorf("%d-byte name, %d trials: %s", len(tc.name), tc.trials, diags.Error())
		case tc.want != "" && !strings.Contains(diags.Error(), tc.want):
			t.Errorf("%d-byte name, %d trials: want %q, got %v", len(tc.name), tc.trials, tc.want, diags.Error())
		}
	}
}
